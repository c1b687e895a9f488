//! `trident prepare`: text or JSON-lines files into a Megatron .bin/.idx token dataset
//! (`data::prepare`), with a progress line on stderr and the summary on stdout.

use super::flags;
use crate::data::prepare::{self, PrepareArgs, TextDocuments};
use crate::data::tokenizer_files;
use crate::error::{Error, Result};
use crate::flags::PREPARE_FLAGS;

/// `trident prepare [flags]`.
pub fn run(rest: &[String]) -> Result<()> {
    let Some(a) = flags("prepare", "tokenize text into a Megatron .bin/.idx dataset", PREPARE_FLAGS, rest)? else {
        return Ok(());
    };
    let inputs = a.list("--input").ok_or_else(|| Error::Usage("prepare needs --input FILE...".into()))?;
    let output_prefix =
        a.str("--output-prefix").ok_or_else(|| Error::Usage("prepare needs --output-prefix P".into()))?;
    let tokenizer = tokenizer_files::from_args(&a)?;
    if let crate::data::tokenizer::Tokenizer::Null { .. } = tokenizer {
        return Err(Error::Usage(
            "NullTokenizer has no text to tokenize: train with it on --mock-data (as Megatron's scripts do)".into(),
        ));
    }
    let workers = match a.usize("--workers")? {
        Some(0) => return Err(Error::flag("--workers", 0, "a positive number of threads")),
        Some(w) => w,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let text_documents = match a.str("--text-documents").unwrap_or("paragraph") {
        "paragraph" => TextDocuments::Paragraph,
        "line" => TextDocuments::Line,
        "file" => TextDocuments::File,
        other => return Err(Error::flag("--text-documents", format!("'{other}'"), "paragraph, line or file")),
    };
    let args = PrepareArgs {
        inputs: inputs.iter().map(Into::into).collect(),
        output_prefix: output_prefix.to_string(),
        json_keys: a.list("--json-keys").map(|k| k.to_vec()).unwrap_or_else(|| vec!["text".to_string()]),
        append_eod: a.has("--append-eod"),
        text_documents,
        force_json: None,
        tokenizer: std::sync::Arc::new(tokenizer),
        workers,
    };
    let mut shown = false;
    let summary = prepare::prepare(&args, &mut |p| {
        eprint!("\r prepare: {p} | {:.1} s", p.seconds);
        shown = true;
    })?;
    if shown {
        eprintln!();
    }
    println!("{summary}");
    Ok(())
}

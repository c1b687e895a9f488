//! `trident generate`: the flags of sampling from a checkpoint, turned into `generate::run`'s
//! arguments (the sampling itself is the library's `generate`).

use super::{flags, threads};
use crate::error::{Error, Result};
use crate::flags::GENERATE_FLAGS;
use crate::generate::GenerateArgs;

/// The tokenizer flags given, else those saved beside the checkpoints in `load`, else bytes.
fn tokenizer(a: &crate::cli::Args, load: &std::path::Path) -> Result<crate::data::tokenizer::Tokenizer> {
    let given = crate::flags::TOKENIZER_FLAGS.iter().any(|f| a.has(f.name));
    match crate::checkpoint::tokenizer::saved_flags(load)? {
        Some(saved) if !given => crate::checkpoint::tokenizer::load(&saved),
        _ => crate::data::tokenizer_files::from_args(a),
    }
}

/// `trident generate [flags]`.
pub fn run(rest: &[String]) -> Result<()> {
    let Some(a) = flags("generate", "sample a continuation from a checkpoint", GENERATE_FLAGS, rest)? else {
        return Ok(());
    };
    let load = a.path("--load").ok_or_else(|| Error::Usage("generate needs --load DIR".into()))?;
    let temperature = a.f64("--temperature")?.unwrap_or(1.0);
    if temperature < 0.0 {
        return Err(Error::flag("--temperature", temperature, "a number >= 0"));
    }
    let tokenizer = tokenizer(&a, &load)?;
    crate::generate::run(&GenerateArgs {
        load,
        prompt: a.str("--prompt").unwrap_or("").to_string(),
        max_new_tokens: a.usize("--max-new-tokens")?.unwrap_or(256),
        temperature,
        top_k: a.usize("--top-k")?.unwrap_or(40),
        seed: a.u64("--seed")?.unwrap_or(1234),
        cpu_threads: threads(&a)?,
        kv_cache: !a.has("--no-kv-cache"),
        tokenizer,
    })
}

//! Where a run's tokens come from: Megatron's data flags (`--data-path` with `--split`, the
//! per-split paths, `--mock-data`) as one `DataSource`.

use crate::cli::Args;
use crate::data::blend::Blend;
use crate::data::datasets::DataSource;
use crate::data::gpt_dataset::parse_split;
use crate::data::tokenizer::Tokenizer;
use crate::error::{Error, Result};

/// The run's data flags as Megatron reads them: `--data-path` (or `--data-args-path`, a file of
/// the same list) split by `--split`; or `--train-data-path` / `--valid-data-path` /
/// `--test-data-path` (or `--per-split-data-args-path`, a JSON object of them), unsplit; or
/// `--mock-data`. Megatron lets one silently win; here mixing them is one error. What the run
/// takes in Megatron's way but does not use goes to `notes`, for the start-up lines.
pub(super) fn data_source(
    args: &Args,
    tokenizer: &Tokenizer,
    vocab_size: usize,
    notes: &mut Vec<String>,
) -> Result<DataSource> {
    let from_file = |flag: &str| -> Result<Option<Vec<String>>> {
        let Some(path) = args.path(flag) else { return Ok(None) };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, "read", e))?;
        Ok(Some(text.split_whitespace().map(String::from).collect()))
    };
    let whole = match (args.list("--data-path"), from_file("--data-args-path")?) {
        (Some(_), Some(_)) => {
            return Err(Error::Usage("--data-path and --data-args-path are alternatives; give one".into()))
        }
        (Some(list), None) => Some(("--data-path", list.to_vec())),
        (None, Some(list)) => Some(("--data-args-path", list)),
        (None, None) => None,
    };
    let per_split = per_split_lists(args)?;
    let kinds = [whole.is_some(), per_split.iter().any(Option::is_some), args.has("--mock-data")];
    if kinds.iter().filter(|&&k| k).count() > 1 {
        return Err(Error::Usage(
            "give one source of data: --data-path (with --split), the per-split paths (--train-data-path, \
             --valid-data-path, --test-data-path) or --mock-data"
                .into(),
        ));
    }
    if let (Some(split), true) = (args.str("--split"), kinds[2]) {
        parse_split(split)?;
        notes.push(format!(
            "--split {split}: not used, as in Megatron: its mock data always splits 1,1,1 (train, valid, test)"
        ));
    } else if args.has("--split") && !kinds[0] {
        return Err(Error::Usage(
            "--split divides --data-path; the per-split paths are used whole (as in Megatron, which refuses both)"
                .into(),
        ));
    }
    if let Some((flag, list)) = whole {
        let split = parse_split(args.str("--split").unwrap_or("969,30,1"))?;
        return Ok(DataSource::Split { blend: Blend::parse(flag, &list)?, split });
    }
    if kinds[1] {
        let [train, valid, test] = per_split;
        return Ok(DataSource::PerSplit([train, valid, test]));
    }
    if kinds[2] {
        return Ok(DataSource::Mock { vocab_size, eod: tokenizer.eod() });
    }
    Err(Error::Usage(
        "no data: pass --data-path P_text_document (run `trident prepare --input FILE --output-prefix P` to \
         write one), a blend such as --data-path 0.3 A 0.7 B, the per-split paths, or --mock-data"
            .into(),
    ))
}

/// `--train-data-path`, `--valid-data-path`, `--test-data-path`, or the same lists from the JSON
/// object `--per-split-data-args-path` names ({"train": "0.5 a 0.5 b", "valid": ["c"], …}).
fn per_split_lists(args: &Args) -> Result<[Option<Blend>; 3]> {
    let flags = ["--train-data-path", "--valid-data-path", "--test-data-path"];
    let Some(path) = args.path("--per-split-data-args-path") else {
        let mut out = [None, None, None];
        for (slot, flag) in out.iter_mut().zip(flags) {
            *slot = args.list(flag).map(|list| Blend::parse(flag, list)).transpose()?;
        }
        return Ok(out);
    };
    if flags.iter().any(|f| args.has(f)) {
        return Err(Error::Usage(
            "--per-split-data-args-path and the per-split path flags are alternatives; give one".into(),
        ));
    }
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, "read", e))?;
    let json = crate::data::json::document(&bytes, &path)?;
    let mut out = [None, None, None];
    for (slot, name) in out.iter_mut().zip(crate::data::datasets::SPLIT_NAMES) {
        let list: Option<Vec<String>> = match json.get(name) {
            None => None,
            Some(v) if v.as_str().is_some() => v.as_str().map(|s| s.split_whitespace().map(String::from).collect()),
            Some(v) => v.as_array().and_then(|a| a.iter().map(|x| x.as_str().map(String::from)).collect()),
        };
        let present = json.get(name).is_some();
        match list {
            Some(list) => *slot = Some(Blend::parse("--per-split-data-args-path", &list)?),
            None if present => {
                return Err(Error::format(&path, format!("\"{name}\" is neither a string nor a list of strings")))
            }
            None => {}
        }
    }
    Ok(out)
}

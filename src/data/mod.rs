//! Training data: the tokenizers (bytes, byte-level BPE, Megatron's TikTokenizer), Megatron's `.bin/.idx` indexed format,
//! the preprocessing that writes it, Megatron's mock data, and the GPT datasets and blends that
//! turn them into shuffled fixed-length samples in Megatron's order.

pub mod added;
pub mod blend;
pub mod bpe;
pub mod datasets;
pub mod gpt_dataset;
pub mod index_cache;
pub mod indexed;
pub mod json;
pub mod numpy_rng;
pub mod prepare;
pub mod pretokenize;
pub mod source;
pub mod tiktoken;
pub mod tokenizer;
pub mod tokenizer_files;
pub mod unicode_classes;

/// A fresh, empty directory under the system temp dir for one unit test; the name carries the
/// process id, the tag and a counter so tests running in parallel never share files.
#[cfg(test)]
pub(crate) fn test_dir(tag: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("trident-unit-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

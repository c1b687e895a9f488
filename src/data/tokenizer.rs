//! The byte-level tokenizer: ids 0..=255 are raw bytes and id 256 marks the end of a document.

/// A tokenizer that needs no vocabulary file: every byte is its own token, so any input (even
/// invalid UTF-8) round-trips exactly, and one extra id separates documents.
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// The end-of-document id that `--append-eod` appends after each document.
    pub const EOD: u32 = 256;
    /// The 256 byte values plus EOD.
    pub const VOCAB_SIZE: usize = 257;

    /// Maps each byte to its own id.
    pub fn encode(text: &[u8]) -> Vec<u32> {
        text.iter().map(|&byte| u32::from(byte)).collect()
    }

    /// Turns ids back into text for people to read. Bytes that are not valid UTF-8 and ids above
    /// EOD become U+FFFD. EOD becomes "\n\n", a paragraph break, so that documents printed one
    /// after another stay visibly apart without inventing a marker string.
    pub fn decode(ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len());
        for &id in ids {
            match u8::try_from(id) {
                Ok(byte) => bytes.push(byte),
                Err(_) if id == Self::EOD => bytes.extend_from_slice(b"\n\n"),
                // The UTF-8 encoding of U+FFFD starts with a lead byte, so it never merges with
                // an unfinished sequence before it and always decodes as one replacement char.
                Err(_) => bytes.extend_from_slice("\u{FFFD}".as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::ByteTokenizer;

    #[test]
    fn round_trips_bytes_and_marks_documents() {
        let ids = ByteTokenizer::encode("héllo".as_bytes());
        assert_eq!(ids, vec![104, 195, 169, 108, 108, 111]);
        assert_eq!(ByteTokenizer::decode(&ids), "héllo");
        assert_eq!(ByteTokenizer::decode(&[97, ByteTokenizer::EOD, 98]), "a\n\nb");
        assert_eq!(ByteTokenizer::decode(&[97, 300, 0xFF, 98]), "a\u{FFFD}\u{FFFD}b");
        assert_eq!(ByteTokenizer::VOCAB_SIZE, ByteTokenizer::EOD as usize + 1);
    }
}

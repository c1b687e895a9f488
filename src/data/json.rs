//! A small, strict JSON reader, in two uses of one parser:
//! - `string_values`, for one line of a JSON-lines file: it validates the whole line and returns
//!   the string values of the keys `--json-keys` asks for; values of other keys are checked and
//!   skipped, never built. Errors carry a 1-based column counted in characters, and
//!   `JsonError::at_line` turns them into a crate error naming file and line.
//! - `document`, for a whole file (tokenizer.json, vocab.json, a Hugging Face config.json, a
//!   safetensors header): the `Json` tree; errors name the line and column.

use crate::error::Error;
use std::fmt;
use std::path::Path;

/// Deeper nesting is rejected rather than risking the stack on a hostile line; real documents
/// nest a handful of levels.
const MAX_DEPTH: usize = 512;

/// What is wrong with a line and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// 1-based character column, or `None` when the problem concerns the whole line (a key
    /// that is missing).
    pub column: Option<usize>,
    pub message: String,
}

impl JsonError {
    /// The crate error for this problem on line `line_number` (1-based) of `path`.
    pub fn at_line(self, path: &Path, line_number: usize) -> Error {
        Error::format(path, format!("line {line_number}, {self}"))
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.column {
            Some(column) => write!(f, "column {column}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

type Parsed<T> = std::result::Result<T, JsonError>;

/// A parsed JSON value. Objects keep their members in file order (a key given twice is found at
/// its first place by `get`).
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    /// A whole number from 0 to 2^53 (above it, an f64 no longer holds every whole number, so a
    /// count or id read from there would not be the one the file wrote).
    pub fn as_usize(&self) -> Option<usize> {
        match self {
            Json::Num(n) if *n >= 0.0 && n.fract() == 0.0 && *n <= 9_007_199_254_740_992.0 => Some(*n as usize),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Num(n) => Some(*n),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(items) => Some(items),
            _ => None,
        }
    }
    pub fn as_object(&self) -> Option<&[(String, Json)]> {
        match self {
            Json::Obj(fields) => Some(fields),
            _ => None,
        }
    }
}

/// `s` as a JSON string literal: quotes, backslashes and control characters escaped.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Parses the whole file `bytes` (read from `path`, named in errors) as one JSON value.
pub fn document(bytes: &[u8], path: &Path) -> crate::error::Result<Json> {
    let fail = |pos: usize, message: String| {
        let before = &bytes[..pos.min(bytes.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[line_start..]).chars().count() + 1;
        Error::format(path, format!("invalid JSON at line {line}, column {column}: {message}"))
    };
    let text = std::str::from_utf8(bytes).map_err(|e| fail(e.valid_up_to(), "invalid UTF-8".into()))?;
    let mut parser = Parser { text, bytes, pos: 0 };
    parser.skip_whitespace();
    let value = parser.build(1).map_err(|e| fail(parser.pos, e.message))?;
    parser.skip_whitespace();
    if parser.peek().is_some() {
        return Err(fail(parser.pos, parser.expected("the end of the file after the value").message));
    }
    Ok(value)
}

/// Parses `line` as one JSON object and returns the string value of each key in `keys`, in the
/// order of `keys`. A key given twice in the object takes its last value, as Python's `json`
/// does. A missing key or a value that is not a string is an error.
pub fn string_values<K: AsRef<str>>(line: &[u8], keys: &[K]) -> std::result::Result<Vec<String>, JsonError> {
    let text = std::str::from_utf8(line).map_err(|e| {
        let valid = &line[..e.valid_up_to()];
        let column = String::from_utf8_lossy(valid).chars().count() + 1;
        let byte = line.get(e.valid_up_to()).copied().unwrap_or(0);
        JsonError {
            column: Some(column),
            message: format!("invalid UTF-8 (byte 0x{byte:02x}); JSON lines must be UTF-8"),
        }
    })?;
    let mut parser = Parser { text, bytes: line, pos: 0 };
    let mut values: Vec<Option<String>> = vec![None; keys.len()];

    parser.skip_whitespace();
    if parser.peek() != Some(b'{') {
        return Err(parser.expected("'{' to open the line's object"));
    }
    let mut key = String::new();
    parser.sequence(b'}', "an object member", |p| {
        key.clear();
        p.key(Some(&mut key))?;
        match keys.iter().position(|wanted| wanted.as_ref() == key) {
            Some(k) if p.peek() == Some(b'"') => {
                let mut value = String::new();
                p.string(Some(&mut value))?;
                values[k] = Some(value);
                Ok(())
            }
            Some(_) => {
                let kind = match p.peek() {
                    Some(b'{') => "an object",
                    Some(b'[') => "an array",
                    Some(b't' | b'f') => "a boolean",
                    Some(b'n') => "null",
                    Some(b'-' | b'0'..=b'9') => "a number",
                    // Not the start of any value: let the general parser report it.
                    _ => return p.value(1),
                };
                Err(p.error(format!("key \"{key}\" holds {kind}, expected a string")))
            }
            None => p.value(1),
        }
    })?;
    parser.skip_whitespace();
    if parser.peek().is_some() {
        return Err(parser.expected("the end of the line after the object"));
    }

    keys.iter()
        .zip(values)
        .map(|(key, value)| {
            value.ok_or_else(|| JsonError {
                column: None,
                message: format!("key \"{}\" not found in the object", key.as_ref()),
            })
        })
        .collect()
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    /// The 1-based character column of byte position `pos` (counted only for an error: counting
    /// for every string made a document's parse quadratic).
    fn column_at(&self, pos: usize) -> usize {
        self.text.get(..pos).map_or(pos, |before| before.chars().count()) + 1
    }

    fn error(&self, message: String) -> JsonError {
        JsonError { column: Some(self.column_at(self.pos)), message }
    }

    /// An error saying what was expected and what is actually at the current position.
    fn expected(&self, what: &str) -> JsonError {
        let found = match self.text.get(self.pos..).and_then(|rest| rest.chars().next()) {
            Some(c) => format!("{c:?}"),
            None => "the end of the line".to_string(),
        };
        self.error(format!("expected {what}, found {found}"))
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// Parses the comma-separated items of an object or array, starting at its opening bracket
    /// and ending after `close`; `item` is called with whitespace already skipped.
    fn sequence(&mut self, close: u8, what: &str, mut item: impl FnMut(&mut Self) -> Parsed<()>) -> Parsed<()> {
        self.pos += 1;
        self.skip_whitespace();
        if self.peek() == Some(close) {
            self.pos += 1;
            return Ok(());
        }
        loop {
            item(self)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_whitespace();
                }
                Some(c) if c == close => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.expected(&format!("',' or '{}' after {what}", close as char))),
            }
        }
    }

    /// Parses `"key" :` and leaves the position at the value.
    fn key(&mut self, out: Option<&mut String>) -> Parsed<()> {
        if self.peek() != Some(b'"') {
            return Err(self.expected("a string key"));
        }
        self.string(out)?;
        self.skip_whitespace();
        if self.peek() != Some(b':') {
            return Err(self.expected("':' after the key"));
        }
        self.pos += 1;
        self.skip_whitespace();
        Ok(())
    }

    /// Checks and skips any value.
    fn value(&mut self, depth: usize) -> Parsed<()> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        match self.peek() {
            Some(b'{') => self.sequence(b'}', "an object member", |p| {
                p.key(None)?;
                p.value(depth + 1)
            }),
            Some(b'[') => self.sequence(b']', "an array element", |p| p.value(depth + 1)),
            Some(b'"') => self.string(None),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            _ => Err(self.expected("a value (string, number, object, array, true, false or null)")),
        }
    }

    /// Parses any value into a `Json` tree (the same grammar and errors as `value`).
    fn build(&mut self, depth: usize) -> Parsed<Json> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        match self.peek() {
            Some(b'{') => {
                let mut fields = Vec::new();
                self.sequence(b'}', "an object member", |p| {
                    let mut key = String::new();
                    p.key(Some(&mut key))?;
                    fields.push((key, p.build(depth + 1)?));
                    Ok(())
                })?;
                Ok(Json::Obj(fields))
            }
            Some(b'[') => {
                let mut items = Vec::new();
                self.sequence(b']', "an array element", |p| {
                    items.push(p.build(depth + 1)?);
                    Ok(())
                })?;
                Ok(Json::Arr(items))
            }
            Some(b'"') => {
                let mut s = String::new();
                self.string(Some(&mut s))?;
                Ok(Json::Str(s))
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.pos;
                self.number()?;
                // JSON's number grammar is a subset of what f64's parser reads.
                let n = self.text[start..self.pos].parse().map_err(|_| self.error("number out of range".into()))?;
                Ok(Json::Num(n))
            }
            Some(b't') => self.literal("true").map(|()| Json::Bool(true)),
            Some(b'f') => self.literal("false").map(|()| Json::Bool(false)),
            Some(b'n') => self.literal("null").map(|()| Json::Null),
            _ => Err(self.expected("a value (string, number, object, array, true, false or null)")),
        }
    }

    fn literal(&mut self, word: &str) -> Parsed<()> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.expected(&format!("the literal {word}")))
        }
    }

    fn digits(&mut self, after: &str) -> Parsed<()> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.expected(&format!("a digit {after}")));
        }
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        Ok(())
    }

    /// Checks a number against JSON's grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Parsed<()> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        if self.peek() == Some(b'0') {
            self.pos += 1;
        } else {
            self.digits("in the number")?;
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.digits("after the decimal point")?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            self.digits("in the exponent")?;
        }
        Ok(())
    }

    /// Parses a string starting at its opening quote, appending its decoded text to `out` if
    /// given. Unescaped runs are copied as slices: they end at ASCII bytes, which are always
    /// character boundaries.
    fn string(&mut self, mut out: Option<&mut String>) -> Parsed<()> {
        let start = self.pos;
        self.pos += 1;
        loop {
            let run_start = self.pos;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.pos += 1;
            }
            if let Some(out) = out.as_deref_mut() {
                out.push_str(&self.text[run_start..self.pos]);
            }
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    let c = self.escape()?;
                    if let Some(out) = out.as_deref_mut() {
                        out.push(c);
                    }
                }
                Some(b) => return Err(self.error(format!("control character U+{b:04X} in a string must be escaped"))),
                None => {
                    let opened = self.column_at(start);
                    return Err(self.expected(&format!("'\"' to close the string opened at column {opened}")));
                }
            }
        }
    }

    /// Decodes one escape sequence starting at its backslash.
    fn escape(&mut self) -> Parsed<char> {
        let backslash = self.pos;
        self.pos += 1;
        let c = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                return self.unicode_escape(backslash);
            }
            _ => return Err(self.expected("an escape character (one of \" \\ / b f n r t u) after '\\'")),
        };
        self.pos += 1;
        Ok(c)
    }

    /// Decodes the digits of `\uXXXX`, joining a UTF-16 surrogate pair written as two escapes.
    fn unicode_escape(&mut self, backslash: usize) -> Parsed<char> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                let low = if self.bytes[self.pos..].starts_with(b"\\u") {
                    self.pos += 2;
                    Some(self.hex4()?)
                } else {
                    None
                };
                match low {
                    Some(low @ 0xDC00..=0xDFFF) => 0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00),
                    _ => {
                        self.pos = backslash;
                        return Err(self.error(format!(
                            "unpaired surrogate \\u{first:04x}: a high surrogate must be followed by a \
                             low one (\\udc00 to \\udfff)"
                        )));
                    }
                }
            }
            0xDC00..=0xDFFF => {
                self.pos = backslash;
                return Err(
                    self.error(format!("unpaired surrogate \\u{first:04x}: a low surrogate must follow a high one"))
                );
            }
            _ => first,
        };
        // Surrogates are handled above, so every remaining code is a scalar value.
        char::from_u32(code).ok_or_else(|| self.error(format!("\\u escape decodes to invalid code point {code:#x}")))
    }

    fn hex4(&mut self) -> Parsed<u32> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = self.peek().and_then(|b| char::from(b).to_digit(16));
            let digit = digit.ok_or_else(|| self.expected("4 hex digits after \\u"))?;
            code = code * 16 + digit;
            self.pos += 1;
        }
        Ok(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(line: &str) -> Parsed<String> {
        string_values(line.as_bytes(), &["text"]).map(|mut values| values.remove(0))
    }

    /// The column and message of a failing line, for compact assertions.
    fn failure(line: &str) -> (Option<usize>, String) {
        let err = text(line).unwrap_err();
        (err.column, err.message)
    }

    #[test]
    fn documents_build_trees_and_name_line_and_column() {
        let path = Path::new("t.json");
        let j = document(
            b"{\"a\": [1, 2.5e1, \"x\\n\\u00e9\\ud83d\\ude00\"],\n \"b\": {\"c\": null, \"d\": true}}\n",
            path,
        )
        .unwrap();
        assert_eq!(j.get("a"), Some(&Json::Arr(vec![Json::Num(1.0), Json::Num(25.0), Json::Str("x\né😀".into())])));
        assert_eq!(j.get("b").and_then(|b| b.get("d")).and_then(Json::as_bool), Some(true));
        for (bad, at) in [
            (&b"{\"a\": 1,}"[..], "line 1, column 9"),
            (b"{\"a\":\n 1} x", "line 2, column 5"),
            (b"[1,\n\n 01]", "line 3"),
        ] {
            let e = document(bad, path).unwrap_err().to_string();
            assert!(e.contains(at) && e.contains("t.json"), "{e}");
        }
    }

    #[test]
    fn plain_and_escaped_strings() {
        assert_eq!(text(r#"{"text": "hello"}"#).unwrap(), "hello");
        assert_eq!(text(r#"{"text":"a\"b\\c\/d\be\ff\ng\rh\ti"}"#).unwrap(), "a\"b\\c/d\u{8}e\u{c}f\ng\rh\ti");
        assert_eq!(text(r#"{"text": ""}"#).unwrap(), "");
    }

    #[test]
    fn quoted_strings_parse_back_to_themselves() {
        for text in ["plain", "a \"quote\" and \\ back", "tab\tnew\nline\u{1}", "é 日本 🙂", ""] {
            let parsed = document(quote(text).as_bytes(), Path::new("q.json")).unwrap();
            assert_eq!(parsed.as_str(), Some(text));
        }
    }

    #[test]
    fn unicode_escapes_surrogate_pairs_and_raw_utf8() {
        assert_eq!(text(r#"{"text": "caf\u00e9 \u00E9 \u4e2d"}"#).unwrap(), "café é 中");
        assert_eq!(text(r#"{"text": "\ud83d\ude00!"}"#).unwrap(), "😀!");
        assert_eq!(text(r#"{"text": "\u0000x"}"#).unwrap(), "\0x");
        assert_eq!(text("{\"text\": \"naïve 😀 ok\"}").unwrap(), "naïve 😀 ok");
    }

    #[test]
    fn other_values_are_skipped_whatever_they_hold() {
        let line = r#" { "meta" : {"a": [1, -2.5e+3, 0, 0.5E-2, true, false, null, {"}": "]\"{"}], "b": {}},
                      "list": [], "n": -0, "text" : "body", "after": [[["x"]]] } "#;
        assert_eq!(text(line).unwrap(), "body");
        let values = string_values(br#"{"title":"T","id":7,"text":"B"}"#, &["text", "title"]).unwrap();
        assert_eq!(values, ["B", "T"]);
        // Python's json keeps the last of duplicate keys.
        assert_eq!(text(r#"{"text":"first","text":"second"}"#).unwrap(), "second");
        // Keys match after unescaping.
        assert_eq!(text(r#"{"t\u0065xt":"escaped key"}"#).unwrap(), "escaped key");
        assert_eq!(text("{\"text\":\"crlf\"}\r\n").unwrap(), "crlf");
    }

    #[test]
    fn malformed_lines_name_column_and_expectation() {
        let cases: &[(&str, usize, &str)] = &[
            ("", 1, "expected '{' to open the line's object, found the end of the line"),
            ("[1]", 1, "expected '{'"),
            (r#"{"text": "a" "b"}"#, 14, "expected ',' or '}' after an object member, found '\"'"),
            (r#"{"text": "a",}"#, 14, "expected a string key, found '}'"),
            (r#"{"text" "a"}"#, 9, "expected ':' after the key"),
            (r#"{"x": [1, 2,], "text": "a"}"#, 13, "expected a value"),
            (r#"{"x": 01, "text": "a"}"#, 8, "expected ',' or '}'"),
            (r#"{"x": 1., "text": "a"}"#, 9, "expected a digit after the decimal point"),
            (r#"{"x": -, "text": "a"}"#, 8, "expected a digit in the number"),
            (r#"{"x": 1e, "text": "a"}"#, 9, "expected a digit in the exponent"),
            (r#"{"x": tru, "text": "a"}"#, 7, "expected the literal true"),
            (r#"{"x": nul}"#, 7, "expected the literal null"),
            (r#"{"text": "a\q"}"#, 13, "expected an escape character"),
            (r#"{"text": "\u12G4"}"#, 15, "expected 4 hex digits after \\u, found 'G'"),
            (r#"{"text": "é\ud800x"}"#, 12, "unpaired surrogate \\ud800"),
            (r#"{"text": "\ud800\u0041"}"#, 11, "unpaired surrogate \\ud800"),
            (r#"{"text": "\udc00"}"#, 11, "unpaired surrogate \\udc00: a low surrogate"),
            ("{\"text\": \"a\tb\"}", 12, "control character U+0009 in a string must be escaped"),
            (
                r#"{"text": "open"#,
                15,
                "expected '\"' to close the string opened at column 10, found the end of the line",
            ),
            (r#"{"text": "a"} x"#, 15, "expected the end of the line after the object, found 'x'"),
            (r#"{"text": "a""#, 13, "expected ',' or '}' after an object member, found the end of the line"),
        ];
        for &(line, column, message) in cases {
            let (found_column, found_message) = failure(line);
            assert!(found_message.starts_with(message), "{line}: {found_message}");
            assert_eq!(found_column, Some(column), "{line}: {found_message}");
        }
    }

    #[test]
    fn missing_keys_wrong_types_bad_utf8_and_deep_nesting() {
        assert_eq!(failure(r#"{"body": "a"}"#), (None, "key \"text\" not found in the object".into()));
        assert_eq!(failure(r#"{"text": 5}"#), (Some(10), "key \"text\" holds a number, expected a string".into()));
        assert_eq!(failure(r#"{"text": ["a"]}"#).1, "key \"text\" holds an array, expected a string");
        assert_eq!(failure(r#"{"text": null}"#).1, "key \"text\" holds null, expected a string");
        let err = string_values(b"{\"text\": \"\xc3\xa9\xff\"}", &["text"]).unwrap_err();
        assert_eq!(err.column, Some(12));
        assert!(err.message.contains("invalid UTF-8 (byte 0xff)"), "{}", err.message);
        let deep = format!("{{\"x\": {}{}, \"text\": \"a\"}}", "[".repeat(600), "]".repeat(600));
        assert!(failure(&deep).1.contains("nesting deeper than 512 levels"));
        let fine = format!("{{\"x\": {}{}, \"text\": \"a\"}}", "[".repeat(100), "]".repeat(100));
        assert_eq!(text(&fine).unwrap(), "a");
    }

    #[test]
    fn errors_name_file_and_line() {
        let err = text(r#"{"text": 1}"#).unwrap_err().at_line(Path::new("in.jsonl"), 7).to_string();
        assert_eq!(err, "in.jsonl: line 7, column 10: key \"text\" holds a number, expected a string");
    }
}

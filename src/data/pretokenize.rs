//! The pre-tokenizers of byte-level BPE: the split patterns of GPT-2, of Llama 3 and of Megatron's
//! TikTokenizer (v1, v2) as hand scanners that cut text exactly where the regexes below do
//! (leftmost alternative first, each quantifier greedy, backtracking as a regex engine would, a
//! possessive one never giving back), over the Unicode classes of `unicode_classes` (`\p{L}`,
//! `\p{N}`; v2's `\p{Lu}`, `\p{Lt}`, `\p{Ll}`, `\p{M}`) and Unicode's White_Space (`\s`). Another
//! pattern is refused by the tokenizer loader, by name.

use super::unicode_classes::{LETTER, LOWER, MARK, NUMBER, UPPER};

/// A split pattern trident knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// GPT-2's (and GPT-NeoX's, OLMo's): `GPT2_REGEX`.
    Gpt2,
    /// Llama 3's (and cl100k's, Qwen 2's): `LLAMA3_REGEX`.
    Llama3,
    /// Megatron's TikTokenizer, `--tiktoken-pattern v1`: `TIKTOKEN_V1_REGEX`.
    TiktokenV1,
    /// `--tiktoken-pattern v2` (Megatron's default): `TIKTOKEN_V2_REGEX`.
    TiktokenV2,
}

/// GPT-2's split pattern, as `tokenizers`' ByteLevel pre-tokenizer and Megatron's GPT-2 BPE use it.
pub const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's split pattern (a `Split` pre-tokenizer in its tokenizer.json).
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Megatron's TikTokenizer pattern v1.
pub const TIKTOKEN_V1_REGEX: &str =
    r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

/// Megatron's TikTokenizer pattern v2: letter runs split where case changes.
pub const TIKTOKEN_V2_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a character is to v2's letter classes: in `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]` (upper), in
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]` (lower), in both (Lm, Lo, M) or in neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    Neither,
    Upper,
    Lower,
    Both,
}

fn case(c: char, class: Class) -> Case {
    let at = c as u32;
    match class {
        Class::Letter if c.is_ascii_uppercase() || (!c.is_ascii() && in_ranges(UPPER, at)) => Case::Upper,
        Class::Letter if c.is_ascii_lowercase() || (!c.is_ascii() && in_ranges(LOWER, at)) => Case::Lower,
        Class::Letter => Case::Both,
        _ if !c.is_ascii() && in_ranges(MARK, at) => Case::Both,
        _ => Case::Neither,
    }
}

/// What a character is to the patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

fn in_ranges(ranges: &[(u32, u32)], c: u32) -> bool {
    let i = ranges.partition_point(|&(_, hi)| hi < c);
    i < ranges.len() && ranges[i].0 <= c
}

fn class(c: char) -> Class {
    if c.is_ascii() {
        return match c {
            'a'..='z' | 'A'..='Z' => Class::Letter,
            '0'..='9' => Class::Number,
            // ASCII White_Space: tab, line feed, vertical tab, form feed, carriage return, space.
            '\t'..='\r' | ' ' => Class::Space,
            _ => Class::Other,
        };
    }
    if in_ranges(LETTER, c as u32) {
        Class::Letter
    } else if in_ranges(NUMBER, c as u32) {
        Class::Number
    } else if c.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// One character of the text: its byte offset, itself, its class and (v2 only) its case.
#[derive(Clone, Copy)]
struct Ch {
    at: usize,
    c: char,
    class: Class,
    case: Case,
}

/// The text as characters, with the scanning helpers both patterns share.
struct Scan<'a> {
    text: &'a str,
    chars: Vec<Ch>,
}

impl Scan<'_> {
    fn is(&self, i: usize, class: Class) -> bool {
        self.chars.get(i).is_some_and(|ch| ch.class == class)
    }

    fn is_char(&self, i: usize, pred: impl Fn(char) -> bool) -> bool {
        self.chars.get(i).is_some_and(|ch| pred(ch.c))
    }

    /// The end of the run of `class` starting at `i` (at most `max` characters).
    fn run(&self, i: usize, class: Class, max: usize) -> usize {
        let mut e = i;
        while e - i < max && self.is(e, class) {
            e += 1;
        }
        e
    }

    /// The length of the contraction (`'s 't 're 've 'm 'll 'd`) at `i`, if one starts there;
    /// `fold`: letters in either case (Llama 3's `(?i:...)`, with U+017F long s folding to s).
    fn contraction(&self, i: usize, fold: bool) -> Option<usize> {
        if !self.is_char(i, |c| c == '\'') {
            return None;
        }
        let letter = |k: usize, want: char| {
            self.is_char(i + k, |c| {
                c == want || (fold && (c.to_ascii_lowercase() == want || (want == 's' && c == 'ſ')))
            })
        };
        for word in ["s", "t", "re", "ve", "m", "ll", "d"] {
            if word.chars().enumerate().all(|(k, w)| letter(k + 1, w)) {
                return Some(1 + word.len());
            }
        }
        None
    }

    /// The end of the run of characters from `i` that `pred` holds for.
    fn run_while(&self, i: usize, pred: impl Fn(&Ch) -> bool) -> usize {
        let mut e = i;
        while self.chars.get(e).is_some_and(&pred) {
            e += 1;
        }
        e
    }

    /// Whether the character at `i` is in `[^\r\n\p{L}\p{N}]`, the TikToken patterns' prefix.
    fn prefix(&self, i: usize) -> bool {
        self.chars.get(i).is_some_and(|ch| matches!(ch.class, Class::Space | Class::Other) && !newline(ch.c))
    }

    /// `\s*[\r\n]+` (or `\s*[\r\n]`, the same end) at `i`: through the whitespace run's last line
    /// break, if it has one; else `\s+(?!\S)|\s+`.
    fn line_breaks_or_spaces(&self, i: usize) -> usize {
        let run_end = self.run(i, Class::Space, usize::MAX);
        match (i..run_end).rev().find(|&k| newline(self.chars[k].c)) {
            Some(k) => k + 1,
            None => self.spaces(i),
        }
    }

    /// ` ?[^\s\p{L}\p{N}]+` then `tail`'s characters at `i`, if it matches there.
    fn symbols(&self, i: usize, tail: impl Fn(char) -> bool) -> Option<usize> {
        let j = if self.is_char(i, |c| c == ' ') && self.is(i + 1, Class::Other) { i + 1 } else { i };
        self.is(j, Class::Other).then(|| self.run_while(self.run(j, Class::Other, usize::MAX), |ch| tail(ch.c)))
    }

    /// `\s+(?!\S)|\s+` at `i` (a whitespace character): the run, less its last character when
    /// more follows and the run has two or more.
    fn spaces(&self, i: usize) -> usize {
        let e = self.run(i, Class::Space, usize::MAX);
        if e < self.chars.len() && e - i >= 2 {
            e - 1
        } else {
            e
        }
    }

    /// GPT-2's pattern: the end (a character index) of the piece starting at `i`.
    fn gpt2(&self, i: usize) -> usize {
        if let Some(len) = self.contraction(i, false) {
            return i + len;
        }
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: a space joins the run after it.
        let j = if self.is_char(i, |c| c == ' ') && !self.is(i + 1, Class::Space) && i + 1 < self.chars.len() {
            i + 1
        } else {
            i
        };
        match self.chars[j].class {
            Class::Space => self.spaces(i),
            class => self.run(j, class, usize::MAX),
        }
    }

    /// Llama 3's pattern: the end of the piece starting at `i`.
    fn llama3(&self, i: usize) -> usize {
        if let Some(len) = self.contraction(i, true) {
            return i + len;
        }
        let ch = self.chars[i];
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if ch.class == Class::Letter {
            return self.run(i, Class::Letter, usize::MAX);
        }
        if ch.class != Class::Number && !newline(ch.c) && self.is(i + 1, Class::Letter) {
            return self.run(i + 1, Class::Letter, usize::MAX);
        }
        // `\p{N}{1,3}`
        if ch.class == Class::Number {
            return self.run(i, Class::Number, 3);
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`, then `\s*[\r\n]+|\s+(?!\S)|\s+`.
        self.symbols(i, newline).unwrap_or_else(|| self.line_breaks_or_spaces(i))
    }

    /// TikTokenizer's v1 pattern: the end of the piece starting at `i`.
    fn tiktoken_v1(&self, i: usize) -> usize {
        // `[^\r\n\p{L}\p{N}]?+\p{L}+`: a prefix, once taken, is never given back.
        let j = if self.prefix(i) { i + 1 } else { i };
        if self.is(j, Class::Letter) {
            return self.run(j, Class::Letter, usize::MAX);
        }
        if self.is(i, Class::Number) {
            return i + 1;
        }
        // ` ?[^\s\p{L}\p{N}]++[\r\n]*`, then `\s*[\r\n]|\s+(?!\S)|\s+`.
        self.symbols(i, newline).unwrap_or_else(|| self.line_breaks_or_spaces(i))
    }

    /// TikTokenizer's v2 pattern: the end of the piece starting at `i`.
    fn tiktoken_v2(&self, i: usize) -> usize {
        let upper = |ch: &Ch| matches!(ch.case, Case::Upper | Case::Both);
        let lower = |ch: &Ch| matches!(ch.case, Case::Lower | Case::Both);
        // The optional prefix is tried taken, then not, in each of the two letter alternatives.
        let starts = if self.prefix(i) { [Some(i + 1), Some(i)] } else { [Some(i), None] };
        // `[U]*[W]+`: the upper run gives back characters until a lower one can start the rest.
        for j in starts.into_iter().flatten() {
            let u = self.run_while(j, upper);
            if let Some(k) = (j..=u).rev().find(|&k| self.chars.get(k).is_some_and(lower)) {
                return self.run_while(k, lower);
            }
        }
        // `[U]+[W]*`
        for j in starts.into_iter().flatten() {
            if self.chars.get(j).is_some_and(upper) {
                return self.run_while(self.run_while(j, upper), lower);
            }
        }
        if self.is(i, Class::Number) {
            return i + 1;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`, then `\s*[\r\n]+|\s+(?!\S)|\s+`.
        let tail = |c: char| newline(c) || c == '/';
        self.symbols(i, tail).unwrap_or_else(|| self.line_breaks_or_spaces(i))
    }
}

fn newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

impl Pattern {
    /// The pattern whose regex is `regex` (as a tokenizer.json writes it), if trident knows it.
    pub fn from_regex(regex: &str) -> Option<Pattern> {
        match regex {
            GPT2_REGEX => Some(Pattern::Gpt2),
            LLAMA3_REGEX => Some(Pattern::Llama3),
            TIKTOKEN_V1_REGEX => Some(Pattern::TiktokenV1),
            TIKTOKEN_V2_REGEX => Some(Pattern::TiktokenV2),
            _ => None,
        }
    }

    /// Calls `piece` with each piece of `text`, in order; the pieces cover `text` exactly.
    pub fn split<'a>(self, text: &'a str, mut piece: impl FnMut(&'a str)) {
        let cased = self == Pattern::TiktokenV2;
        let ch = |(at, c): (usize, char)| {
            let class = class(c);
            Ch { at, c, class, case: if cased { case(c, class) } else { Case::Neither } }
        };
        let chars: Vec<Ch> = text.char_indices().map(ch).collect();
        let scan = Scan { text, chars };
        let mut i = 0;
        while i < scan.chars.len() {
            let e = match self {
                Pattern::Gpt2 => scan.gpt2(i),
                Pattern::Llama3 => scan.llama3(i),
                Pattern::TiktokenV1 => scan.tiktoken_v1(i),
                Pattern::TiktokenV2 => scan.tiktoken_v2(i),
            };
            let end = scan.chars.get(e).map_or(text.len(), |ch| ch.at);
            piece(&scan.text[scan.chars[i].at..end]);
            i = e;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(p: Pattern, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        p.split(text, |s| out.push(s));
        out
    }

    #[test]
    fn gpt2_pieces_follow_the_regex() {
        let p = Pattern::Gpt2;
        assert_eq!(pieces(p, "Hello world!"), ["Hello", " world", "!"]);
        assert_eq!(pieces(p, "don't  stop\n\nnow 42x"), ["don", "'t", " ", " stop", "\n", "\n", "now", " 42", "x"]);
        assert_eq!(pieces(p, "a   "), ["a", "   "]);
        assert_eq!(pieces(p, " 'hello' ..."), [" '", "hello", "'", " ..."]);
        assert_eq!(pieces(p, "café ½ 中文\u{3000}x"), ["café", " ½", " 中文", "\u{3000}", "x"]);
        assert_eq!(pieces(p, "'S"), ["'", "S"]);
    }

    #[test]
    fn llama3_pieces_follow_the_regex() {
        let p = Pattern::Llama3;
        assert_eq!(pieces(p, "Hello world!"), ["Hello", " world", "!"]);
        assert_eq!(pieces(p, "I'M 12345 x"), ["I", "'M", " ", "123", "45", " x"]);
        assert_eq!(pieces(p, "a\n\n  b"), ["a", "\n\n", " ", " b"]);
        assert_eq!(pieces(p, "x...\n\ny"), ["x", "...\n\n", "y"]);
        assert_eq!(pieces(p, "\tfoo,bar"), ["\tfoo", ",bar"]);
        assert_eq!(pieces(p, "end  "), ["end", "  "]);
    }

    #[test]
    fn tiktoken_pieces_follow_the_regexes() {
        let v1 = Pattern::TiktokenV1;
        assert_eq!(pieces(v1, "Hello world! 123"), ["Hello", " world", "!", " ", "1", "2", "3"]);
        assert_eq!(pieces(v1, "'hello .x\n\n y"), ["'hello", " .", "x", "\n\n", " y"]);
        let v2 = Pattern::TiktokenV2;
        assert_eq!(pieces(v2, "HelloWorld GPTModel x2"), ["Hello", "World", " GPTModel", " x", "2"]);
        assert_eq!(pieces(v2, "ABC def"), ["ABC", " def"]);
        assert_eq!(pieces(v2, "a/b//\n\nc"), ["a", "/b", "//\n\n", "c"]);
        assert_eq!(pieces(v2, "中文Ab"), ["中文Ab"]);
        assert_eq!(pieces(v2, " \u{301}e"), [" \u{301}e"]);
    }

    #[test]
    fn classes_come_from_the_tables() {
        assert_eq!(class('é'), Class::Letter);
        assert_eq!(class('中'), Class::Letter);
        assert_eq!(class('\u{301}'), Class::Other); // a combining mark is Mn, not L
        assert_eq!(class('½'), Class::Number);
        assert_eq!(class('\u{a0}'), Class::Space);
        assert_eq!(class('😀'), Class::Other);
    }
}

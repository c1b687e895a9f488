//! The pre-tokenizers of byte-level BPE: the split patterns of GPT-2 and of Llama 3 as hand
//! scanners that cut text exactly where the regexes below do (leftmost alternative first, each
//! quantifier greedy, backtracking as a regex engine would), over the Unicode classes of
//! `unicode_classes` (`\p{L}`, `\p{N}`) and Unicode's White_Space (`\s`). A pattern that is
//! neither is refused by the tokenizer loader, by name.

use super::unicode_classes::{LETTER, NUMBER};

/// A split pattern trident knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// GPT-2's (and GPT-NeoX's, OLMo's): `GPT2_REGEX`.
    Gpt2,
    /// Llama 3's (and cl100k's, Qwen 2's): `LLAMA3_REGEX`.
    Llama3,
}

/// GPT-2's split pattern, as `tokenizers`' ByteLevel pre-tokenizer and Megatron's GPT-2 BPE use it.
pub const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's split pattern (a `Split` pre-tokenizer in its tokenizer.json).
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

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

/// One character of the text: its byte offset, itself and its class.
#[derive(Clone, Copy)]
struct Ch {
    at: usize,
    c: char,
    class: Class,
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
        let newline = |c: char| c == '\r' || c == '\n';
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
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let j = if ch.c == ' ' && self.is(i + 1, Class::Other) { i + 1 } else { i };
        if self.is(j, Class::Other) {
            let mut e = self.run(j, Class::Other, usize::MAX);
            while self.is_char(e, newline) {
                e += 1;
            }
            return e;
        }
        // `\s*[\r\n]+`: through the run's last line break, if it has one; else `\s+(?!\S)|\s+`.
        let run_end = self.run(i, Class::Space, usize::MAX);
        match (i..run_end).rev().find(|&k| newline(self.chars[k].c)) {
            Some(k) => k + 1,
            None => self.spaces(i),
        }
    }
}

impl Pattern {
    /// The pattern whose regex is `regex` (as a tokenizer.json writes it), if trident knows it.
    pub fn from_regex(regex: &str) -> Option<Pattern> {
        match regex {
            GPT2_REGEX => Some(Pattern::Gpt2),
            LLAMA3_REGEX => Some(Pattern::Llama3),
            _ => None,
        }
    }

    /// Calls `piece` with each piece of `text`, in order; the pieces cover `text` exactly.
    pub fn split<'a>(self, text: &'a str, mut piece: impl FnMut(&'a str)) {
        let chars: Vec<Ch> = text.char_indices().map(|(at, c)| Ch { at, c, class: class(c) }).collect();
        let scan = Scan { text, chars };
        let mut i = 0;
        while i < scan.chars.len() {
            let e = match self {
                Pattern::Gpt2 => scan.gpt2(i),
                Pattern::Llama3 => scan.llama3(i),
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
    fn classes_come_from_the_tables() {
        assert_eq!(class('é'), Class::Letter);
        assert_eq!(class('中'), Class::Letter);
        assert_eq!(class('\u{301}'), Class::Other); // a combining mark is Mn, not L
        assert_eq!(class('½'), Class::Number);
        assert_eq!(class('\u{a0}'), Class::Space);
        assert_eq!(class('😀'), Class::Other);
    }
}

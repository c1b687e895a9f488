//! A small command-line parser for Megatron-style flags: `--name value`, `--name=value`,
//! switches, and flags that take several values (`--input a.txt b.txt`). Every flag a subcommand
//! accepts is declared in a table, so an unknown or malformed flag is an error that names it.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;

/// How many values a flag takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Switch,
    One,
    Many,
}

/// One accepted flag: its name (with the leading dashes), arity, value name and help line.
#[derive(Clone, Copy)]
pub struct FlagSpec {
    pub name: &'static str,
    pub arity: Arity,
    pub value: &'static str,
    pub help: &'static str,
}

pub const fn flag(name: &'static str, value: &'static str, help: &'static str) -> FlagSpec {
    FlagSpec { name, arity: Arity::One, value, help }
}

pub const fn switch(name: &'static str, help: &'static str) -> FlagSpec {
    FlagSpec { name, arity: Arity::Switch, value: "", help }
}

pub const fn many(name: &'static str, value: &'static str, help: &'static str) -> FlagSpec {
    FlagSpec { name, arity: Arity::Many, value, help }
}

/// The tables `parts` as one, in order: a group of flags several commands share is written once
/// (`flags::ARCH_FLAGS`). `N` must be the total count.
pub const fn join<const N: usize>(parts: &[&[FlagSpec]]) -> [FlagSpec; N] {
    let mut out = [parts[0][0]; N];
    let (mut i, mut n) = (0, 0);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            out[n] = parts[i][j];
            n += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(n == N, "join: N is not the number of flags");
    out
}

/// The parsed flags of one subcommand.
#[derive(Debug, Default)]
pub struct Args {
    values: BTreeMap<&'static str, Vec<String>>,
}

/// Parses `args` against `specs`. `--help` is reported as `Ok(None)`.
pub fn parse(command: &str, specs: &[FlagSpec], args: &[String]) -> Result<Option<Args>> {
    let mut out = Args::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--help" || arg == "-h" {
            return Ok(None);
        }
        if !arg.starts_with("--") {
            return Err(Error::Usage(format!(
                "unexpected argument '{arg}' for `trident {command}` (flags start with --; see `trident {command} --help`)"
            )));
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let spec = specs.iter().find(|s| s.name == name).ok_or_else(|| unknown_flag(command, name, specs))?;
        i += 1;
        let mut vals = Vec::new();
        match (spec.arity, inline) {
            (Arity::Switch, Some(v)) => {
                return Err(Error::flag(spec.name, format!("'={v}'"), "no value (it is a switch)"));
            }
            (Arity::Switch, None) => {}
            (_, Some(v)) => vals.push(v),
            (Arity::One, None) => {
                match args.get(i) {
                    Some(v) if !looks_like_flag(v) => vals.push(v.clone()),
                    _ => return Err(Error::flag(spec.name, "no value", format!("a value ({})", spec.value))),
                }
                i += 1;
            }
            (Arity::Many, None) => {
                while i < args.len() && !looks_like_flag(&args[i]) {
                    vals.push(args[i].clone());
                    i += 1;
                }
                if vals.is_empty() {
                    return Err(Error::flag(spec.name, "no value", format!("one or more values ({})", spec.value)));
                }
            }
        }
        if out.values.insert(spec.name, vals).is_some() {
            return Err(Error::flag(spec.name, "the flag twice", "it at most once"));
        }
    }
    Ok(Some(out))
}

/// A value that starts with `--` is the next flag, but a negative number is a value.
fn looks_like_flag(s: &str) -> bool {
    s.starts_with("--") && s.len() > 2
}

fn unknown_flag(command: &str, name: &str, specs: &[FlagSpec]) -> Error {
    let closest = specs.iter().map(|s| (edit_distance(s.name, name), s.name)).min();
    let expected = match closest {
        Some((d, best)) if d <= 3 => format!("a flag of `trident {command}` (did you mean {best}?)"),
        _ => format!("a flag of `trident {command}` (see `trident {command} --help`)"),
    };
    Error::flag(name, "an unknown flag", expected)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for j in 0..b.len() {
            let sub = prev[j] + usize::from(ca != b[j]);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Formats the help text of a subcommand from its flag table.
pub fn help(command: &str, summary: &str, specs: &[FlagSpec]) -> String {
    let mut s = format!("trident {command}: {summary}\n\nflags:\n");
    for spec in specs {
        let left = match spec.arity {
            Arity::Switch => spec.name.to_string(),
            Arity::One => format!("{} {}", spec.name, spec.value),
            Arity::Many => format!("{} {}...", spec.name, spec.value),
        };
        s.push_str(&format!("  {left:<40} {}\n", spec.help));
    }
    s
}

impl Args {
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.values.get(name).and_then(|v| v.first()).map(String::as_str)
    }

    pub fn list(&self, name: &str) -> Option<&[String]> {
        self.values.get(name).map(Vec::as_slice)
    }

    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.str(name).map(PathBuf::from)
    }

    /// The flag's value parsed as `T`, or None when absent; a malformed value is an error naming
    /// the flag, the text found and the kind of value expected.
    pub fn parse<T: FromStr>(&self, name: &str, expected: &str) -> Result<Option<T>> {
        match self.str(name) {
            None => Ok(None),
            Some(s) => s.trim().parse::<T>().map(Some).map_err(|_| Error::flag(name, format!("'{s}'"), expected)),
        }
    }

    pub fn usize(&self, name: &str) -> Result<Option<usize>> {
        self.parse(name, "a non-negative whole number")
    }

    pub fn u64(&self, name: &str) -> Result<Option<u64>> {
        self.parse(name, "a non-negative whole number")
    }

    /// A finite float.
    pub fn f64(&self, name: &str) -> Result<Option<f64>> {
        match self.parse::<f64>(name, "a number")? {
            Some(v) if !v.is_finite() => Err(Error::flag(name, v, "a finite number")),
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[FlagSpec] = &[
        flag("--num-layers", "N", "layers"),
        flag("--lr", "LR", "learning rate"),
        switch("--append-eod", "append end of document"),
        many("--input", "FILE", "inputs"),
    ];

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_values_switches_lists_and_negative_numbers() {
        let a = parse("x", SPECS, &strings(&["--num-layers", "4", "--lr=-1e-3", "--append-eod", "--input", "a", "b"]))
            .unwrap()
            .unwrap();
        assert_eq!(a.usize("--num-layers").unwrap(), Some(4));
        assert_eq!(a.f64("--lr").unwrap(), Some(-1e-3));
        assert!(a.has("--append-eod"));
        assert_eq!(a.list("--input").unwrap(), &strings(&["a", "b"])[..]);
    }

    #[test]
    fn errors_name_the_flag() {
        let e = parse("x", SPECS, &strings(&["--num-layer", "4"])).unwrap_err().to_string();
        assert!(e.contains("--num-layer") && e.contains("did you mean --num-layers"), "{e}");
        let e = parse("x", SPECS, &strings(&["--num-layers"])).unwrap_err().to_string();
        assert!(e.contains("--num-layers") && e.contains("no value"), "{e}");
        let a = parse("x", SPECS, &strings(&["--num-layers", "four"])).unwrap().unwrap();
        let e = a.usize("--num-layers").unwrap_err().to_string();
        assert!(e.contains("--num-layers") && e.contains("'four'"), "{e}");
        let e = parse("x", SPECS, &strings(&["--lr", "1", "--lr", "2"])).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
    }
}

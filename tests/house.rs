//! The house rules of ARCHITECTURE.md, checked on the source tree: no file under `src/` over
//! 1,000 lines, no function over 150, every module opening with a `//!` doc, no library code
//! ending the process (only `main` does), and layers that only point down (`cmd` -> `train` -> ... -> `comm`/`data` -> the foundation) with no import loop
//! between top-level modules or between the files of one folder. The scanner reads Rust as text:
//! it strips comments, strings and `#[cfg(test)]` modules, then follows every `crate::` and
//! `super::` path. Each check is also run on a planted violation, so it can fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 1000;
const MAX_FN_LINES: usize = 150;

/// Each top-level module's layer: a module may import its own layer's modules (without a loop) or
/// lower ones (a larger number), never a higher one. `gpu` implements the Device seam, so it sits
/// just above `device`, which never names it.
const LAYERS: &[(&str, u32)] = &[
    ("main", 0),
    ("cmd", 0),
    ("train", 1),
    ("generate", 1),
    ("plan", 1),
    ("config", 2),
    ("checkpoint", 2),
    ("log", 2),
    ("stop", 2),
    ("model", 3),
    ("optim", 3),
    ("parallel", 4),
    ("tensor", 4),
    ("gpu", 5),
    ("device", 6),
    ("comm", 7),
    ("data", 7),
    ("cli", 8),
    ("flags", 8),
    ("error", 8),
    ("files", 8),
    ("real", 8),
    ("rng", 8),
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` with comments, string and char literals blanked (newlines kept, so line numbers hold).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, s: &[u8]| out.extend(s.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }));
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let end = if rest.starts_with(b"//") {
            rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (1, 2);
            while j < rest.len() && depth > 0 {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            j
        } else if let Some(len) = (!ident_before).then(|| raw_string_len(rest)).flatten() {
            len
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest[0] == b'\'' {
            char_literal_len(rest).unwrap_or(0)
        } else {
            0
        };
        if end > 0 {
            blank(&mut out, &rest[..end]);
            i += end;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The length of a raw string literal (`r"..."`, `br#"..."#`) starting at `s[0]`, if one does.
fn raw_string_len(s: &[u8]) -> Option<usize> {
    let start = if s.starts_with(b"br") { 2 } else if s.starts_with(b"r") { 1 } else { return None };
    let hashes = s[start..].iter().take_while(|&&c| c == b'#').count();
    if s.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let body = start + hashes + 1;
    let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
    let end = s[body..].windows(close.len()).position(|w| w == close.as_slice())?;
    Some(body + end + close.len())
}

/// The length of a char literal at `s[0] == '\''` (`'a'`, `'\n'`, `'\u{1F}'`), or None for a lifetime.
fn char_literal_len(s: &[u8]) -> Option<usize> {
    if s.get(1) == Some(&b'\\') {
        let close = s[2..].iter().take(10).position(|&c| c == b'\'')?;
        return Some(close + 3);
    }
    let ch_len = std::str::from_utf8(&s[1..s.len().min(5)]).map_or_else(
        |e| std::str::from_utf8(&s[1..1 + e.valid_up_to()]).ok().and_then(|t| t.chars().next()).map_or(1, char::len_utf8),
        |t| t.chars().next().map_or(1, char::len_utf8),
    );
    (s.get(1 + ch_len) == Some(&b'\'')).then_some(ch_len + 2)
}

/// The index of the brace that closes the one at `open`.
fn matching_brace(code: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (i, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// `code` with every `#[cfg(test)]` item (a test module or a test-only function) blanked.
fn without_tests(code: &str) -> String {
    let mut b = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]").map(|p| p + from) {
        let item_end = match (code[at..].find('{'), code[at..].find(';')) {
            (Some(brace), Some(semi)) if semi < brace => at + semi,
            (Some(brace), _) => matching_brace(code.as_bytes(), at + brace),
            _ => code.len() - 1,
        };
        for c in &mut b[at..=item_end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = item_end + 1;
    }
    String::from_utf8(b).unwrap()
}

/// The modules `code` declares in their own files for tests only: `#[cfg(test)] mod name;`.
fn test_module_names(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices("#[cfg(test)]") {
        let rest = code[at + "#[cfg(test)]".len()..].trim_start();
        let rest = rest.strip_prefix("pub(crate)").or_else(|| rest.strip_prefix("pub")).unwrap_or(rest).trim_start();
        if let Some(rest) = rest.strip_prefix("mod ") {
            let name: String = rest.trim_start().chars().take_while(|&c| c.is_alphanumeric() || c == '_').collect();
            if rest.trim_start()[name.len()..].trim_start().starts_with(';') {
                names.push(name);
            }
        }
    }
    names
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].bytes().filter(|&c| c == b'\n').count() + 1
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every function longer than `MAX_FN_LINES`: (first line, name, lines).
fn long_functions(code: &str) -> Vec<(usize, String, usize)> {
    let b = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ").map(|p| p + from) {
        from = at + 3;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let name: String = code[at + 3..].chars().take_while(|&c| c.is_alphanumeric() || c == '_').collect();
        if name.is_empty() {
            continue;
        }
        // The body opens at the first `{` before any `;` (a declaration without a body has none).
        let Some(open) = b[at..].iter().position(|&c| c == b'{' || c == b';').map(|p| p + at) else { break };
        if b[open] == b';' {
            continue;
        }
        let close = matching_brace(b, open);
        let lines = line_of(code, close) - line_of(code, at) + 1;
        if lines > MAX_FN_LINES {
            found.push((line_of(code, at), name, lines));
        }
    }
    found
}

/// A source file as a module path: `src/gpu/device.rs` -> ["gpu", "device"]; `mod.rs` is its folder.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The paths of a use tree at `s[*at..]` (`a::b`, `{a, b::{c, d}}`, `a::*`), each as segments.
fn use_tree(s: &[u8], at: &mut usize) -> Vec<Vec<String>> {
    let skip_space = |at: &mut usize| {
        while *at < s.len() && s[*at].is_ascii_whitespace() {
            *at += 1;
        }
    };
    skip_space(at);
    if s.get(*at) == Some(&b'{') {
        *at += 1;
        let mut paths = Vec::new();
        loop {
            skip_space(at);
            match s.get(*at) {
                Some(b'}') | None => {
                    *at += 1;
                    return paths;
                }
                Some(b',') => *at += 1,
                _ => {
                    let before = *at;
                    paths.extend(use_tree(s, at));
                    if *at == before {
                        *at += 1;
                    }
                }
            }
        }
    }
    let start = *at;
    while *at < s.len() && is_ident(s[*at]) {
        *at += 1;
    }
    if *at == start {
        return vec![Vec::new()];
    }
    let ident = String::from_utf8_lossy(&s[start..*at]).into_owned();
    if s[*at..].starts_with(b"::") {
        *at += 2;
        return use_tree(s, at)
            .into_iter()
            .map(|mut rest| {
                rest.insert(0, ident.clone());
                rest
            })
            .collect();
    }
    vec![vec![ident]]
}

/// The module paths this file's non-test code names: `crate::...` and `super::...` (use trees
/// expanded), resolved to absolute paths (as many segments as the path has; the caller finds the
/// file each lands in).
fn imports(module: &[String], code: &str) -> Vec<(usize, Vec<String>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for start_word in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start_word).map(|p| p + from) {
            from = at + start_word.len();
            if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b':') {
                continue;
            }
            // `super` of module a::b (file a/b.rs or a/b/mod.rs) is a.
            let base: Vec<String> =
                if start_word == "crate::" { Vec::new() } else { module[..module.len().saturating_sub(1)].to_vec() };
            let mut tree_at = from;
            for rest in use_tree(b, &mut tree_at) {
                let mut path = base.clone();
                let mut rest = rest.as_slice();
                while rest.first().is_some_and(|s| s == "super") {
                    path.pop();
                    rest = &rest[1..];
                }
                path.extend(rest.iter().cloned());
                out.push((line_of(code, at), path));
            }
        }
    }
    out
}

fn layer(top: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == top).map(|&(_, l)| l)
}

struct SourceFile {
    path: PathBuf,
    text: String,
    /// The text without comments, strings and test modules.
    code: String,
    /// Compiled for tests only (declared `#[cfg(test)] mod name;`, or inside such a module).
    test_only: bool,
}

struct Tree {
    /// module path -> its file
    files: BTreeMap<Vec<String>, SourceFile>,
}

impl Tree {
    fn read(src: &Path) -> Tree {
        let mut paths = Vec::new();
        rust_files(src, &mut paths);
        let mut files: BTreeMap<Vec<String>, SourceFile> = paths
            .into_iter()
            .map(|path| {
                let text = std::fs::read_to_string(&path).unwrap();
                let code = without_tests(&code_only(&text));
                (module_of(src, &path), SourceFile { path, text, code, test_only: false })
            })
            .collect();
        let test_modules: Vec<Vec<String>> = files
            .iter()
            .flat_map(|(module, file)| {
                test_module_names(&code_only(&file.text)).into_iter().map(move |name| {
                    let mut child = module.clone();
                    child.push(name);
                    child
                })
            })
            .collect();
        for (module, file) in &mut files {
            file.test_only = test_modules.iter().any(|t| module.starts_with(t));
        }
        Tree { files }
    }

    /// The longest prefix of `path` that is a file of the tree (the module an import lands in).
    fn file_of(&self, path: &[String]) -> Option<Vec<String>> {
        (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| self.files.contains_key(p))
    }

    /// (from module, line, to module) for every import of one file by another.
    fn edges(&self) -> Vec<(Vec<String>, usize, Vec<String>)> {
        let mut edges = Vec::new();
        for (module, file) in self.files.iter().filter(|(_, f)| !f.test_only) {
            for (line, path) in imports(module, &file.code) {
                if let Some(to) = self.file_of(&path) {
                    if &to != module {
                        edges.push((module.clone(), line, to));
                    }
                }
            }
        }
        edges
    }
}

/// Imports that point from a lower layer to a higher one.
fn upward_imports(tree: &Tree) -> Vec<String> {
    let mut bad = Vec::new();
    for (from, line, to) in tree.edges() {
        let (Some(f), Some(t)) = (from.first(), to.first()) else { continue };
        match (layer(f), layer(t)) {
            (Some(lf), Some(lt)) if lt < lf => bad.push(format!(
                "{}:{line}: `{f}` (layer {lf}) imports `{}` (layer {lt})",
                tree.files[&from].path.display(),
                to.join("::")
            )),
            (None, _) => bad.push(format!("module `{f}` has no layer in tests/house.rs's LAYERS")),
            (_, None) => bad.push(format!("module `{t}` has no layer in tests/house.rs's LAYERS")),
            _ => {}
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

/// The strongly connected components of more than one node in `graph`.
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    // Kosaraju: order by finish time, then collect on the reversed graph.
    let nodes: Vec<&Vec<String>> = graph.keys().collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for &n in &nodes {
        let mut stack = vec![(n, false)];
        while let Some((v, done)) = stack.pop() {
            if done {
                order.push(v);
                continue;
            }
            if !seen.insert(v) {
                continue;
            }
            stack.push((v, true));
            for w in graph.get(v).into_iter().flatten() {
                if !seen.contains(w) && graph.contains_key(w) {
                    stack.push((w, false));
                }
            }
        }
    }
    let mut reversed: BTreeMap<&Vec<String>, Vec<&Vec<String>>> = BTreeMap::new();
    for (v, ws) in graph {
        for w in ws {
            reversed.entry(w).or_default().push(v);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut found = Vec::new();
    for &n in order.iter().rev() {
        if assigned.contains(n) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![n];
        assigned.insert(n);
        while let Some(v) = stack.pop() {
            component.push(v.clone());
            for &w in reversed.get(v).into_iter().flatten() {
                if assigned.insert(w) {
                    stack.push(w);
                }
            }
        }
        if component.len() > 1 {
            component.sort();
            found.push(component);
        }
    }
    found
}

/// Import loops between top-level modules, and between the files (or subfolders) of any one folder.
/// An edge a::x::... -> a::y::... counts as x -> y inside folder a; a file and its own folder's
/// `mod.rs` may refer to each other (the parent declares the child).
fn import_loops(tree: &Tree) -> Vec<String> {
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (from, _, to) in tree.edges() {
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if common < from.len() && common < to.len() {
            graph.entry(from[..=common].to_vec()).or_default().insert(to[..=common].to_vec());
        }
    }
    cycles(&graph)
        .into_iter()
        .map(|c| format!("import loop: {}", c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(" <-> ")))
        .collect()
}

fn size_violations(tree: &Tree) -> Vec<String> {
    let mut bad = Vec::new();
    for SourceFile { path, text, .. } in tree.files.values() {
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            bad.push(format!("{}: {lines} lines (at most {MAX_FILE_LINES})", path.display()));
        }
        // Test functions count too: measure the text with only comments and strings blanked.
        for (line, name, n) in long_functions(&code_only(text)) {
            bad.push(format!("{}:{line}: fn {name} is {n} lines (at most {MAX_FN_LINES})", path.display()));
        }
        if !text.trim_start().starts_with("//!") {
            bad.push(format!("{}: opens without a `//!` doc saying what it holds", path.display()));
        }
    }
    bad
}

#[test]
fn files_and_functions_keep_their_size_and_open_with_a_doc() {
    let bad = size_violations(&Tree::read(&src_dir()));
    assert!(bad.is_empty(), "house rules broken:\n{}", bad.join("\n"));
}

#[test]
fn layers_only_point_down() {
    let bad = upward_imports(&Tree::read(&src_dir()));
    assert!(bad.is_empty(), "imports against the layers of ARCHITECTURE.md:\n{}", bad.join("\n"));
}

/// The modules that must see only the Device trait (ARCHITECTURE.md's first invariant), and the one
/// file allowed to name a backend because it opens one. `config` is among them so that checking
/// flags never loads a GPU runtime (that is `train`'s first step).
const BACKEND_BLIND: &[&str] = &["train", "model", "optim", "parallel", "tensor", "checkpoint", "generate", "config"];
const OPENS_THE_DEVICE: &[&str] = &["train", "setup"];

/// Imports of `gpu` from the modules that must see only the Device trait.
fn backend_names(tree: &Tree) -> Vec<String> {
    let mut bad: Vec<String> = tree
        .edges()
        .into_iter()
        .filter(|(from, _, to)| {
            BACKEND_BLIND.contains(&from[0].as_str()) && to[0] == "gpu" && from.as_slice() != OPENS_THE_DEVICE
        })
        .map(|(from, line, to)| format!("{}:{line}: names `{}`", tree.files[&from].path.display(), to.join("::")))
        .collect();
    bad.dedup();
    bad
}

#[test]
fn training_and_the_model_name_no_gpu_type() {
    let bad = backend_names(&Tree::read(&src_dir()));
    assert!(bad.is_empty(), "only train/setup.rs may name `gpu` (it opens the device):\n{}", bad.join("\n"));
}

/// Library code that ends the process itself (`std::process::exit` or `abort`) instead of
/// returning its error to `main` (an op that cannot return one unwinds with `error::fail`).
fn process_exits(tree: &Tree) -> Vec<String> {
    let mut bad = Vec::new();
    for (module, file) in &tree.files {
        if module.as_slice() == ["main"] || file.test_only {
            continue;
        }
        for call in ["process::exit", "process::abort"] {
            for (at, _) in file.code.match_indices(call) {
                bad.push(format!("{}:{}: calls {call}", file.path.display(), line_of(&file.code, at)));
            }
        }
    }
    bad
}

#[test]
fn only_main_ends_the_process() {
    let bad = process_exits(&Tree::read(&src_dir()));
    assert!(bad.is_empty(), "library code ends the process (return the error, or error::fail):\n{}", bad.join("\n"));
}

#[test]
fn no_import_loops() {
    let bad = import_loops(&Tree::read(&src_dir()));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A small tree written to a scratch directory, to show each check fails on what it forbids.
fn planted(files: &[(&str, &str)]) -> Tree {
    let dir = std::env::temp_dir().join(format!("trident-house-{}-{}", std::process::id(), files[0].0.replace('/', "_")));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let tree = Tree::read(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    tree
}

#[test]
fn the_checks_catch_planted_violations() {
    // An upward arrow in code, and the same words in a comment, a string and a test module (ignored).
    let tree = planted(&[
        ("comm/mod.rs", "//! c\npub fn f() { crate::train::g(); }\n// crate::cmd::x\nconst S: &str = \"crate::cmd::y\";\n#[cfg(test)]\nmod tests { use crate::cmd::z; }\n"),
        ("train/mod.rs", "//! t\npub fn g() { crate::comm::f(); }\n"),
        ("cmd/mod.rs", "//! m\n"),
        ("data/mod.rs", "//! d\n#[cfg(test)]\nmod tests;\n"),
        ("data/tests.rs", "//! t\nuse crate::cmd::x;\n"),
    ]);
    let up = upward_imports(&tree);
    assert_eq!(up.len(), 1, "{up:?}");
    assert!(up[0].contains("`comm` (layer 7) imports `train`"), "{up:?}");
    // ...which is also a loop between top-level modules.
    assert!(import_loops(&tree).iter().any(|l| l.contains("comm <-> train")), "{:?}", import_loops(&tree));

    // A loop between two files of one folder, through `super::`; parent <-> child is allowed.
    let tree = planted(&[
        ("gpu/mod.rs", "//! g\npub use self::a::A;\n"),
        ("gpu/a.rs", "//! a\nuse super::b::B;\npub struct A;\n"),
        ("gpu/b.rs", "//! b\nuse super::{a::A, c};\nuse crate::gpu::A as X;\npub struct B;\n"),
        ("gpu/c.rs", "//! c\n"),
    ]);
    let loops = import_loops(&tree);
    assert_eq!(loops, vec!["import loop: gpu::a <-> gpu::b".to_string()]);

    // The training loop naming a GPU type; its setup may.
    let tree = planted(&[
        ("train/mod.rs", "//! t\nfn f(d: crate::gpu::device::GpuDevice) {}\n"),
        ("train/setup.rs", "//! s\nuse crate::gpu::training::TrainingGpu;\n"),
        ("gpu/mod.rs", "//! g\n"),
    ]);
    let named = backend_names(&tree);
    assert_eq!(named.len(), 1, "{named:?}");
    assert!(named[0].contains("train/mod.rs:2: names `gpu`"), "{named:?}");

    // A library file ending the process (main may; a comment and a test module do not count).
    let tree = planted(&[
        ("gpu/mod.rs", "//! g
// std::process::exit(1)
pub fn f() { std::process::exit(1) }
"),
        ("main.rs", "//! m
fn main() { std::process::exit(0) }
"),
        ("cmd/mod.rs", "//! c
#[cfg(test)]
mod tests { fn t() { std::process::abort() } }
"),
    ]);
    let exits = process_exits(&tree);
    assert_eq!(exits.len(), 1, "{exits:?}");
    assert!(exits[0].ends_with("gpu/mod.rs:3: calls process::exit"), "{exits:?}");

    // Sizes: a 151-line function (with a lifetime, a char and a brace in a string inside), a file
    // over 1,000 lines, a file without its doc.
    let body: String = (0..148).map(|i| format!("    let _x{i} = '{{'; let _s = \"}}\";\n")).collect();
    let long = format!("//! l\nfn long<'a>(x: &'a str) -> &'a str {{\n{body}    x\n}}\n");
    let big = format!("//! b\n{}", "const _X: u8 = 0;\n".repeat(1000));
    let tree = planted(&[("long.rs", &long), ("big.rs", &big), ("bare.rs", "pub fn f() {}\n")]);
    let sizes = size_violations(&tree);
    assert!(sizes.iter().any(|s| s.ends_with("fn long is 151 lines (at most 150)")), "{sizes:?}");
    assert!(sizes.iter().any(|s| s.contains("big.rs: 1001 lines")), "{sizes:?}");
    assert!(sizes.iter().any(|s| s.contains("bare.rs: opens without")), "{sizes:?}");
    assert_eq!(sizes.len(), 3, "{sizes:?}");
}

/// The clone's root.
fn clone_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text files of the clone (sources, scripts, docs, build files), skipping build outputs,
/// caches, the bundled corpus and test data, as paths relative to `root`.
fn text_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let skip_dirs = [".git", "runs", ".cache", "node_modules"];
    let text = ["md", "rs", "sh", "py", "toml", "cu", "cuh", "hip", "h", "cpp", "c", "sbatch", "pbs", "txt", "json"];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            let relative = path.strip_prefix(root).unwrap();
            let data = relative == Path::new("data") || relative == Path::new("tests/data");
            let top_level_skip = skip_dirs.contains(&name.as_str()) && relative.components().count() == 1;
            let skipped = data || top_level_skip || name.starts_with("target") || name.starts_with('.');
            if !skipped {
                text_files(root, &path, out);
            }
        } else if name == "Makefile" || path.extension().is_some_and(|e| text.contains(&e.to_str().unwrap_or(""))) {
            out.push(path.strip_prefix(root).unwrap().to_path_buf());
        }
    }
}

/// References out of the clone in `text` (of the file `name`): the design notes beside a
/// developer's checkout, this build machine's folders (its home included: `home`, with a
/// trailing slash), or the clone's own absolute path.
fn outside_references(name: &str, text: &str, clone: &str, home: &str) -> Vec<String> {
    let notes = [concat!("../", "shared"), concat!("shared/", "reference"), concat!("DESIGN", ".md")];
    let outside = [notes[0], notes[1], notes[2], concat!("/wo", "rk/"), clone, home];
    let mut bad = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for o in outside {
            if !o.is_empty() && line.contains(o) {
                bad.push(format!("{name}:{}: names `{o}`, outside the clone", n + 1));
            }
        }
    }
    bad
}

/// Markdown links in `text` (of the file `file`, relative to `root`) that name no file of the
/// clone: a missing file, an absolute path, or one that leads out of it.
fn broken_links(root: &Path, file: &Path, text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].trim().trim_matches(['<', '>']);
        rest = &after[end..];
        let path = target.split('#').next().unwrap_or("");
        if path.is_empty() || target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
            continue;
        }
        let resolved = root.join(file.parent().unwrap_or(Path::new(""))).join(path);
        let inside = resolved.canonicalize().is_ok_and(|r| r.starts_with(root.canonicalize().unwrap()));
        if path.starts_with('/') || !inside {
            bad.push(format!("{}: links to `{target}`, which is not a file of the clone", file.display()));
        }
    }
    bad
}

#[test]
fn the_clone_stands_alone() {
    let root = clone_root();
    let mut files = Vec::new();
    text_files(&root, &root, &mut files);
    assert!(files.len() > 100 && files.iter().any(|f| f.ends_with("README.md")), "{} files", files.len());
    let clone = root.display().to_string();
    // This machine's home, as an example's output would print it (not `/`, which every path has).
    let home = std::env::var("HOME").ok().filter(|h| h.len() > 1).map(|h| format!("{}/", h.trim_end_matches('/')));
    let home = home.unwrap_or_default();
    let mut bad = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else { continue };
        if file != Path::new("tests/house.rs") {
            bad.extend(outside_references(&file.display().to_string(), &text, &clone, &home));
        }
        if file.extension().is_some_and(|e| e == "md") {
            bad.extend(broken_links(&root, file, &text));
        }
    }
    assert!(bad.is_empty(), "the clone must stand alone:\n{}", bad.join("\n"));
}

#[test]
fn the_self_containment_checks_catch_planted_violations() {
    let dir = std::env::temp_dir().join(format!("trident-house-links-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/there.md"), "x").unwrap();
    std::fs::write(dir.join("outside.md"), "x").unwrap();
    let text = "[ok](docs/there.md#a) [web](https://x.org/y) [gone](docs/missing.md) [abs](/etc/passwd) [out](../outside.md)";
    let clone = dir.join("clone");
    std::fs::create_dir_all(clone.join("docs")).unwrap();
    std::fs::write(clone.join("docs/there.md"), "x").unwrap();
    let bad = broken_links(&clone, Path::new("README.md"), text);
    assert_eq!(bad.len(), 3, "{bad:?}");
    for target in ["docs/missing.md", "/etc/passwd", "../outside.md"] {
        assert!(bad.iter().any(|b| b.contains(target)), "{target}: {bad:?}");
    }
    let planted = format!("see {}/notes.md and {}\nfine\nnvrtc: 13.5 (/u/kim/.cache/x.so)\n", concat!("../", "shared"), clone.display());
    let bad = outside_references("x.rs", &planted, &clone.display().to_string(), "/u/kim/");
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert!(bad[2].starts_with("x.rs:3:") && bad[2].contains("/u/kim/"), "{bad:?}");
    assert!(bad[0].starts_with("x.rs:1:"), "{bad:?}");
}

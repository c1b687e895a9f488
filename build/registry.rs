//! The kernel registry, generated from the kernels' own declarations: every
//! `extern "C" __global__` function of the CUDA suite (`kernels/*.cu`, `kernels-cuda/*.cu`) becomes
//! a `Kernel` variant and a `KERNELS` row (its file, block size per vendor, shared memory, lowest
//! architecture), and a typed argument function `args::<name>` whose parameters are the C
//! parameters' (a pointer is a `u64` device address, `int` an `i32`, `float` an `f32`, `double`
//! an `f64`, a `__grid_constant__ TensorMap` a `TensorMap`): a launch with a wrong argument count
//! or type does not compile. The HIP suite (`kernels/*.cu` again and `kernels-hip/*.hip`) gives the
//! HIP block sizes; a HIP twin whose parameters differ from its CUDA kernel's, or a HIP kernel
//! without one, is a build error.
//!
//! A kernel's block is its `__launch_bounds__` (a product of numbers and `kWaveSize`, 32 on CUDA
//! and 64 on HIP, optionally with `CUDA_MIN_BLOCKS(n)`), else 256. What a declaration cannot say
//! is written on a comment line directly above it, `// registry: key=value ...` with the keys
//! `static_shared` and `dynamic_shared` (bytes, CUDA) and `min_arch` (compute capability x 10);
//! each defaults to 0, 0 and 80.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A C parameter's kind, as the launch passes it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Param {
    Ptr,
    I32,
    F32,
    F64,
    Map,
}

impl Param {
    fn of(ctype: &str, at: &str) -> Param {
        match ctype {
            t if t.ends_with('*') => Param::Ptr,
            "int" => Param::I32,
            "float" => Param::F32,
            "double" => Param::F64,
            "const __grid_constant__ TensorMap" => Param::Map,
            t => panic!("build.rs: {at}: no launch argument type for the C type '{t}'"),
        }
    }

    /// (Rust type, `Arg` variant, `ParamKind` name)
    fn rust(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Param::Ptr => ("u64", "Ptr", "Ptr"),
            Param::I32 => ("i32", "I32", "I32"),
            Param::F32 => ("f32", "F32", "F32"),
            Param::F64 => ("f64", "F64", "F64"),
            Param::Map => ("TensorMap", "Map", "Map"),
        }
    }
}

/// One `extern "C" __global__` declaration.
struct Decl {
    name: String,
    file: String,
    /// (C type as written, parameter name)
    params: Vec<(String, String)>,
    /// The `__launch_bounds__` block expression, `CUDA_MIN_BLOCKS` and any minimum-blocks part
    /// dropped.
    bound: Option<String>,
    /// The `// registry:` line's `key=value` pairs.
    registry: Vec<(String, u32)>,
}

/// `text` without its comments, except a `// registry: ...` line, which becomes `@registry{...}`.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(line) = rest.strip_prefix("//") {
            let end = line.find('\n').unwrap_or(line.len());
            if let Some(tag) = line[..end].trim().strip_prefix("registry:") {
                write!(out, "@registry{{{}}}", tag.trim()).unwrap();
            }
            rest = &line[end..];
        } else if let Some(block) = rest.strip_prefix("/*") {
            let end = block.find("*/").map_or(block.len(), |e| e + 2);
            out.push(' ');
            rest = &block[end..];
        } else if rest.starts_with('"') {
            // A string literal (extern "C"): copied whole.
            let end = rest[1..].find('"').map_or(rest.len(), |e| e + 2);
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The text inside the parentheses that open at `text[0]`, and what follows the closing one.
fn balanced<'a>(text: &'a str, at: &str) -> (&'a str, &'a str) {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return (&text[1..i], &text[i + 1..]);
                }
            }
            _ => {}
        }
    }
    panic!("build.rs: {at}: unbalanced parentheses")
}

fn registry_pairs(tag: &str, at: &str) -> Vec<(String, u32)> {
    tag.split_whitespace()
        .map(|pair| {
            let (key, value) =
                pair.split_once('=').unwrap_or_else(|| panic!("build.rs: {at}: '{pair}' is not key=value"));
            if !["static_shared", "dynamic_shared", "min_arch"].contains(&key) {
                panic!("build.rs: {at}: unknown registry key '{key}'");
            }
            let value = value.parse().unwrap_or_else(|_| panic!("build.rs: {at}: '{value}' is not a number"));
            (key.to_string(), value)
        })
        .collect()
}

/// Every `extern "C" __global__` declaration of `path`, in order.
fn declarations(path: &Path) -> Vec<Decl> {
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    let raw = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("build.rs: cannot read {}: {e}", path.display()));
    let text = strip_comments(&raw);
    const OPEN: &str = "extern \"C\" __global__";
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find(OPEN) {
        let start = from + found;
        let before = text[..start].trim_end();
        let registry = match before.strip_suffix('}').and_then(|b| b.rfind("@registry{").map(|at| (b, at))) {
            Some((b, at)) if !b[at..].contains('\n') => registry_pairs(&b[at + "@registry{".len()..], &file),
            _ => Vec::new(),
        };
        let rest = text[start + OPEN.len()..].trim_start();
        let rest = rest.strip_prefix("void").unwrap_or_else(|| panic!("build.rs: {file}: a kernel that is not void"));
        let mut rest = rest.trim_start();
        let mut bound = None;
        if let Some(after) = rest.strip_prefix("__launch_bounds__") {
            let (inside, tail) = balanced(after.trim_start(), &file);
            let first = inside.split("CUDA_MIN_BLOCKS").next().unwrap().split(',').next().unwrap();
            bound = Some(first.trim().to_string());
            rest = tail.trim_start();
        }
        let open = rest.find('(').unwrap_or_else(|| panic!("build.rs: {file}: a kernel declaration without '('"));
        let name = rest[..open].trim().to_string();
        let at = format!("{file}: {name}");
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            panic!("build.rs: {at}: cannot read the kernel's name");
        }
        let (inside, tail) = balanced(&rest[open..], &at);
        let params = inside
            .split(',')
            .enumerate()
            .map(|(i, p)| {
                let p = p.replace("__restrict__", " ").replace('*', "* ");
                let words: Vec<&str> = p.split_whitespace().collect();
                // An unnamed parameter (`int /* kv_heads */`) is called arg<i>.
                let named = words.len() > 1 && !words[words.len() - 1].ends_with('*');
                let (ctype, pname) = if named {
                    (words[..words.len() - 1].join(" "), words[words.len() - 1].to_string())
                } else {
                    (words.join(" "), format!("arg{i}"))
                };
                if ctype.is_empty() {
                    panic!("build.rs: {at}: an empty parameter");
                }
                (ctype.replace(" *", "*"), pname)
            })
            .collect();
        out.push(Decl { name, file: file.clone(), params, bound, registry });
        from = text.len() - tail.len();
    }
    let tags = text.matches("@registry{").count();
    let used = out.iter().filter(|d| !d.registry.is_empty()).count();
    if tags != used {
        panic!("build.rs: {file}: a '// registry:' line must sit directly above its kernel's extern \"C\" line");
    }
    out
}

/// A block expression evaluated with the vendor's wave size.
fn threads(decl: &Decl, wave: u32) -> u32 {
    let Some(bound) = &decl.bound else { return 256 };
    bound
        .split('*')
        .map(|t| match t.trim() {
            "kWaveSize" => wave,
            t => t.parse().unwrap_or_else(|_| {
                panic!("build.rs: {}: {}: cannot read the launch bound '{bound}'", decl.file, decl.name)
            }),
        })
        .product()
}

fn camel(name: &str) -> String {
    name.split('_').map(|w| w[..1].to_ascii_uppercase() + &w[1..]).collect()
}

/// A parameter name as a Rust identifier (`in` is a keyword).
fn ident(name: &str) -> String {
    match name {
        "in" | "ref" | "type" | "fn" | "mod" | "move" | "box" | "match" | "loop" | "use" | "self" => format!("{name}_"),
        n => n.to_string(),
    }
}

/// Writes `kernel_registry.rs` into `out_dir` from the CUDA and HIP suites' kernel files.
pub fn generate(cuda_files: &[PathBuf], hip_files: &[PathBuf], out_dir: &Path) {
    let cuda: Vec<Decl> = cuda_files.iter().flat_map(|p| declarations(p)).collect();
    let kinds = |d: &Decl| -> Vec<Param> {
        d.params.iter().map(|(t, _)| Param::of(t, &format!("{}: {}", d.file, d.name))).collect()
    };
    let mut hip_threads = vec![None; cuda.len()];
    for h in hip_files.iter().flat_map(|p| declarations(p)) {
        let i = cuda
            .iter()
            .position(|c| c.name == h.name)
            .unwrap_or_else(|| panic!("build.rs: kernels-hip/{}: {} has no CUDA kernel of that name", h.file, h.name));
        let stem = |f: &str| f.split('.').next().unwrap().to_string();
        if stem(&h.file) != stem(&cuda[i].file) || kinds(&h) != kinds(&cuda[i]) {
            panic!(
                "build.rs: {} in {}: its parameters must be those of {}'s ({:?} against {:?})",
                h.name,
                h.file,
                cuda[i].file,
                kinds(&h),
                kinds(&cuda[i])
            );
        }
        hip_threads[i] = Some(threads(&h, 64));
    }
    for (i, c) in cuda.iter().enumerate() {
        if cuda[..i].iter().any(|o| o.name == c.name) {
            panic!("build.rs: two kernels named {} ({} and another)", c.name, c.file);
        }
    }

    let mut gen = String::from(
        "// Generated by build.rs (build/registry.rs) from the kernels' extern \"C\" __global__ declarations.\n\n\
         /// Every kernel function, in file and then declaration order: its name in CamelCase.\n\
         #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\npub enum Kernel {\n",
    );
    for c in &cuda {
        writeln!(gen, "    /// `{}` of {}", c.name, c.file).unwrap();
        writeln!(gen, "    {},", camel(&c.name)).unwrap();
    }
    gen.push_str("}\n\n/// Every kernel function, in `Kernel`'s order.\npub const KERNELS: &[KernelSpec] = &[\n");
    for (c, hip) in cuda.iter().zip(&hip_threads) {
        let get = |key: &str, default: u32| c.registry.iter().find(|(k, _)| k == key).map_or(default, |(_, v)| *v);
        let params: Vec<&str> = kinds(c).iter().map(|p| p.rust().2).collect();
        writeln!(
            gen,
            "    KernelSpec {{ kernel: Kernel::{}, function: {:?}, file: {:?}, threads: {}, hip_threads: {:?}, \
             static_shared: {}, dynamic_shared: {}, min_arch: {}, params: &[{}] }},",
            camel(&c.name),
            c.name,
            c.file,
            threads(c, 32),
            hip,
            get("static_shared", 0),
            get("dynamic_shared", 0),
            get("min_arch", 80),
            params.iter().map(|p| format!("ParamKind::{p}")).collect::<Vec<_>>().join(", ")
        )
        .unwrap();
    }
    gen.push_str(
        "];\n\n/// One typed argument list per kernel, from its C declaration.\n\
         #[allow(clippy::too_many_arguments, non_snake_case)]\npub mod args {\n    \
         use super::{Kernel, Launch};\n    use crate::gpu::runtime::Arg;\n    use crate::gpu::tma::TensorMap;\n",
    );
    for c in &cuda {
        let kinds = kinds(c);
        let sig: Vec<String> = c.params.iter().map(|(t, n)| format!("{t} {n}")).collect();
        let params: Vec<String> =
            c.params.iter().zip(&kinds).map(|((_, n), k)| format!("{}: {}", ident(n), k.rust().0)).collect();
        let values: Vec<String> =
            c.params.iter().zip(&kinds).map(|((_, n), k)| format!("Arg::{}({})", k.rust().1, ident(n))).collect();
        writeln!(gen, "\n    /// `{}({})` of {}", c.name, sig.join(", "), c.file).unwrap();
        writeln!(gen, "    pub fn {}({}) -> Launch<{}> {{", c.name, params.join(", "), kinds.len()).unwrap();
        writeln!(gen, "        Launch {{ kernel: Kernel::{}, args: [{}] }}", camel(&c.name), values.join(", "))
            .unwrap();
        gen.push_str("    }\n");
    }
    gen.push_str("}\n");
    std::fs::write(out_dir.join("kernel_registry.rs"), gen).expect("build.rs: write kernel_registry.rs");
}

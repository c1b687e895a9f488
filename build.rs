//! Build script: records which source and compiler a binary came from (git commit, rustc version,
//! target), so `trident --version`, `trident info` and every training log can name the build that
//! produced a result; and embeds the CUDA kernels (every `*.cu` of `kernels/`, the portable
//! kernels both vendors compile, and of `kernels-cuda/`, with every `common/*.h` of `kernels/` and
//! `common/*.cuh` of `kernels-cuda/`, not the emulation in `emu/`) as text, for NVRTC to compile at
//! run time (src/gpu/kernels/cuda.rs). When `TRIDENT_CUDA_ARCHS` is set (e.g. `80;90a`), it also compiles each
//! kernel file ahead of time (as many at once as cargo's `-j`) with nvcc (`$TRIDENT_NVCC`, else `nvcc` on the PATH) to one CUBIN
//! per architecture and 16-bit storage type (bf16, and fp16 with `-DTRIDENT_FP16`) and embeds those
//! images; a set variable without a working nvcc is a build
//! error, never a silent fallback. Unset (the default), no nvcc is looked for.
//! The HIP kernels (`kernels/`'s as above, and every `*.hip` and `common/*.h` of `kernels-hip/`)
//! are embedded the same way,
//! for hipRTC; `TRIDENT_HIP_ARCHS` (e.g. `gfx90a;gfx942`) adds one code object (v4) per file,
//! architecture and 16-bit storage type (bf16, and fp16 with `-DTRIDENT_FP16`), compiled by
//! `$TRIDENT_HIPCC` (else `hipcc`) with `$TRIDENT_HIP_FLAGS` and, when set, `--rocm-device-lib-path=$TRIDENT_HIP_DEVICE_LIBS` (the gfx942 shim of kernels-hip/check.sh
//! for Debian's clang-19).
//! Last, it generates the kernel registry and the typed launch arguments from the kernels'
//! declarations (build/registry.rs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build/registry.rs"]
mod registry;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// Runs the ahead-of-time compiles `jobs` (each a compiler command and what it compiles) as many
/// at a time as cargo's `-j` allows (`NUM_JOBS`; every core by default): on a login node the
/// kernels of several architectures take minutes one after another. Panics with the first failure
/// in `jobs`' order, and its compiler's output.
fn compile_all(jobs: Vec<(Command, String)>) {
    let workers = std::env::var("NUM_JOBS").ok().and_then(|n| n.parse::<usize>().ok()).unwrap_or(1).clamp(1, 64);
    let queue = std::sync::Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let Some((i, (mut cmd, what))) = queue.lock().unwrap().pop() else { return };
                let failure = match cmd.output() {
                    Ok(out) if out.status.success() => continue,
                    Ok(out) => format!("build.rs: {what} failed:\n{}", String::from_utf8_lossy(&out.stderr)),
                    Err(e) => format!("build.rs: {what}: {e}"),
                };
                failures.lock().unwrap().push((i, failure));
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    if let Some((_, first)) = failures.into_iter().next() {
        panic!("{first}");
    }
}

/// The files of `dir` ending in `ext`, sorted by name.
/// The package's directory, read when the script runs: `env!` would freeze the directory the
/// script was compiled in, and a build directory copied from another clone (or worktree) would
/// then embed that clone's kernels.
fn manifest_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("build.rs: cannot list {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    out
}

/// `80` -> `sm_80`, `90a` -> `sm_90a`, `sm_86` -> `sm_86`; anything else is a build error.
fn aot_arch(word: &str) -> String {
    let digits = word.strip_prefix("sm_").unwrap_or(word);
    let ok = digits.len() >= 2
        && digits.chars().take(2).all(|c| c.is_ascii_digit())
        && digits.chars().all(|c| c.is_ascii_alphanumeric());
    if !ok {
        panic!("build.rs: TRIDENT_CUDA_ARCHS: '{word}' is not an architecture (expected e.g. 80, 86, 90a)");
    }
    format!("sm_{digits}")
}

/// One vendor's kernel files and headers: the portable ones of `kernels/` (kernel files `*.cu`,
/// headers `common/*.h`) and the vendor's own (`root/*.<ext>`, `root/common/*.<header_ext>`),
/// each list sorted by name; two files of one name are a build error (they share one include
/// namespace, `common/<name>`, and one table).
fn suite(root: &Path, ext: &str, header_ext: &str) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let portable = manifest_dir().join("kernels");
    let mut kernels = files(&portable, "cu");
    kernels.extend(files(root, ext));
    let mut headers = files(&portable.join("common"), "h");
    headers.extend(files(&root.join("common"), header_ext));
    for dir in [portable.clone(), portable.join("common"), root.to_path_buf(), root.join("common")] {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    for list in [&mut kernels, &mut headers] {
        list.sort_by_key(|p| p.file_name().map(|n| n.to_owned()));
        for pair in list.windows(2) {
            if pair[0].file_name() == pair[1].file_name() {
                panic!("build.rs: {} and {} have the same name", pair[0].display(), pair[1].display());
            }
        }
    }
    (kernels, headers)
}

/// The include paths the GPU compilers get for a vendor's folder: `kernels/` and that folder.
fn include_paths(vendor_root: &Path) -> [String; 4] {
    ["-I".into(), manifest_dir().join("kernels").display().to_string(), "-I".into(), vendor_root.display().to_string()]
}

fn embed_kernels(out_dir: &Path) {
    let root = manifest_dir().join("kernels-cuda");
    let (kernels, headers) = suite(&root, "cu", "cuh");
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    let mut gen = String::from("// Generated by build.rs: the embedded CUDA kernel sources.\n");
    gen.push_str("pub static KERNEL_FILES: &[(&str, &str)] = &[\n");
    for k in &kernels {
        println!("cargo:rerun-if-changed={}", k.display());
        writeln!(gen, "    ({:?}, include_str!({:?})),", name(k), k.display().to_string()).unwrap();
    }
    gen.push_str("];\npub static KERNEL_HEADERS: &[(&str, &str)] = &[\n");
    for h in &headers {
        println!("cargo:rerun-if-changed={}", h.display());
        writeln!(gen, "    ({:?}, include_str!({:?})),", format!("common/{}", name(h)), h.display().to_string())
            .unwrap();
    }
    gen.push_str("];\n");

    println!("cargo:rerun-if-env-changed=TRIDENT_CUDA_ARCHS");
    println!("cargo:rerun-if-env-changed=TRIDENT_NVCC");
    let archs: Vec<String> = std::env::var("TRIDENT_CUDA_ARCHS")
        .unwrap_or_default()
        .split([';', ',', ' '])
        .filter(|w| !w.is_empty())
        .map(aot_arch)
        .collect();
    let mut nvcc_line = String::new();
    // Each file and architecture twice: the bf16 module (no define) into AOT_IMAGES, the fp16
    // module (-DTRIDENT_FP16, the same sources on binary16 storage) into AOT_IMAGES_FP16.
    let mut fp16 = String::from("pub static AOT_IMAGES_FP16: &[(&str, &str, &[u8])] = &[\n");
    gen.push_str("pub static AOT_IMAGES: &[(&str, &str, &[u8])] = &[\n");
    if !archs.is_empty() {
        let nvcc = std::env::var("TRIDENT_NVCC").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| "nvcc".into());
        let version = output(&nvcc, &["--version"]).unwrap_or_else(|| {
            panic!(
                "build.rs: TRIDENT_CUDA_ARCHS={} asks for kernels compiled ahead of time, but nvcc ('{nvcc}') does not run; set TRIDENT_NVCC to an nvcc, or unset TRIDENT_CUDA_ARCHS (the kernels are then compiled at run time by NVRTC)",
                archs.join(";")
            )
        });
        nvcc_line = version.lines().last().unwrap_or("").to_string();
        let aot = out_dir.join("aot");
        std::fs::create_dir_all(&aot).expect("build.rs: create OUT_DIR/aot");
        let mut jobs = Vec::new();
        for k in &kernels {
            for arch in &archs {
                for (module, defines, table) in [("", &[][..], &mut gen), (".fp16", &["-DTRIDENT_FP16"][..], &mut fp16)]
                {
                    let cubin = aot.join(format!("{}.{arch}{module}.cubin", name(k).trim_end_matches(".cu")));
                    let virt = arch.replace("sm_", "compute_");
                    let mut cmd = Command::new(&nvcc);
                    cmd.args(["-cubin", "-O3", "-std=c++17", &format!("-gencode=arch={virt},code={arch}")])
                        .args(include_paths(&root))
                        .args(defines)
                        .arg("-o")
                        .arg(&cubin)
                        .arg(k);
                    jobs.push((cmd, format!("{nvcc} on {} for {arch}{module}", k.display())));
                    writeln!(
                        table,
                        "    ({:?}, {:?}, include_bytes!({:?})),",
                        name(k),
                        arch,
                        cubin.display().to_string()
                    )
                    .unwrap();
                }
            }
        }
        compile_all(jobs);
    }
    gen.push_str("];\n");
    fp16.push_str("];\n");
    gen.push_str(&fp16);
    writeln!(gen, "pub static AOT_NVCC: &str = {nvcc_line:?};").unwrap();
    std::fs::write(out_dir.join("kernel_sources.rs"), gen).expect("build.rs: write kernel_sources.rs");
}

/// `gfx90a` and the like; anything else is a build error.
fn hip_aot_arch(word: &str) -> String {
    let ok = word
        .strip_prefix("gfx")
        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
    if !ok {
        panic!("build.rs: TRIDENT_HIP_ARCHS: '{word}' is not an AMD architecture (expected e.g. gfx90a, gfx942)");
    }
    word.to_string()
}

fn embed_hip_kernels(out_dir: &Path) {
    let root = manifest_dir().join("kernels-hip");
    let (kernels, headers) = suite(&root, "hip", "h");
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    let mut gen = String::from("// Generated by build.rs: the embedded HIP kernel sources.\n");
    gen.push_str("pub static HIP_KERNEL_FILES: &[(&str, &str)] = &[\n");
    for k in &kernels {
        println!("cargo:rerun-if-changed={}", k.display());
        writeln!(gen, "    ({:?}, include_str!({:?})),", name(k), k.display().to_string()).unwrap();
    }
    gen.push_str("];\npub static HIP_KERNEL_HEADERS: &[(&str, &str)] = &[\n");
    for h in &headers {
        println!("cargo:rerun-if-changed={}", h.display());
        writeln!(gen, "    ({:?}, include_str!({:?})),", format!("common/{}", name(h)), h.display().to_string())
            .unwrap();
    }
    gen.push_str("];\n");

    for var in ["TRIDENT_HIP_ARCHS", "TRIDENT_HIPCC", "TRIDENT_HIP_FLAGS", "TRIDENT_HIP_DEVICE_LIBS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let archs: Vec<String> = std::env::var("TRIDENT_HIP_ARCHS")
        .unwrap_or_default()
        .split([';', ',', ' '])
        .filter(|w| !w.is_empty())
        .map(hip_aot_arch)
        .collect();
    let mut compiler_line = String::new();
    // Each file and architecture twice, as for CUDA: the bf16 module into HIP_AOT_IMAGES, the fp16
    // module (-DTRIDENT_FP16) into HIP_AOT_IMAGES_FP16.
    let mut fp16 = String::from("pub static HIP_AOT_IMAGES_FP16: &[(&str, &str, &[u8])] = &[\n");
    gen.push_str("pub static HIP_AOT_IMAGES: &[(&str, &str, &[u8])] = &[\n");
    if !archs.is_empty() {
        let hipcc = std::env::var("TRIDENT_HIPCC").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| "hipcc".into());
        let flags: Vec<String> =
            std::env::var("TRIDENT_HIP_FLAGS").unwrap_or_default().split_whitespace().map(String::from).collect();
        let device_libs = std::env::var("TRIDENT_HIP_DEVICE_LIBS").ok().filter(|v| !v.is_empty());
        // hipcc picks the NVIDIA platform when an nvcc is on the PATH: the AMD one is meant here.
        let version = Command::new(&hipcc)
            .arg("--version")
            .env("HIP_PLATFORM", "amd")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .unwrap_or_else(|| {
                panic!(
                    "build.rs: TRIDENT_HIP_ARCHS={} asks for HIP kernels compiled ahead of time, but '{hipcc}' does not run; set TRIDENT_HIPCC to hipcc (or a clang++ with TRIDENT_HIP_FLAGS='-x hip --rocm-path=...'), or unset TRIDENT_HIP_ARCHS (the kernels are then compiled at run time by hipRTC)",
                    archs.join(";")
                )
            });
        compiler_line = version.lines().find(|l| l.contains("clang version")).unwrap_or("").trim().to_string();
        let aot = out_dir.join("hip-aot");
        std::fs::create_dir_all(&aot).expect("build.rs: create OUT_DIR/hip-aot");
        let mut jobs = Vec::new();
        for k in &kernels {
            for arch in &archs {
                for (module, defines, table) in [("", &[][..], &mut gen), (".fp16", &["-DTRIDENT_FP16"][..], &mut fp16)]
                {
                    let stem = name(k).trim_end_matches(".hip").trim_end_matches(".cu").to_string();
                    let co = aot.join(format!("{stem}.{arch}{module}.co"));
                    let mut cmd = Command::new(&hipcc);
                    cmd.env("HIP_PLATFORM", "amd").args(&flags);
                    if let Some(dir) = &device_libs {
                        cmd.arg(format!("--rocm-device-lib-path={dir}"));
                    }
                    cmd.arg(format!("--offload-arch={arch}"))
                        .args([
                            "-O3",
                            "-std=c++17",
                            "-mcode-object-version=4",
                            "--cuda-device-only",
                            "--no-gpu-bundle-output",
                        ])
                        .args(defines)
                        .arg("-c")
                        .args(include_paths(&root))
                        .arg("-o")
                        .arg(&co)
                        .arg(k);
                    jobs.push((cmd, format!("{hipcc} on {} for {arch}{module}", k.display())));
                    let path = co.display().to_string();
                    writeln!(table, "    ({:?}, {:?}, include_bytes!({:?})),", name(k), arch, path).unwrap();
                }
            }
        }
        compile_all(jobs);
    }
    gen.push_str("];\n");
    fp16.push_str("];\n");
    gen.push_str(&fp16);
    writeln!(gen, "pub static HIP_AOT_COMPILER: &str = {compiler_line:?};").unwrap();
    std::fs::write(out_dir.join("hip_kernel_sources.rs"), gen).expect("build.rs: write hip_kernel_sources.rs");
}

fn main() {
    let commit = output("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // --no-optional-locks: git status must not write back its refreshed index, or .git/index
    // (watched below) would change under every build and the next one would build again.
    let dirty = output("git", &["--no-optional-locks", "status", "--porcelain", "--untracked-files=no"]).is_some();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = output(&rustc, &["--version"]).unwrap_or_else(|| "rustc (unknown version)".into());
    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    println!(
        "cargo:rustc-env=TRIDENT_BUILD_INFO={commit}{} {profile} {target}, {rustc_version}",
        if dirty { "+dirty" } else { "" }
    );
    // Rebuild the info when HEAD moves; without a .git directory there is nothing to watch.
    if std::path::Path::new(".git/HEAD").exists() {
        println!("cargo:rerun-if-changed=.git/HEAD");
        println!("cargo:rerun-if-changed=.git/index");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/registry.rs");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    embed_kernels(Path::new(&out_dir));
    embed_hip_kernels(Path::new(&out_dir));
    let (cuda, _) = suite(&manifest_dir().join("kernels-cuda"), "cu", "cuh");
    let (hip, _) = suite(&manifest_dir().join("kernels-hip"), "hip", "h");
    registry::generate(&cuda, &hip, Path::new(&out_dir));
}

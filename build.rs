//! Build script: records which source and compiler a binary came from (git commit, rustc version,
//! target), so `trident --version`, `trident info` and every training log can name the build that
//! produced a result. Later it also embeds the GPU kernel sources.

use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn main() {
    let commit = output("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"]).is_some();
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
}

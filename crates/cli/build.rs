//! Link settings of the `baton` binary.
//!
//! - Relative relocations packed (`DT_RELR`, glibc 2.36 or newer): the table the dynamic
//!   loader reads at every start, all of it, shrinks from 1.2 MB to a few KB.
//! - In release builds, the symbols `crates/cli/text-order.txt` lists (the code and
//!   constants an idle server, a run and a bench touch; `scripts/text-order` writes it) are
//!   placed first and together, so that the pages of the binary a process maps are mostly
//!   pages it uses. Symbols the file names that no longer exist are skipped silently.
//!
//! Both are options of the linker Rust uses on x86-64 Linux (LLD, or GNU ld for the first);
//! on other targets nothing is added.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=text-order.txt");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os != "linux" || env != "gnu" {
        return;
    }
    println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let order = std::path::Path::new(&dir).join("text-order.txt");
    if release && order.is_file() {
        println!("cargo::rustc-link-arg-bins=-Wl,--symbol-ordering-file={}", order.display());
        println!("cargo::rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

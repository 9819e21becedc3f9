//! Link settings of the `baton` binary: relative relocations packed (`DT_RELR`, glibc 2.36
//! or newer), so the table the dynamic loader reads at every start, all of it, shrinks
//! from 1.2 MB to a few KB. An option of the linkers Rust uses on x86-64 Linux (LLD, or GNU
//! ld); on other targets nothing is added.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os != "linux" || env != "gnu" {
        return;
    }
    println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}

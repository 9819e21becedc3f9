//! Integration tests of the scenario language: one binary, one module per concern.

#![allow(clippy::unwrap_used)]

mod bundled;
mod capped;
mod dsl;
mod graph_checks;
mod load_errors;
mod malformed;
mod props;
mod registry;

use std::path::{Path, PathBuf};

/// The crate's directory (tests run with it as the working directory).
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's bundled scenarios directory.
pub fn bundled_dir() -> PathBuf {
    crate_dir().join("../../scenarios")
}

/// A fresh directory under the system temp dir, removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("baton-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.0.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create parent");
        }
        std::fs::write(&path, text).expect("write file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

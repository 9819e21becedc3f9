//! How the runs of a tree are named: a child's id derived from its parent's and its link.

use sha2::{Digest, Sha256};

/// A child's run id: derived from its parent's id and its link, so every driver, resume
/// and replay names the same child. Shaped as a UUID (version 8, name-based).
pub fn child_run_id(parent_run_id: &str, link: &str) -> String {
    let mut h = Sha256::new();
    h.update(parent_run_id.as_bytes());
    h.update(b"\0");
    h.update(link.as_bytes());
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid().to_string()
}

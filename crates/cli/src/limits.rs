//! The bounds of what the command line reads itself (the run input's bound is the
//! kernel's, `baton_engine::limits::INPUT_BYTES_MAX`; the approver's data's the
//! application layer's, `baton_app::runs::DATA_BYTES_MAX`).

/// Largest state file of `baton expr --state`, in bytes.
pub(crate) const STATE_BYTES_MAX: u64 = 1024 * 1024;

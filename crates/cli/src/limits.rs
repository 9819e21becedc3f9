//! The bounds of what the command line reads itself (the run input's bound is the
//! kernel's, `baton_engine::limits::INPUT_BYTES_MAX`).

/// Largest approver's data file (`approve --data`), in bytes.
pub(crate) const DATA_BYTES_MAX: u64 = 1024 * 1024;
/// Largest state file of `baton expr --state`, in bytes.
pub(crate) const STATE_BYTES_MAX: u64 = 1024 * 1024;

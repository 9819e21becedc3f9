//! Keeping a database and Baton's directories: `verify`, `migrate` and `backup`
//! (`verify.rs`), retention (`purge.rs`) and what no run owns (`gc.rs`).

pub mod gc;
pub mod purge;
pub mod verify;

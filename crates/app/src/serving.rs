//! What a serving process (`baton serve`, `baton mcp`, `baton worker`) is started with,
//! checked before it opens anything: its worker counts, a worker's lease and its name —
//! and this process's name (`host:pid`), which the drives it starts record.

use crate::error::Error;

/// Refuses a `--workers` count out of 1 to 1024.
pub fn check_workers(workers: usize) -> Result<(), Error> {
    if workers == 0 || workers > 1024 {
        return Err(Error::invalid(format!("--workers must be 1 to 1024, not {workers}")));
    }
    Ok(())
}

/// A worker's checked settings: its name (given, or this machine's with the process id)
/// once its concurrency (1 to 1024) and its lease (3 to 3600 s) are in range.
pub fn worker_name(
    concurrency: usize,
    lease_s: u64,
    name: Option<String>,
) -> Result<String, Error> {
    if concurrency == 0 || concurrency > 1024 {
        return Err(Error::invalid(format!("--concurrency must be 1 to 1024, not {concurrency}")));
    }
    if !(3..=3600).contains(&lease_s) {
        return Err(Error::invalid(format!("--lease-s must be 3 to 3600 seconds, not {lease_s}")));
    }
    match name {
        Some(name) if name.trim().is_empty() || name.chars().count() > 128 => {
            Err(Error::invalid("--name must be 1 to 128 characters and not blank"))
        }
        Some(name) => Ok(name),
        None => Ok(format!("baton-worker-{}-{}", crate::place::host_name(), std::process::id())),
    }
}

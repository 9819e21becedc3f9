//! Holds on the runs of a SQLite database, across processes: one file beside the database,
//! `<database>.holds`, and a hold on a run is an exclusive lock on one byte of it, at an
//! offset the run id's SHA-256 names. The locks are Linux's open-file-description locks:
//! each hold opens the file anew, so two holds on one run conflict even inside one process,
//! and the operating system lets go of a hold when its holder closes the file or dies — a
//! crashed driver never blocks the next one. A look at whether a run is held asks the
//! kernel for a conflicting lock and takes none, so it never gets in a driver's way.
//!
//! One file for every run: taking and giving up a hold create and remove nothing. (A file
//! per run did: on this machine's file system creating a file scans past every file
//! removed in the last half minute, and at a few thousand runs a second that was a quarter
//! of the process's CPU.) Two runs whose ids' hashes share 63 bits would hold each other
//! off; among the runs held at one moment that does not happen in practice.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use baton_engine::store::Error;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;
use sha2::{Digest, Sha256};

/// The holds file of one database.
#[derive(Debug, Clone)]
pub struct RunHolds {
    path: PathBuf,
}

/// A run held by this process: the hold lasts while this lives.
#[derive(Debug)]
pub struct RunHold {
    _file: File,
}

/// The whence of every lock: offsets from the start of the file.
const FROM_START: libc::c_short = libc::SEEK_SET as libc::c_short;

impl RunHolds {
    /// The holds file beside the database at `db`: `<db>.holds`.
    pub fn beside(db: &Path) -> Self {
        let mut path = db.to_path_buf().into_os_string();
        path.push(".holds");
        RunHolds { path: PathBuf::from(path) }
    }

    /// The holds file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the run's hold, or `None` when another holder has it. The file is made when
    /// absent (readable and writable by its owner only).
    pub fn take(&self, run_id: &str) -> Result<Option<RunHold>, Error> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.path)
            .map_err(|e| self.failed(run_id, "open", &e.to_string()))?;
        refuse_unless_regular(&file, &self.path)?;
        let lock = byte_lock(run_id, libc::F_WRLCK);
        match fcntl(&file, FcntlArg::F_OFD_SETLK(&lock)) {
            Ok(_) => Ok(Some(RunHold { _file: file })),
            Err(Errno::EAGAIN | Errno::EACCES) => Ok(None),
            Err(e) => Err(self.failed(run_id, "lock", e.desc())),
        }
    }

    /// Whether some holder holds the run: asked of the kernel, no lock taken. No file
    /// means no run is held.
    pub fn is_held(&self, run_id: &str) -> Result<bool, Error> {
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(self.failed(run_id, "open", &e.to_string())),
        };
        refuse_unless_regular(&file, &self.path)?;
        let mut lock = byte_lock(run_id, libc::F_WRLCK);
        fcntl(&file, FcntlArg::F_OFD_GETLK(&mut lock))
            .map_err(|e| self.failed(run_id, "look at the lock of", e.desc()))?;
        Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
    }

    /// The offset of the byte that stands for the run (for a test that holds a run from
    /// another program).
    pub fn byte_of(run_id: &str) -> i64 {
        offset(run_id)
    }

    fn failed(&self, run_id: &str, what: &str, why: &str) -> Error {
        Error::Backend(format!(
            "cannot {what} the hold on run {run_id} in {}: {why}",
            self.path.display()
        ))
    }
}

/// A lock on the one byte that stands for the run.
fn byte_lock(run_id: &str, kind: libc::c_int) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: FROM_START,
        l_start: offset(run_id),
        l_len: 1,
        l_pid: 0,
    }
}

/// Where the run's byte is: 63 bits of its id's SHA-256, short of the largest offset (the
/// byte after it must still be addressable).
fn offset(run_id: &str) -> libc::off_t {
    let digest = Sha256::digest(run_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let bits = u64::from_be_bytes(first) >> 1;
    libc::off_t::try_from(bits).unwrap_or(libc::off_t::MAX).min(libc::off_t::MAX - 1)
}

/// The holds file must be a regular file: a FIFO or device put in its place is refused.
fn refuse_unless_regular(file: &File, path: &Path) -> Result<(), Error> {
    let kind = file
        .metadata()
        .map_err(|e| Error::Backend(format!("cannot inspect {}: {e}", path.display())))?
        .file_type();
    if kind.is_file() {
        return Ok(());
    }
    Err(Error::Backend(format!(
        "{} is not a regular file; it holds the runs' holds of the database beside it: remove it and start again",
        path.display()
    )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn holds() -> (tempdir::Dir, RunHolds) {
        let dir = tempdir::Dir::new();
        let holds = RunHolds::beside(&dir.0.join("runs.db"));
        (dir, holds)
    }

    mod tempdir {
        pub(super) struct Dir(pub(super) std::path::PathBuf);
        impl Dir {
            pub(super) fn new() -> Self {
                let path = std::env::temp_dir().join(format!(
                    "baton-holds-{}-{}",
                    std::process::id(),
                    uuid::Uuid::now_v7()
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn a_hold_excludes_a_second_until_it_is_dropped() {
        let (_dir, holds) = holds();
        assert!(!holds.is_held("r1").unwrap(), "no file: nothing held");
        let first = holds.take("r1").unwrap().expect("a free run is taken");
        assert!(holds.take("r1").unwrap().is_none(), "a held run is refused, in-process too");
        assert!(holds.is_held("r1").unwrap());
        // Another run is free, and a look takes nothing.
        assert!(!holds.is_held("r2").unwrap());
        let second = holds.take("r2").unwrap().expect("another run is free");
        drop(first);
        assert!(!holds.is_held("r1").unwrap());
        assert!(holds.take("r1").unwrap().is_some());
        drop(second);
    }

    #[test]
    fn a_file_that_is_not_regular_is_refused() {
        let (dir, holds) = holds();
        std::fs::create_dir(holds.path()).unwrap();
        let e = holds.take("r1").unwrap_err().to_string();
        assert!(e.contains("runs.db.holds"), "{e}");
        drop(dir);
    }

    #[test]
    fn offsets_stay_inside_what_a_lock_can_name() {
        for id in ["", "r", "0190a1b2-dead-7e5f-8a9b-0c1d2e3f4a5b", "ü/../\n"] {
            let at = offset(id);
            assert!((0..libc::off_t::MAX).contains(&at), "{id:?} → {at}");
        }
        assert_ne!(offset("a"), offset("b"));
    }
}

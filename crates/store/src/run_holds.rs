//! Holds on the runs of a SQLite database, across processes: one file beside the database,
//! `<database>.holds`, and a hold on a run is an exclusive lock on one byte of it, at an
//! offset the run id's SHA-256 names. The locks are Linux's open-file-description locks,
//! taken through one open file per store: the operating system lets go of every hold of a
//! process when it dies — a crashed driver never blocks the next one — and another store
//! (another process, or a second store on the same database in this one) holds through an
//! open file of its own, so its locks conflict with these. Inside one store, a set of the
//! bytes it holds refuses a second hold on a held run. A look at whether a run is held asks
//! the kernel for a conflicting lock through a file of its own and takes none, so it never
//! gets in a driver's way.
//!
//! One file for every run, opened once: taking and giving up a hold is two system calls
//! and creates and removes nothing. (A file per run did: on this machine's file system
//! creating a file scans past every file removed in the last half minute, and at a few
//! thousand runs a second that was a quarter of the process's CPU.) Two runs whose ids'
//! hashes share 63 bits would hold each other off; among the runs held at one moment that
//! does not happen in practice.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use baton_engine::store::Error;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;
use sha2::{Digest, Sha256};

/// The holds file of one database, as one store uses it.
#[derive(Debug, Clone)]
pub struct RunHolds {
    path: PathBuf,
    /// The store's open file (opened at its first hold) and the bytes it holds.
    mine: Arc<Mutex<Mine>>,
}

#[derive(Debug, Default)]
struct Mine {
    file: Option<File>,
    held: HashSet<i64>,
}

/// A run held by this store: the hold lasts while this lives.
#[derive(Debug)]
pub struct RunHold {
    byte: i64,
    mine: Arc<Mutex<Mine>>,
}

impl Drop for RunHold {
    fn drop(&mut self) {
        let mut mine = lock(&self.mine);
        // Unlocked before the byte leaves the set: until then no other hold of this store
        // can take it (the same open file would not conflict with itself).
        if let Some(file) = &mine.file {
            let _ = fcntl(file, FcntlArg::F_OFD_SETLK(&byte_lock(self.byte, libc::F_UNLCK)));
        }
        mine.held.remove(&self.byte);
    }
}

fn lock(mine: &Mutex<Mine>) -> MutexGuard<'_, Mine> {
    mine.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The whence of every lock: offsets from the start of the file.
const FROM_START: libc::c_short = libc::SEEK_SET as libc::c_short;

impl RunHolds {
    /// The holds file beside the database at `db`: `<db>.holds`.
    pub fn beside(db: &Path) -> Self {
        let mut path = db.to_path_buf().into_os_string();
        path.push(".holds");
        RunHolds { path: PathBuf::from(path), mine: Arc::default() }
    }

    /// The holds file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the run's hold, or `None` when another holder has it (this store's too). The
    /// file is made when absent (readable and writable by its owner only).
    pub fn take(&self, run_id: &str) -> Result<Option<RunHold>, Error> {
        let byte = offset(run_id);
        let mut guard = lock(&self.mine);
        let mine = &mut *guard;
        if mine.held.contains(&byte) {
            return Ok(None);
        }
        let file = match mine.file {
            Some(ref file) => file,
            None => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o600)
                    .open(&self.path)
                    .map_err(|e| self.failed(run_id, "open", &e.to_string()))?;
                refuse_unless_regular(&file, &self.path)?;
                mine.file.insert(file)
            }
        };
        match fcntl(file, FcntlArg::F_OFD_SETLK(&byte_lock(byte, libc::F_WRLCK))) {
            Ok(_) => {
                mine.held.insert(byte);
                Ok(Some(RunHold { byte, mine: Arc::clone(&self.mine) }))
            }
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
        let mut asked = byte_lock(offset(run_id), libc::F_WRLCK);
        fcntl(&file, FcntlArg::F_OFD_GETLK(&mut asked))
            .map_err(|e| self.failed(run_id, "look at the lock of", e.desc()))?;
        Ok(asked.l_type != libc::F_UNLCK as libc::c_short)
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

/// A lock (or unlock) of the one byte that stands for a run.
fn byte_lock(byte: i64, kind: libc::c_int) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: FROM_START,
        l_start: byte,
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
    fn two_stores_on_one_database_hold_each_other_off() {
        let (_dir, one) = holds();
        let other = RunHolds::beside(&one.path().with_extension(""));
        assert_eq!(other.path(), one.path());
        let held = one.take("r1").unwrap().expect("a free run is taken");
        assert!(other.take("r1").unwrap().is_none(), "another open file conflicts");
        assert!(other.is_held("r1").unwrap());
        let other_held = other.take("r2").unwrap().expect("another run is free");
        assert!(one.take("r2").unwrap().is_none());
        drop(held);
        assert!(other.take("r1").unwrap().is_some(), "a dropped hold lets go");
        drop(other_held);
        assert!(one.take("r2").unwrap().is_some());
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

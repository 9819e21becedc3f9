//! Directory walks the jail needs, done through directory descriptors so that a symlink
//! swapped in by a program is never followed: handing a workspace over to the jail's uid
//! (when Baton is root), and counting what a program added.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::process::{Gid, Uid};

/// How deep a walk goes.
const DEPTH_MAX: usize = 256;

/// What a set of directories holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Files, directories and links below the roots (the roots not counted).
    pub entries: u64,
    /// Disk blocks they take, in bytes.
    pub bytes: u64,
    /// Directories that could not be counted: unreadable, or deeper than the walk goes.
    pub unseen: u64,
}

fn open_dir(at: impl AsFd, name: &std::ffi::CStr) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(at, name, flags, Mode::empty())
}

fn open_root(root: &Path) -> Result<(OwnedFd, Stat), String> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::open(root, flags, Mode::empty())
        .map_err(|e| format!("cannot open {}: {e}", root.display()))?;
    let stat =
        rustix::fs::fstat(&fd).map_err(|e| format!("cannot stat {}: {e}", root.display()))?;
    Ok((fd, stat))
}

/// The (device, inode) of each path that exists, to skip in walks.
fn identities(paths: &[PathBuf]) -> Vec<(u64, u64)> {
    paths.iter().filter_map(|p| rustix::fs::stat(p).ok()).map(|s| (s.st_dev, s.st_ino)).collect()
}

/// What a walk saw.
#[derive(Clone, Copy, Debug, Default)]
struct Walked {
    seen: u64,
    unseen: u64,
}

/// Walks below `root` (not crossing into other filesystems, not into `skip`), calling
/// `visit` with each entry's directory, name and status; stops after `max` entries. A
/// directory waiting to be read holds no descriptor of its own (only its parent's), so a
/// wide tree cannot exhaust Baton's descriptors.
fn walk(
    root: &Path,
    skip: &[(u64, u64)],
    max: u64,
    visit: &mut dyn FnMut(&OwnedFd, &std::ffi::CStr, &Stat) -> Result<(), String>,
) -> Result<Walked, String> {
    let (fd, stat) = open_root(root)?;
    let device = stat.st_dev;
    let mut walked = Walked::default();
    // Directories to read: their parent's descriptor, their name, their depth.
    let mut pending: Vec<(Rc<OwnedFd>, Option<CString>, usize)> = vec![(Rc::new(fd), None, 0)];
    while let Some((parent, name, depth)) = pending.pop() {
        let dir = match name {
            None => parent,
            Some(name) => match open_dir(&*parent, name.as_c_str()) {
                Ok(fd) => Rc::new(fd),
                Err(_) => {
                    walked.unseen += 1;
                    continue;
                }
            },
        };
        let Ok(entries) = rustix::fs::Dir::read_from(&*dir) else {
            walked.unseen += 1;
            continue;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                walked.unseen += 1;
                break;
            };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let Ok(stat) = rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            walked.seen += 1;
            if walked.seen > max {
                return Ok(walked);
            }
            visit(&dir, name, &stat)?;
            let is_dir = FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
            if is_dir && stat.st_dev == device && !skip.contains(&(stat.st_dev, stat.st_ino)) {
                if depth >= DEPTH_MAX {
                    walked.unseen += 1;
                } else {
                    pending.push((Rc::clone(&dir), Some(name.to_owned()), depth + 1));
                }
            }
        }
    }
    Ok(walked)
}

/// What `roots` hold below them, counting at most `max` entries.
pub fn usage(roots: &[PathBuf], skip: &[PathBuf], max: u64) -> Usage {
    let skip = identities(skip);
    let mut usage = Usage::default();
    for root in roots {
        let mut bytes = 0u64;
        let walked = walk(root, &skip, max, &mut |_, _, stat| {
            bytes = bytes.saturating_add(u64::try_from(stat.st_blocks).unwrap_or(0) * 512);
            Ok(())
        });
        match walked {
            Ok(walked) => {
                usage.entries += walked.seen;
                usage.unseen += walked.unseen;
            }
            Err(_) => usage.unseen += 1,
        }
        usage.bytes += bytes;
    }
    usage
}

/// Makes `uid`:`gid` own the workspace and everything below it (except `hidden` and
/// files with more than one hard link, which may be someone else's), so that a program
/// running as that uid can write it. At most `max` entries.
pub fn hand_over(
    root: &Path,
    uid: u32,
    gid: u32,
    hidden: &[PathBuf],
    max: u64,
) -> Result<(), String> {
    let root = root.canonicalize().map_err(|e| format!("{}: {e}", root.display()))?;
    let (fd, stat) = open_root(&root)?;
    let (owner, group) = (Uid::from_raw(uid), Gid::from_raw(gid));
    let give = |e: rustix::io::Errno| {
        format!("cannot hand the workspace {} to the jail's uid {uid}: {e}", root.display())
    };
    if stat.st_uid != uid || stat.st_gid != gid {
        rustix::fs::fchown(&fd, Some(owner), Some(group)).map_err(give)?;
    }
    let skip = identities(hidden);
    let walked = walk(&root, &skip, max, &mut |dir, name, stat| {
        let kind = FileType::from_raw_mode(stat.st_mode);
        let linked = kind == FileType::RegularFile && stat.st_nlink > 1;
        if (stat.st_uid == uid && stat.st_gid == gid)
            || linked
            || skip.contains(&(stat.st_dev, stat.st_ino))
        {
            return Ok(());
        }
        rustix::fs::chownat(dir, name, Some(owner), Some(group), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(give)
    })?;
    if walked.seen > max {
        return Err(format!(
            "the workspace {} holds more than {max} files; the jail hands over at most that many",
            root.display()
        ));
    }
    Ok(())
}

/// A new private directory under `scratch` (mode 0700, owned by `run_as` when given),
/// with a `home` inside: one program's `/tmp`.
pub(crate) fn private_dir(scratch: &Path, run_as: Option<(u32, u32)>) -> Result<PathBuf, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = scratch.join(format!("tmp-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let make = |path: &Path, mode: u32| -> Result<(), String> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .mode(mode)
            .create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give {} to uid {uid}: {e}", path.display()))?;
        }
        Ok(())
    };
    make(&dir, 0o700)?;
    make(&dir.join("home"), 0o700)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_entries_and_stops_at_the_bound_without_following_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("a/b")).expect("dirs");
        std::fs::write(root.join("a/b/f"), vec![b'x'; 10_000]).expect("file");
        std::os::unix::fs::symlink("/usr", root.join("usr")).expect("link");
        let all = usage(std::slice::from_ref(&root), &[], u64::MAX);
        assert_eq!(all.entries, 4, "a, a/b, a/b/f and the link; /usr is not followed");
        assert!(all.bytes >= 10_000);
        assert_eq!(usage(std::slice::from_ref(&root), &[], 2).entries, 3, "stops past the bound");
        let skipped = usage(std::slice::from_ref(&root), &[root.join("a")], u64::MAX);
        assert_eq!(skipped.entries, 2, "a is counted, not what is below it");
        assert_eq!(all.unseen, 0);
        // Deeper than the walk goes: not counted, and said.
        let mut deep = root.clone();
        for _ in 0..=DEPTH_MAX {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).expect("deep");
        assert!(usage(std::slice::from_ref(&root), &[], u64::MAX).unseen > 0);
    }
}

//! Reading a file a user named, bounded: the one way Baton reads scenario files, prompts,
//! scripts, configurations, cassettes, inputs and state files.
//!
//! A size check on the metadata is not a bound (a file can grow after it, `/proc` files
//! report no size), so the bytes themselves are read through `Read::take` and one byte past
//! the cap means "too large". Only regular files are read: a named pipe would block the
//! open until a writer appears, and a device such as `/dev/zero` never ends. The path's
//! metadata (symlinks followed) is checked before opening, and the opened file's metadata
//! again, so a path swapped between the two is still caught once it is open. What is not
//! caught is a path swapped for a pipe in the instant between the first check and the
//! open: refusing that needs `O_NONBLOCK`, which safe Rust does not spell portably.

use std::fs::{File, Metadata};
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing is at the path.
    #[error("{} does not exist", path.display())]
    Missing { path: PathBuf },
    /// The path names something that is not a regular file.
    #[error(
        "{} is a {kind}, not a regular file; give a regular file (Baton never reads pipes, devices, sockets or directories)",
        path.display()
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    /// The file holds more than the cap.
    #[error("{} is larger than {}; make it smaller", path.display(), size(*bytes_max))]
    TooLarge { path: PathBuf, bytes_max: u64 },
    /// The file is not UTF-8 where text was asked for.
    #[error("{} is not UTF-8 (invalid byte at offset {offset}); save it as UTF-8", path.display())]
    NotUtf8 { path: PathBuf, offset: usize, bytes: Vec<u8> },
    /// The operating system refused to open or read it.
    #[error("cannot read {}: {reason}", path.display())]
    Io { path: PathBuf, reason: io::Error },
}

/// Reads at most `bytes_max` bytes of the regular file at `path`; a longer file, or one
/// that is not a regular file, is refused without reading more than `bytes_max + 1` bytes.
pub fn read_bytes(path: &Path, bytes_max: u64) -> Result<Vec<u8>, Error> {
    let failed = |reason: io::Error| io_error(path, reason);
    // Checked before opening: opening a named pipe waits for a writer.
    check_regular(path)?;
    let file = File::open(path).map_err(failed)?;
    let opened = file.metadata().map_err(failed)?;
    refuse_special(path, &opened)?;
    let too_large = || Error::TooLarge { path: path.to_path_buf(), bytes_max };
    if opened.len() > bytes_max {
        return Err(too_large());
    }
    let expected = usize::try_from(opened.len()).unwrap_or(0);
    let mut bytes = Vec::with_capacity(expected);
    file.take(bytes_max.saturating_add(1)).read_to_end(&mut bytes).map_err(failed)?;
    if bytes.len() as u64 > bytes_max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Reads a regular file of at most `bytes_max` bytes as UTF-8 text.
pub fn read_text(path: &Path, bytes_max: u64) -> Result<String, Error> {
    let bytes = read_bytes(path, bytes_max)?;
    String::from_utf8(bytes).map_err(|e| Error::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
        bytes: e.into_bytes(),
    })
}

/// A byte count as people read a limit: `1 MiB`, `256 KiB`, `100 bytes`.
pub fn size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// Checks, without opening it, that `path` (symlinks followed) is a regular file.
pub fn check_regular(path: &Path) -> Result<(), Error> {
    let metadata = std::fs::metadata(path).map_err(|reason| io_error(path, reason))?;
    refuse_special(path, &metadata)
}

fn io_error(path: &Path, reason: io::Error) -> Error {
    if reason.kind() == io::ErrorKind::NotFound {
        Error::Missing { path: path.to_path_buf() }
    } else {
        Error::Io { path: path.to_path_buf(), reason }
    }
}

fn refuse_special(path: &Path, metadata: &Metadata) -> Result<(), Error> {
    if metadata.is_file() {
        return Ok(());
    }
    Err(Error::NotRegular { path: path.to_path_buf(), kind: kind(metadata) })
}

/// What a path that is not a regular file is, in words.
fn kind(metadata: &Metadata) -> &'static str {
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        return "directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if file_type.is_fifo() {
            return "named pipe (FIFO)";
        }
        if file_type.is_socket() {
            return "socket";
        }
        if file_type.is_char_device() {
            return "character device";
        }
        if file_type.is_block_device() {
            return "block device";
        }
    }
    "special file"
}

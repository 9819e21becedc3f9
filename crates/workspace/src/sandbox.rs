//! The file tools (`read_file`, `write_file`, `edit_file`, `list_dir`, `delete_file`),
//! run inside one workspace directory.
//!
//! Every filesystem access goes through a [`cap_std::fs::Dir`] opened on the workspace
//! root, so `..`, absolute paths and symbolic links that lead outside are refused by
//! cap-std when the path is resolved — also when a path is swapped for such a link
//! between a check and its use. Before any of that, [`check_path`] refuses paths that are
//! never right (empty, absolute, with `..`, a NUL byte, too long, too deep, or inside
//! `.git` or `.baton`), so most mistakes are caught without touching the disk.
//!
//! Outcome texts are deterministic — no absolute paths, no timestamps — because they are
//! hashed into recorded requests. Error outcomes quote the path as the model gave it.

use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use baton_engine::workspace::ToolOutcome;
use cap_std::fs::{Dir, File, FileType, Metadata, OpenOptions, Permissions};
use serde_json::{Map, Value};

use crate::repo::{EXCLUDED_DIRS, EXCLUDED_FILES};

/// The most bytes `read_file` returns, and the largest file it reads without a line
/// range.
pub const READ_BYTES_MAX: usize = 256 * 1024;

/// The largest file `write_file` and `edit_file` write.
pub const WRITE_BYTES_MAX: usize = 1024 * 1024;

/// The most entries `list_dir` shows.
pub const LIST_ENTRIES_MAX: usize = 500;

/// The longest path a tool accepts, in bytes.
pub const PATH_BYTES_MAX: usize = 4096;

/// The most components a path may have.
pub const PATH_COMPONENTS_MAX: usize = 64;

/// The tools [`execute`] runs, in the order models see them.
pub const TOOLS: [&str; 5] = ["read_file", "write_file", "edit_file", "list_dir", "delete_file"];

/// Directory names the file tools never enter: the workspace's own git repository and
/// Baton's managed one.
const HIDDEN: [&str; 2] = [".git", ".baton"];

/// The most symbolic links followed when checking where a path leads.
const SYMLINK_HOPS_MAX: usize = 40;

/// The longest quotation of a path in an outcome, in characters.
const SHOWN_CHARS_MAX: usize = 120;

/// Runs one file tool in the workspace opened as `root`. Never fails: every refusal and
/// I/O error is an error outcome.
pub(crate) fn execute(
    root: &Dir,
    tool: &str,
    arguments: &Value,
    touched: &mut BTreeSet<String>,
    max_touched: usize,
) -> ToolOutcome {
    let result = match tool {
        "read_file" => read_file(root, arguments),
        "write_file" => write_file(root, arguments, touched, max_touched),
        "edit_file" => edit_file(root, arguments, touched, max_touched),
        "list_dir" => list_dir(root, arguments),
        "delete_file" => delete_file(root, arguments, touched, max_touched),
        other => {
            Err(format!("unknown tool {}; the file tools are {}", shown(other), TOOLS.join(", ")))
        }
    };
    result.unwrap_or_else(ToolOutcome::error)
}

// ---------------------------------------------------------------------------------------
// Paths

/// A path that passed [`check_path`]: relative to the workspace root, `/`-separated,
/// without `.` components. The root itself is the empty path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RelPath {
    normalized: String,
}

impl RelPath {
    /// Whether this is the workspace root.
    fn is_root(&self) -> bool {
        self.normalized.is_empty()
    }

    /// The path as cap-std and `touched` take it (`.` for the root).
    pub(crate) fn as_str(&self) -> &str {
        if self.is_root() { "." } else { &self.normalized }
    }

    /// The directory holding this path (`.` at the top level) and the last component.
    fn split(&self) -> (&str, &str) {
        match self.normalized.rsplit_once('/') {
            Some((parent, name)) => (parent, name),
            None => (".", &self.normalized),
        }
    }
}

/// Checks a path a model gave, before anything touches the disk; returns it normalized
/// or a message saying why it is refused.
pub(crate) fn check_path(given: &str) -> Result<RelPath, String> {
    let quoted = shown(given);
    if given.is_empty() {
        return Err("the path is empty; give a path relative to the workspace root, such as \
             \"src/main.rs\" (\".\" is the root)"
            .to_owned());
    }
    if given.contains('\0') {
        return Err(format!("path {quoted} contains a NUL byte; remove it"));
    }
    if given.len() > PATH_BYTES_MAX {
        return Err(format!(
            "path {quoted} is {} bytes long; paths are limited to {PATH_BYTES_MAX} bytes",
            given.len()
        ));
    }
    if given.contains('\\') {
        return Err(format!("path {quoted} contains a backslash; separate directories with /"));
    }
    if given.starts_with('/') || is_drive_prefixed(given) {
        return Err(format!(
            "path {quoted} is absolute; give a path relative to the workspace root, such as \
             \"src/main.rs\""
        ));
    }
    let components: Vec<&str> = given.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if components.len() > PATH_COMPONENTS_MAX {
        return Err(format!(
            "path {quoted} has {} components; paths are limited to {PATH_COMPONENTS_MAX}",
            components.len()
        ));
    }
    if components.contains(&"..") {
        return Err(format!(
            "path {quoted} contains \"..\"; paths may not leave the workspace, so give a path \
             relative to the workspace root without \"..\""
        ));
    }
    if let Some(hidden) = components.iter().find(|c| is_hidden(c)) {
        return Err(format!(
            "path {quoted} is inside {hidden}; the file tools may not read or change .git (a \
             repository's internals) or .baton (Baton's own files)"
        ));
    }
    Ok(RelPath { normalized: components.join("/") })
}

/// Checks where a path leads once the symbolic links inside the workspace are followed:
/// a path that resolves into `.git` or `.baton` is refused however it is spelled (a link
/// `b -> .baton` makes `b/git/config` such a path), and so is a write (`writes`) into
/// what snapshots leave out (build output and caches such as `target/`; see
/// [`crate::repo::EXCLUDED_DIRS`]), so that everything the file tools write is snapshotted
/// and restored. Links that leave the workspace are left to the cap-std handle, which
/// refuses them.
pub(crate) fn check_resolved(
    root: &Dir,
    path: &RelPath,
    quoted: &str,
    writes: bool,
) -> Result<(), String> {
    let mut pending: Vec<String> =
        path.as_str().split('/').filter(|c| !c.is_empty()).rev().map(str::to_owned).collect();
    let mut resolved: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(component) = pending.pop() {
        match component.as_str() {
            "" | "." => continue,
            ".." => {
                if resolved.pop().is_none() {
                    // It leaves the workspace: the handle refuses it when it is used.
                    return Ok(());
                }
                continue;
            }
            _ => {}
        }
        if is_hidden(&component) {
            return Err(format!(
                "path {quoted} leads into {component} through a symbolic link; the file tools \
                 may not read or change .git (a repository's internals) or .baton (Baton's \
                 own files)"
            ));
        }
        resolved.push(component);
        let joined = resolved.join("/");
        let Ok(metadata) = root.symlink_metadata(&joined) else {
            // Nothing there yet: what follows cannot be a link, so its names are final.
            resolved.extend(pending.drain(..).rev());
            break;
        };
        if !metadata.file_type().is_symlink() {
            continue;
        }
        hops += 1;
        if hops > SYMLINK_HOPS_MAX {
            return Err(format!(
                "path {quoted} goes through more than {SYMLINK_HOPS_MAX} symbolic links; give \
                 the path without them"
            ));
        }
        // The handle refuses to read a link that leads outside, and refuses it again when
        // the tool uses the path: nothing inside the workspace is reached through it.
        let Ok(target) = root.read_link(&joined) else {
            return Ok(());
        };
        if target.is_absolute() {
            return Ok(());
        }
        resolved.pop();
        let target = target.to_string_lossy().into_owned();
        pending.extend(target.split('/').rev().map(str::to_owned));
    }
    if let Some(hidden) = resolved.iter().find(|c| is_hidden(c)) {
        return Err(format!(
            "path {quoted} leads into {hidden}; the file tools may not read or change .git (a \
             repository's internals) or .baton (Baton's own files)"
        ));
    }
    if writes {
        let excluded_dir = resolved.iter().find(|c| EXCLUDED_DIRS.contains(&c.as_str()));
        let excluded_file = resolved.last().filter(|name| {
            EXCLUDED_FILES.iter().any(|pattern| {
                pattern.strip_prefix('*').is_some_and(|suffix| name.ends_with(suffix))
            })
        });
        if let Some(name) = excluded_dir.or(excluded_file) {
            return Err(format!(
                "path {quoted} is in {name}, build output or a cache that snapshots leave out; \
                 the file tools write source files only (let the build create {name})"
            ));
        }
    }
    Ok(())
}

/// `C:`-style paths: absolute (or drive-relative) on Windows, never meant on Unix.
fn is_drive_prefixed(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

/// Whether a name is one the file tools never show or enter (case-insensitively, for
/// filesystems that ignore case).
fn is_hidden(name: &str) -> bool {
    HIDDEN.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// A path as quoted in an outcome: in double quotes with escapes, and shortened when long.
fn shown(path: &str) -> String {
    if path.chars().count() <= SHOWN_CHARS_MAX {
        format!("{path:?}")
    } else {
        let head: String = path.chars().take(SHOWN_CHARS_MAX).collect();
        format!("{head:?}…")
    }
}

// ---------------------------------------------------------------------------------------
// Arguments

/// A tool's JSON arguments, checked against the names the tool takes.
struct Args<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    /// Checks that `value` is an object whose keys are all in `accepted`.
    fn new(tool: &str, value: &'a Value, accepted: &[&str]) -> Result<Self, String> {
        let Some(map) = value.as_object() else {
            return Err(format!(
                "the arguments of {tool} must be a JSON object with {}, not {}",
                accepted.join(", "),
                json_type(value)
            ));
        };
        let mut unknown: Vec<&str> =
            map.keys().map(String::as_str).filter(|k| !accepted.contains(k)).collect();
        unknown.sort_unstable();
        if let Some(first) = unknown.first() {
            return Err(format!(
                "{tool} has no argument {}; it takes {}",
                shown(first),
                accepted.join(", ")
            ));
        }
        Ok(Args { map })
    }

    /// A string argument that must be present.
    fn string(&self, name: &str) -> Result<&'a str, String> {
        match self.map.get(name) {
            None | Some(Value::Null) => Err(format!("missing argument {name} (a string)")),
            Some(Value::String(s)) => Ok(s),
            Some(other) => {
                Err(format!("argument {name} must be a string, not {}", json_type(other)))
            }
        }
    }

    /// A string argument that may be left out (or null).
    fn optional_string(&self, name: &str) -> Result<Option<&'a str>, String> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.string(name).map(Some),
        }
    }

    /// A 1-based line number that may be left out (or null).
    fn optional_line(&self, name: &str) -> Result<Option<u64>, String> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(line) if line >= 1 => Ok(Some(line)),
                _ => Err(format!(
                    "argument {name} must be a positive integer (lines count from 1), not {n}"
                )),
            },
            Some(other) => Err(format!(
                "argument {name} must be a positive integer (lines count from 1), not {}",
                json_type(other)
            )),
        }
    }
}

/// The JSON type of a value, as error messages name it.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

// ---------------------------------------------------------------------------------------
// Filesystem helpers

/// A message for an I/O error on `quoted` while trying to `action` it.
fn io_failure(action: &str, quoted: &str, err: &io::Error) -> String {
    match err.kind() {
        io::ErrorKind::NotFound => {
            format!("{quoted} does not exist; use list_dir to see which files there are")
        }
        // cap-std reports an escape as a permission error of its own, with no OS code.
        io::ErrorKind::PermissionDenied if err.raw_os_error().is_none() => format!(
            "cannot {action} {quoted}: it leads outside the workspace (through a symbolic \
             link); the file tools only work inside the workspace"
        ),
        io::ErrorKind::PermissionDenied => format!("cannot {action} {quoted}: permission denied"),
        io::ErrorKind::NotADirectory => format!(
            "cannot {action} {quoted}: part of the path is a file, not a directory; use \
             list_dir to see which files there are"
        ),
        _ => format!("cannot {action} {quoted}: {err}"),
    }
}

/// Refuses anything but a regular file, naming what it is instead.
fn require_regular(file_type: FileType, quoted: &str, tool: &str) -> Result<(), String> {
    if file_type.is_file() {
        return Ok(());
    }
    if file_type.is_dir() {
        return Err(format!(
            "{quoted} is a directory; {tool} works on files (use list_dir to see what is in it)"
        ));
    }
    Err(format!(
        "{quoted} is {}, not a regular file; {tool} works on regular files only",
        special_kind(file_type)
    ))
}

/// What a file that is neither regular nor a directory is.
fn special_kind(file_type: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use cap_std::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a named pipe";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return "a device";
        }
    }
    if file_type.is_symlink() {
        return "a symbolic link";
    }
    "a special file"
}

/// Options for opening a file to read it. On Unix the open does not block, so a path
/// swapped for a named pipe after its check cannot hang the tool.
fn read_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use cap_std::fs::OpenOptionsExt;
        if O_NONBLOCK != 0 {
            options.custom_flags(O_NONBLOCK);
        }
    }
    options
}

/// `O_NONBLOCK` where this crate knows its value, 0 elsewhere (the metadata check before
/// opening still refuses a pipe that is there when the tool starts). cap-std panics on
/// flags it does not know, so an unlisted target gets none rather than a guess.
#[cfg(unix)]
const O_NONBLOCK: i32 = if cfg!(any(
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd",
    target_os = "openbsd",
    target_os = "netbsd"
)) {
    0x0004
} else if cfg!(all(
    any(target_os = "linux", target_os = "android"),
    any(
        target_arch = "x86",
        target_arch = "x86_64",
        target_arch = "arm",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "powerpc64",
        target_arch = "s390x"
    )
)) {
    0o4000
} else {
    0
};

/// Opens `path` (relative to `base`) for reading, if it is a regular file: checked before
/// opening (so a pipe is never opened) and again on the opened handle.
fn open_regular(
    base: &Dir,
    path: &str,
    quoted: &str,
    tool: &str,
) -> Result<(File, Metadata), String> {
    let before = base.metadata(path).map_err(|e| io_failure("read", quoted, &e))?;
    require_regular(before.file_type(), quoted, tool)?;
    let file = base.open_with(path, &read_options()).map_err(|e| io_failure("read", quoted, &e))?;
    let metadata = file.metadata().map_err(|e| io_failure("read", quoted, &e))?;
    require_regular(metadata.file_type(), quoted, tool)?;
    Ok((file, metadata))
}

/// Opens the directory a write goes into.
fn open_parent(root: &Dir, parent: &str, quoted: &str) -> Result<Dir, String> {
    root.open_dir(parent).map_err(|e| io_failure("open the directory of", quoted, &e))
}

/// Opens the directory a new file goes into, creating it (and its parents) if missing.
fn open_or_create_parent(root: &Dir, parent: &str, quoted: &str) -> Result<Dir, String> {
    match root.open_dir(parent) {
        Ok(dir) => return Ok(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_failure("open the directory of", quoted, &e)),
    }
    if let Err(e) = root.create_dir_all(parent) {
        // A link in the way makes cap-std report "exists"; opening says why.
        return Err(match root.open_dir(parent) {
            Err(open) if open.kind() != io::ErrorKind::NotFound => {
                io_failure("open the directory of", quoted, &open)
            }
            _ => io_failure("create the directories of", quoted, &e),
        });
    }
    open_parent(root, parent, quoted)
}

/// What is at `name` in `parent` now, without following a symbolic link there.
fn existing(parent: &Dir, name: &str, quoted: &str) -> Result<Option<Metadata>, String> {
    match parent.symlink_metadata(name) {
        Ok(metadata) => Ok(Some(metadata)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_failure("inspect", quoted, &e)),
    }
}

/// Refuses to write over anything but a regular file (a symbolic link included: writing
/// would replace the link, not the file it names).
fn require_writable(metadata: &Metadata, quoted: &str, tool: &str) -> Result<(), String> {
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        return Err(format!(
            "{quoted} is a symbolic link; {tool} only changes regular files, so use the path \
             of the file it points to"
        ));
    }
    require_regular(file_type, quoted, tool)
}

/// Numbers the temporary files of this process's writes.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces (or creates) `name` in `parent` with `content` atomically: writes a new file
/// next to it, then renames it over the target. `permissions` are the replaced file's.
fn replace_atomically(
    parent: &Dir,
    name: &str,
    content: &[u8],
    permissions: Option<Permissions>,
    quoted: &str,
) -> Result<(), String> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    let mut attempt = 0;
    let (temp_name, mut file) = loop {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp_name = format!(".baton-tmp-{}-{n}", std::process::id());
        match parent.open_with(&temp_name, &options) {
            Ok(file) => break (temp_name, file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
            Err(e) => return Err(io_failure("write", quoted, &e)),
        }
    };
    let written = (|| {
        file.write_all(content)?;
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)?;
        }
        drop(file);
        parent.rename(&temp_name, parent, name)
    })();
    if let Err(e) = written {
        // Best effort: the temporary file is ours and useless now.
        let _ = parent.remove_file(&temp_name);
        return Err(io_failure("write", quoted, &e));
    }
    Ok(())
}

/// Refuses a write that would make `touched` larger than `max_touched`.
fn check_touch(
    path: &RelPath,
    touched: &BTreeSet<String>,
    max_touched: usize,
    quoted: &str,
) -> Result<(), String> {
    if touched.contains(path.as_str()) || touched.len() < max_touched {
        return Ok(());
    }
    Err(format!(
        "cannot change {quoted}: this level has already changed {} files, the per-level limit \
         of {max_touched}; finish with the files changed so far or change those files only",
        touched.len()
    ))
}

/// Refuses the workspace root where a file is needed.
fn require_not_root(path: &RelPath, quoted: &str, tool: &str) -> Result<(), String> {
    if path.is_root() {
        return Err(format!("{quoted} is the workspace root, a directory; {tool} works on files"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Tools

/// `read_file {path, start_line?, end_line?}`.
fn read_file(root: &Dir, arguments: &Value) -> Result<ToolOutcome, String> {
    let args = Args::new("read_file", arguments, &["path", "start_line", "end_line"])?;
    let given = args.string("path")?;
    let start = args.optional_line("start_line")?;
    let end = args.optional_line("end_line")?;
    let path = check_path(given)?;
    let quoted = shown(given);
    check_resolved(root, &path, &quoted, false)?;
    require_not_root(&path, &quoted, "read_file")?;
    if let (Some(start), Some(end)) = (start, end)
        && end < start
    {
        return Err(format!(
            "end_line {end} is before start_line {start}; give end_line >= start_line"
        ));
    }
    let ranged = start.is_some() || end.is_some();
    let (file, metadata) = open_regular(root, path.as_str(), &quoted, "read_file")?;
    if !ranged && metadata.len() > READ_BYTES_MAX as u64 {
        return Err(format!(
            "{quoted} is {} bytes, over read_file's limit of {READ_BYTES_MAX} bytes; read part \
             of it with start_line and end_line",
            metadata.len()
        ));
    }
    let start = start.unwrap_or(1);
    let end = end.unwrap_or(u64::MAX);
    let selection = select_lines(BufReader::new(file), start, end, READ_BYTES_MAX)
        .map_err(|e| io_failure("read", &quoted, &e))?;
    let mut bytes = selection.text;
    if selection.truncated_at.is_some() {
        // The cap may have cut a character in two: drop its first bytes.
        if let Err(e) = std::str::from_utf8(&bytes)
            && e.error_len().is_none()
        {
            bytes.truncate(e.valid_up_to());
        }
    }
    let Ok(mut text) = String::from_utf8(bytes) else {
        return Err(format!(
            "{quoted} is not UTF-8 text (it looks binary); read_file reads text files only"
        ));
    };
    if let Some(total) = selection.total_lines
        && start > total.max(1)
    {
        return Err(format!(
            "start_line {start} is past the end of {quoted}, which has {total} lines"
        ));
    }
    if text.is_empty() && selection.total_lines == Some(0) {
        return Ok(ToolOutcome::ok(format!("({} is empty)", path.as_str())));
    }
    if let Some(line) = selection.truncated_at {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!(
            "[… truncated: read_file returns at most {READ_BYTES_MAX} bytes; continue with \
             start_line {line}]"
        ));
    }
    Ok(ToolOutcome::ok(text))
}

/// The lines `read_file` selected.
#[derive(Debug)]
struct Selection {
    /// The selected lines' bytes, with their line endings, at most the cap.
    text: Vec<u8>,
    /// The line the cap cut, when it cut one.
    truncated_at: Option<u64>,
    /// How many lines the file has, when the scan reached its end.
    total_lines: Option<u64>,
}

/// Scans `reader` for lines `start..=end` (1-based), keeping at most `cap` bytes of them.
/// Memory stays bounded by the cap whatever the file's size or line lengths.
fn select_lines(
    mut reader: impl BufRead,
    start: u64,
    end: u64,
    cap: usize,
) -> io::Result<Selection> {
    let mut text = Vec::new();
    let mut line: u64 = 1;
    // Whether bytes of the current line have been seen (a last line without a newline).
    let mut partial = false;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            let total = line - 1 + u64::from(partial);
            return Ok(Selection { text, truncated_at: None, total_lines: Some(total) });
        }
        let mut pos = 0;
        while pos < buffer.len() {
            if line > end {
                return Ok(Selection { text, truncated_at: None, total_lines: None });
            }
            let rest = &buffer[pos..];
            let newline = rest.iter().position(|&b| b == b'\n');
            let segment = match newline {
                Some(i) => &rest[..=i],
                None => rest,
            };
            if line >= start {
                let room = cap - text.len();
                if segment.len() > room {
                    text.extend_from_slice(&segment[..room]);
                    return Ok(Selection { text, truncated_at: Some(line), total_lines: None });
                }
                text.extend_from_slice(segment);
            }
            pos += segment.len();
            if newline.is_some() {
                line += 1;
                partial = false;
            } else {
                partial = true;
            }
        }
        let consumed = buffer.len();
        reader.consume(consumed);
    }
}

/// `write_file {path, content}`.
fn write_file(
    root: &Dir,
    arguments: &Value,
    touched: &mut BTreeSet<String>,
    max_touched: usize,
) -> Result<ToolOutcome, String> {
    let args = Args::new("write_file", arguments, &["path", "content"])?;
    let given = args.string("path")?;
    let content = args.string("content")?;
    let path = check_path(given)?;
    let quoted = shown(given);
    check_resolved(root, &path, &quoted, true)?;
    require_not_root(&path, &quoted, "write_file")?;
    if content.len() > WRITE_BYTES_MAX {
        return Err(format!(
            "the content for {quoted} is {} bytes, over write_file's limit of {WRITE_BYTES_MAX} \
             bytes; write a smaller file",
            content.len()
        ));
    }
    check_touch(&path, touched, max_touched, &quoted)?;
    let (parent_path, name) = path.split();
    let parent = open_or_create_parent(root, parent_path, &quoted)?;
    let before = existing(&parent, name, &quoted)?;
    if let Some(metadata) = &before {
        require_writable(metadata, &quoted, "write_file")?;
    }
    let permissions = before.as_ref().map(Metadata::permissions);
    replace_atomically(&parent, name, content.as_bytes(), permissions, &quoted)?;
    let normalized = path.as_str().to_owned();
    touched.insert(normalized.clone());
    if before.is_some() {
        Ok(ToolOutcome::ok(format!("wrote {} bytes to {normalized}", content.len())))
    } else {
        Ok(ToolOutcome {
            content: format!("created {normalized} ({} bytes)", content.len()),
            is_error: false,
            created: Some(normalized),
        })
    }
}

/// `edit_file {path, old_string, new_string}`.
fn edit_file(
    root: &Dir,
    arguments: &Value,
    touched: &mut BTreeSet<String>,
    max_touched: usize,
) -> Result<ToolOutcome, String> {
    let args = Args::new("edit_file", arguments, &["path", "old_string", "new_string"])?;
    let given = args.string("path")?;
    let old = args.string("old_string")?;
    let new = args.string("new_string")?;
    let path = check_path(given)?;
    let quoted = shown(given);
    check_resolved(root, &path, &quoted, true)?;
    require_not_root(&path, &quoted, "edit_file")?;
    if old.is_empty() {
        return Err("old_string is empty; copy the exact text to replace from the file (to \
                    replace a whole file use write_file)"
            .to_owned());
    }
    if old == new {
        return Err(format!(
            "old_string and new_string are the same, so editing {quoted} would change nothing"
        ));
    }
    check_touch(&path, touched, max_touched, &quoted)?;
    let (parent_path, name) = path.split();
    let parent = open_parent(root, parent_path, &quoted)?;
    let Some(before) = existing(&parent, name, &quoted)? else {
        return Err(format!(
            "{quoted} does not exist; use list_dir to see which files there are (write_file \
             creates files)"
        ));
    };
    require_writable(&before, &quoted, "edit_file")?;
    let (file, metadata) = open_regular(&parent, name, &quoted, "edit_file")?;
    if metadata.len() > WRITE_BYTES_MAX as u64 {
        return Err(format!(
            "{quoted} is {} bytes, over edit_file's limit of {WRITE_BYTES_MAX} bytes",
            metadata.len()
        ));
    }
    let mut bytes = Vec::new();
    file.take(WRITE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_failure("read", &quoted, &e))?;
    if bytes.len() > WRITE_BYTES_MAX {
        return Err(format!("{quoted} is over edit_file's limit of {WRITE_BYTES_MAX} bytes"));
    }
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(format!(
            "{quoted} is not UTF-8 text (it looks binary); edit_file edits text files only"
        ));
    };
    let (first, count) = occurrences(&text, old);
    let Some(at) = first else {
        return Err(format!(
            "old_string was not found in {quoted}; read the file and copy the exact text"
        ));
    };
    if count > 1 {
        return Err(format!(
            "old_string occurs {count} times in {quoted}; include more surrounding context in \
             old_string so that it occurs exactly once"
        ));
    }
    let mut edited = String::with_capacity(text.len() - old.len() + new.len());
    edited.push_str(&text[..at]);
    edited.push_str(new);
    edited.push_str(&text[at + old.len()..]);
    if edited.len() > WRITE_BYTES_MAX {
        return Err(format!(
            "the edit would make {quoted} {} bytes, over the limit of {WRITE_BYTES_MAX} bytes",
            edited.len()
        ));
    }
    replace_atomically(&parent, name, edited.as_bytes(), Some(metadata.permissions()), &quoted)?;
    let normalized = path.as_str().to_owned();
    touched.insert(normalized.clone());
    let line = text[..at].matches('\n').count() + 1;
    Ok(ToolOutcome::ok(format!("edited {normalized} at line {line}")))
}

/// Where `needle` first starts in `haystack`, and how often it occurs, overlapping matches
/// included (so "aa" occurs twice in "aaa": either could be meant).
///
/// Knuth–Morris–Pratt over bytes: linear in both lengths whatever their shape (restarting
/// a substring search after each overlapping match is quadratic for a long repetitive
/// needle). A match of valid UTF-8 in valid UTF-8 always starts at a character boundary.
fn occurrences(haystack: &str, needle: &str) -> (Option<usize>, usize) {
    let (text, pattern) = (haystack.as_bytes(), needle.as_bytes());
    if pattern.is_empty() || pattern.len() > text.len() {
        return (None, 0);
    }
    // failure[i]: the length of the longest proper border of pattern[..=i].
    let mut failure = vec![0usize; pattern.len()];
    let mut k = 0;
    for i in 1..pattern.len() {
        while k > 0 && pattern[i] != pattern[k] {
            k = failure[k - 1];
        }
        if pattern[i] == pattern[k] {
            k += 1;
        }
        failure[i] = k;
    }
    let (mut first, mut count, mut matched) = (None, 0, 0);
    for (i, &byte) in text.iter().enumerate() {
        while matched > 0 && byte != pattern[matched] {
            matched = failure[matched - 1];
        }
        if byte == pattern[matched] {
            matched += 1;
        }
        if matched == pattern.len() {
            count += 1;
            first.get_or_insert(i + 1 - pattern.len());
            matched = failure[matched - 1];
        }
    }
    (first, count)
}

/// `list_dir {path?}`.
fn list_dir(root: &Dir, arguments: &Value) -> Result<ToolOutcome, String> {
    let args = Args::new("list_dir", arguments, &["path"])?;
    let given = args.optional_string("path")?.unwrap_or(".");
    let path = check_path(given)?;
    let quoted = shown(given);
    check_resolved(root, &path, &quoted, false)?;
    let metadata = root.metadata(path.as_str()).map_err(|e| io_failure("list", &quoted, &e))?;
    if !metadata.is_dir() {
        return Err(format!("{quoted} is not a directory; use read_file to read a file"));
    }
    let entries = root.read_dir(path.as_str()).map_err(|e| io_failure("list", &quoted, &e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_failure("list", &quoted, &e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_hidden(&name) {
            continue;
        }
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        names.push(if is_dir { format!("{name}/") } else { name });
    }
    if names.is_empty() {
        return Ok(ToolOutcome::ok(format!("({} is empty)", path.as_str())));
    }
    names.sort_unstable();
    let more = names.len().saturating_sub(LIST_ENTRIES_MAX);
    names.truncate(LIST_ENTRIES_MAX);
    let mut listing = names.join("\n");
    if more > 0 {
        listing.push_str(&format!("\n… {more} more"));
    }
    Ok(ToolOutcome::ok(listing))
}

/// `delete_file {path}`.
fn delete_file(
    root: &Dir,
    arguments: &Value,
    touched: &mut BTreeSet<String>,
    max_touched: usize,
) -> Result<ToolOutcome, String> {
    let args = Args::new("delete_file", arguments, &["path"])?;
    let given = args.string("path")?;
    let path = check_path(given)?;
    let quoted = shown(given);
    check_resolved(root, &path, &quoted, true)?;
    require_not_root(&path, &quoted, "delete_file")?;
    check_touch(&path, touched, max_touched, &quoted)?;
    let (parent_path, name) = path.split();
    let parent = open_parent(root, parent_path, &quoted)?;
    let Some(metadata) = existing(&parent, name, &quoted)? else {
        return Err(format!("{quoted} does not exist; use list_dir to see which files there are"));
    };
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        return Err(format!(
            "{quoted} is a directory; delete_file deletes files and symbolic links only"
        ));
    }
    if !file_type.is_file() && !file_type.is_symlink() {
        return Err(format!(
            "{quoted} is {}; delete_file deletes regular files and symbolic links only",
            special_kind(file_type)
        ));
    }
    // Removes the name, never what a symbolic link points to.
    parent.remove_file(name).map_err(|e| io_failure("delete", &quoted, &e))?;
    let normalized = path.as_str().to_owned();
    touched.insert(normalized.clone());
    Ok(ToolOutcome::ok(format!("deleted {normalized}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized() {
        for (given, normalized) in [
            ("a", "a"),
            ("./a", "a"),
            ("a//b/./c", "a/b/c"),
            ("a/b/", "a/b"),
            (".", "."),
            ("./", "."),
        ] {
            assert_eq!(check_path(given).map(|p| p.as_str().to_owned()), Ok(normalized.to_owned()));
        }
    }

    #[test]
    fn bad_paths_are_refused() {
        let long = "a".repeat(PATH_BYTES_MAX + 1);
        let deep = vec!["d"; PATH_COMPONENTS_MAX + 1].join("/");
        for given in [
            "",
            "..",
            "a/../b",
            "/etc/passwd",
            "C:/x",
            "c:x",
            "a\\b",
            "a\0b",
            ".git",
            "x/.git/config",
            ".GIT/HEAD",
            ".baton/git/HEAD",
            long.as_str(),
            deep.as_str(),
        ] {
            assert!(check_path(given).is_err(), "{given:?} was accepted");
        }
        assert!(check_path(&vec!["d"; PATH_COMPONENTS_MAX].join("/")).is_ok());
    }

    #[test]
    fn long_paths_are_shortened_when_quoted() {
        let quoted = shown(&"x".repeat(1000));
        assert!(quoted.chars().count() < SHOWN_CHARS_MAX + 4);
        assert!(quoted.ends_with('…'));
    }

    #[test]
    fn overlapping_occurrences_count() {
        assert_eq!(occurrences("aaa", "aa"), (Some(0), 2));
        assert_eq!(occurrences("héllo héllo", "é"), (Some(1), 2));
        assert_eq!(occurrences("abc", "d"), (None, 0));
        assert_eq!(occurrences("abababa", "aba"), (Some(0), 3));
        assert_eq!(occurrences("xxabcabcab", "abcab"), (Some(2), 2));
        assert_eq!(occurrences("ab", "abc"), (None, 0));
    }

    #[test]
    fn occurrences_are_linear_for_a_repetitive_needle() {
        // Restarting a search after each overlapping match took minutes here.
        let haystack = "a".repeat(1024 * 1024);
        let needle = "a".repeat(512 * 1024);
        let started = std::time::Instant::now();
        assert_eq!(occurrences(&haystack, &needle), (Some(0), 512 * 1024 + 1));
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn line_selection_is_bounded() {
        let text = b"one\ntwo\nthree\nfour";
        let all = select_lines(&text[..], 1, u64::MAX, 1000).expect("reads");
        assert_eq!(all.text, text);
        assert_eq!(all.total_lines, Some(4));
        let middle = select_lines(&text[..], 2, 3, 1000).expect("reads");
        assert_eq!(middle.text, b"two\nthree\n");
        let capped = select_lines(&text[..], 2, 4, 5).expect("reads");
        assert_eq!(capped.text, b"two\nt");
        assert_eq!(capped.truncated_at, Some(3));
        let past = select_lines(&text[..], 9, 10, 1000).expect("reads");
        assert_eq!(past.total_lines, Some(4));
        assert!(past.text.is_empty());
    }
}

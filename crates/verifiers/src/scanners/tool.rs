//! Running a scanner's tool: finding the program, reading the verifier's parameters
//! (suppressions, timeout, target paths), reading its report back with a size cap, and the
//! private scratch directory its configuration and reports are written to.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_engine::limits;
use baton_engine::verifier::tail;
use baton_scenario::limits as scenario_limits;
use baton_scenario::model::VerifierSpec;
use serde_json::Value;

/// Largest report read back from a scanner, in bytes.
pub(super) const REPORT_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Characters kept of a finding's message or an error's message.
pub(super) const MESSAGE_CHARS_MAX: usize = 200;
/// Baton's own directory inside a workspace, never scanned.
pub(super) const BATON_DIR: &str = ".baton";

/// Why a scanner could not give a verdict, with what is known about the attempt.
#[derive(Debug)]
pub(super) struct Unavailable {
    pub(super) why: String,
    pub(super) details: Value,
}

impl From<String> for Unavailable {
    fn from(why: String) -> Self {
        Unavailable { why, details: Value::Null }
    }
}

/// The scanner's `allow_suppressions` parameter: whether the workspace's own suppression
/// comments and ignore files count (default: they do not).
pub(super) fn allow_suppressions(spec: &VerifierSpec, tool: &str) -> Result<bool, Unavailable> {
    match spec.params.get("allow_suppressions") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(allow)) => Ok(*allow),
        Some(other) => Err(format!(
            "{tool}: `allow_suppressions` of verifier `{}` is {other}, not true or false",
            spec.name
        )
        .into()),
    }
}

/// The program to run: `$VAR` when set, else `name` on PATH.
pub(super) fn locate(name: &str, var: &str, install: &str) -> Result<PathBuf, Unavailable> {
    if let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        let given = PathBuf::from(&value);
        // Relative to Baton's directory, not to the workspace the tool runs in.
        let absolute = std::path::absolute(&given).unwrap_or(given);
        if is_executable(&absolute) {
            return Ok(absolute);
        }
        return Err(format!(
            "{name} not found: {var} is set to `{}`, which is not an executable file; {install}",
            absolute.display()
        )
        .into());
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|p| is_executable(p))
    });
    found.ok_or_else(|| {
        format!("{name} is not installed: no `{name}` on PATH and {var} is not set; {install}")
            .into()
    })
}

pub(super) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Why a tool did not run to an exit, with what to do about a timeout.
pub(super) fn not_run(tool: &str, why: &str) -> Unavailable {
    if why.contains("timed out") {
        format!("{tool}: {why}; raise the verifier's `timeout_s` or narrow its `paths`").into()
    } else {
        format!("{tool}: {why}").into()
    }
}

/// The verifier's timeout, or the default when it has none (or a nonsensical one); never
/// more than the longest timeout a scenario may give.
pub(super) fn timeout(spec: &VerifierSpec) -> Duration {
    let default = Duration::from_secs_f64(limits::VERIFIER_TIMEOUT_S_DEFAULT);
    match spec.timeout_s {
        Some(s) if s > 0.0 => {
            Duration::try_from_secs_f64(s.min(scenario_limits::TIMEOUT_S_MAX)).unwrap_or(default)
        }
        _ => default,
    }
}

/// The workspace as an absolute, resolved directory.
pub(super) fn workspace_root(workspace: &Path, tool: &str) -> Result<PathBuf, Unavailable> {
    let root = workspace
        .canonicalize()
        .map_err(|e| format!("{tool}: cannot open the workspace {}: {e}", workspace.display()))?;
    if !root.is_dir() {
        return Err(format!("{tool}: the workspace {} is not a directory", root.display()).into());
    }
    Ok(root)
}

/// What to scan, relative to the workspace: the verifier's `paths`, each checked to stay
/// inside the workspace (symbolic links included) and out of `.baton/`, or `.`.
pub(super) fn target_paths(
    spec: &VerifierSpec,
    workspace: &Path,
    tool: &str,
) -> Result<Vec<String>, Unavailable> {
    let name = &spec.name;
    let list = match spec.params.get("paths") {
        None | Some(Value::Null) => return Ok(vec![".".to_owned()]),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(format!(
                "{tool}: `paths` of verifier `{name}` is {other}, not a list of workspace-relative paths"
            )
            .into());
        }
    };
    if list.is_empty() {
        return Err(format!(
            "{tool}: `paths` of verifier `{name}` is empty; leave it out to scan the whole workspace"
        )
        .into());
    }
    let mut targets = Vec::with_capacity(list.len());
    for item in list {
        let Some(raw) = item.as_str() else {
            return Err(format!(
                "{tool}: `paths` of verifier `{name}` holds {item}, not a path string"
            )
            .into());
        };
        let path = Path::new(raw);
        let bad = |what: &str| -> Unavailable {
            format!("{tool}: path `{raw}` in `paths` of verifier `{name}` {what}").into()
        };
        if raw.is_empty() {
            return Err(bad("is empty; use `.` for the whole workspace"));
        }
        if path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
            return Err(bad(
                "is not inside the workspace; give a path relative to it, without `..`",
            ));
        }
        let first = path.components().find(|c| *c != Component::CurDir);
        if first == Some(Component::Normal(BATON_DIR.as_ref())) {
            return Err(bad("is Baton's own directory, which is never scanned"));
        }
        let resolved = workspace.join(path).canonicalize().map_err(|e| {
            bad(&format!("cannot be opened in the workspace {}: {e}", workspace.display()))
        })?;
        if !resolved.starts_with(workspace) {
            return Err(bad("leads outside the workspace through a symbolic link"));
        }
        // A path that looks like an option is still a path.
        targets.push(if raw.starts_with('-') { format!("./{raw}") } else { raw.to_owned() });
    }
    Ok(targets)
}

/// A path from a report, relative to the workspace and without a leading `./`.
pub(super) fn relative_report_path(path: &str, workspace: Option<&Path>) -> String {
    let mut p = Path::new(path);
    if let Some(root) = workspace
        && let Ok(inside) = p.strip_prefix(root)
    {
        p = inside;
    }
    let rest: PathBuf = p.components().filter(|c| *c != Component::CurDir).collect();
    rest.to_string_lossy().into_owned()
}

/// Whether a workspace-relative path is in Baton's own directory.
pub(super) fn under_baton(path: &str) -> bool {
    Path::new(path).components().next() == Some(Component::Normal(BATON_DIR.as_ref()))
}

/// The first non-empty line of a message, at most [`MESSAGE_CHARS_MAX`] characters.
pub(super) fn first_line(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    if line.chars().count() <= MESSAGE_CHARS_MAX {
        return line.to_owned();
    }
    let mut short: String = line.chars().take(MESSAGE_CHARS_MAX).collect();
    short.push('…');
    short
}

/// A whole message on one line (an error's first line often says little), at most
/// [`MESSAGE_CHARS_MAX`] characters.
pub(super) fn one_line(text: &str) -> String {
    first_line(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The end of a tool's stderr as text, without terminal colour codes.
pub(super) fn clean_tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence: ESC '[' parameters, ended by a letter.
            if chars.next() == Some('[') {
                for end in chars.by_ref() {
                    if end.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        plain.push(c);
    }
    let trimmed = plain.trim();
    if trimmed.is_empty() {
        return "(nothing)".to_owned();
    }
    tail(trimmed, limits::FEEDBACK_TAIL_BYTES).to_owned()
}

/// A tool's JSON report, read with a size cap. The error completes "the tool … and …".
pub(super) fn read_report(path: &Path) -> Result<Value, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("wrote no report ({e})"))?;
    let mut bytes = Vec::new();
    file.take(REPORT_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("its report could not be read ({e})"))?;
    if bytes.len() as u64 > REPORT_BYTES_MAX {
        return Err(format!(
            "its report is larger than {} MiB; narrow the verifier's `paths` or rules",
            REPORT_BYTES_MAX / (1024 * 1024)
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("its report is not JSON ({e})"))
}

/// A private temporary directory for one scan (configuration and report), outside the
/// workspace; removed when dropped.
#[derive(Debug)]
pub(super) struct Scratch {
    pub(super) dir: PathBuf,
}

impl Scratch {
    pub(super) fn new(tool: &str) -> Result<Self, Unavailable> {
        use std::os::unix::fs::DirBuilderExt;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let mut last_error = None;
        for _ in 0..8 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let name = format!("baton-{tool}-{}-{n}-{nanos}", std::process::id());
            let dir = base.join(name);
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Ok(Scratch { dir }),
                Err(e) => last_error = Some(e),
            }
        }
        let why = last_error.map(|e| e.to_string()).unwrap_or_default();
        Err(format!(
            "{tool}: cannot create a temporary directory in {}: {why}; check TMPDIR",
            base.display()
        )
        .into())
    }

    pub(super) fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes `text` into the file `name` of the directory.
    pub(super) fn write(&self, name: &str, text: &str) -> Result<PathBuf, Unavailable> {
        let path = self.dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| format!("cannot write {}: {e}; check TMPDIR", path.display()))?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::*;

    #[test]
    fn report_paths_are_workspace_relative() {
        let root = Path::new("/w/ws");
        assert_eq!(relative_report_path("/w/ws/src/a.py", Some(root)), "src/a.py");
        assert_eq!(relative_report_path("./src/a.py", None), "src/a.py");
        assert!(under_baton(".baton/git/config"));
        assert!(!under_baton("src/.baton"));
    }

    #[test]
    fn timeouts_are_bounded_and_never_panic() {
        let mut spec = VerifierSpec {
            name: "scan".to_owned(),
            uses: baton_scenario::model::Uses::Gitleaks,
            params: Map::new(),
            weight: 1.0,
            on_fail: baton_scenario::model::OnFail::Fail,
            max_retries: 0,
            timeout_s: None,
            rubric: None,
            schema: None,
            config_text: None,
        };
        assert_eq!(timeout(&spec), Duration::from_secs(600));
        for bad in [-1.0, 0.0, f64::NAN] {
            spec.timeout_s = Some(bad);
            assert_eq!(timeout(&spec), Duration::from_secs(600), "{bad}");
        }
        spec.timeout_s = Some(f64::INFINITY);
        assert_eq!(timeout(&spec), Duration::from_secs(7 * 24 * 3600));
        spec.timeout_s = Some(2.5);
        assert_eq!(timeout(&spec), Duration::from_millis(2500));
    }

    #[test]
    fn colour_codes_are_dropped_from_stderr() {
        assert_eq!(clean_tail(b"\x1b[90m11:35PM\x1b[0m \x1b[31mWRN\x1b[0m x"), "11:35PM WRN x");
        assert_eq!(clean_tail(b"  \n"), "(nothing)");
    }

    #[test]
    fn messages_are_one_short_line() {
        assert_eq!(first_line("\n  first \nsecond"), "first");
        let long = "x".repeat(500);
        assert_eq!(first_line(&long).chars().count(), MESSAGE_CHARS_MAX + 1);
        assert_eq!(
            one_line("Rule parse error:\n Invalid pattern\n"),
            "Rule parse error: Invalid pattern"
        );
    }
}

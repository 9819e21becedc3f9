//! The Baton-managed git repository that snapshots a workspace: git dir
//! `<root>/.baton/git`, work tree `<root>`.
//!
//! Driven through the `git` command line with a scrubbed environment and fixed settings
//! (no system or global config, no hooks, no signing, no prompts, no automatic gc), so a
//! user's git setup cannot change what a snapshot records or run code. A snapshot is a
//! commit (on a detached `HEAD`) of every file not ignored; restoring one resets to it and
//! removes untracked files, keeping ignored build output such as `target/`. Branches name
//! snapshots; none is ever checked out.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, PoisonError};

use baton_engine::workspace::WorkspaceError;

/// Where the managed repository lives, relative to the workspace root.
pub(crate) const GIT_DIR: &str = ".baton/git";

/// What the repository ignores: Baton's own directory, a project's own repository, and
/// common build output and caches (kept across restores).
const EXCLUDE: &str = "\
# Written by Baton: files its snapshots ignore (restoring a snapshot keeps them).
.baton/
.git/
target/
node_modules/
__pycache__/
*.pyc
.venv/
.mypy_cache/
.pytest_cache/
";

/// The most bytes of git's stderr an error keeps.
const STDERR_BYTES_MAX: usize = 2048;

/// The environment variables a git process keeps from Baton's.
const KEPT_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TMPDIR"];

/// A workspace's managed repository.
#[derive(Debug)]
pub(crate) struct Repo {
    work_tree: PathBuf,
    git_dir: PathBuf,
    /// Git commands on one repository run one at a time (they share the index lock).
    lock: Mutex<()>,
}

impl Repo {
    /// The repository of the workspace at `work_tree` (which need not exist yet).
    pub(crate) fn new(work_tree: &Path) -> Self {
        Repo {
            work_tree: work_tree.to_path_buf(),
            git_dir: work_tree.join(GIT_DIR),
            lock: Mutex::new(()),
        }
    }

    /// Whether the repository has been created. Its ignore list is written last, so a
    /// repository whose creation was interrupted is created again (which git allows).
    pub(crate) fn exists(&self) -> bool {
        self.git_dir.join("HEAD").is_file() && self.git_dir.join("info/exclude").is_file()
    }

    /// Creates the repository and writes its ignore list.
    pub(crate) fn init(&self) -> Result<(), WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let mut command = self.base_command();
        command.args([
            "-c",
            "init.defaultBranch=baton-unborn",
            "init",
            "-q",
            "--bare",
            "--template=",
        ]);
        command.arg(&self.git_dir);
        self.run(command, "git init")?;
        let info = self.git_dir.join("info");
        std::fs::create_dir_all(&info).map_err(|e| {
            self.error(format!(
                "cannot create {GIT_DIR}/info: {e}; check that the workspace is writable"
            ))
        })?;
        std::fs::write(info.join("exclude"), EXCLUDE).map_err(|e| {
            self.error(format!(
                "cannot write {GIT_DIR}/info/exclude: {e}; check that the workspace is writable"
            ))
        })?;
        Ok(())
    }

    /// Commits every file that is not ignored; returns the commit's id.
    ///
    /// Snapshots are commits on a detached `HEAD` (made with `write-tree`, `commit-tree`
    /// and `update-ref` rather than `commit`), so no branch is checked out and every name
    /// is free for [`Repo::branch`]. Reflogs keep snapshots a restore left behind.
    pub(crate) fn snapshot(&self, message: &str) -> Result<String, WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.git(&["add", "-A"], "git add")?;
        let tree = stdout_line(&self.git(&["write-tree"], "git write-tree")?);
        let mut parent_check = self.repo_command();
        parent_check.args(["rev-parse", "-q", "--verify", "HEAD^{commit}"]);
        let parent = self.spawn(parent_check, "git rev-parse")?;
        let mut commit = self.repo_command();
        commit.args(["commit-tree", &tree]);
        if parent.status.success() {
            commit.args(["-p", &stdout_line(&parent)]);
        }
        commit.args(["-m", message]);
        let id = stdout_line(&self.run(commit, "git commit-tree")?);
        self.git(
            &["update-ref", "--no-deref", "-m", "baton: snapshot", "HEAD", &id],
            "git update-ref",
        )?;
        Ok(id)
    }

    /// Resets the work tree to a snapshot and removes untracked files that are not
    /// ignored.
    pub(crate) fn restore(&self, snapshot: &str) -> Result<(), WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let commit = self.require_commit(snapshot)?;
        self.git(&["reset", "-q", "--hard", &commit], "git reset")?;
        self.git(&["clean", "-q", "-f", "-d"], "git clean")?;
        Ok(())
    }

    /// Points the branch `name` at a snapshot, creating or moving it.
    pub(crate) fn branch(&self, name: &str, snapshot: &str) -> Result<(), WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        // `--branch` would expand `@{-1}`; such names are never meant here.
        if name.starts_with('-') || name.contains("@{") {
            return Err(self.invalid_branch(name));
        }
        let mut check = self.base_command();
        check.args(["check-ref-format", "--branch", name]);
        let output = self.spawn(check, "git check-ref-format")?;
        if !output.status.success() {
            return Err(self.invalid_branch(name));
        }
        let commit = self.require_commit(snapshot)?;
        self.git(&["branch", "-f", name, &commit], "git branch")?;
        Ok(())
    }

    /// The full id of a snapshot, or an error if it is not a commit of this repository.
    /// Only hex ids are accepted, so an id is never taken for an option or a revision
    /// expression.
    fn require_commit(&self, snapshot: &str) -> Result<String, WorkspaceError> {
        let hex = !snapshot.is_empty()
            && snapshot.len() <= 64
            && snapshot.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex {
            return Err(self.error(format!(
                "snapshot {snapshot:?} is not a snapshot id (a hex commit id); use an id that \
                 snapshot returned"
            )));
        }
        let mut command = self.repo_command();
        command.args(["rev-parse", "--verify", "-q", &format!("{snapshot}^{{commit}}")]);
        let output = self.spawn(command, "git rev-parse")?;
        if !output.status.success() {
            return Err(self.error(format!(
                "snapshot {snapshot} is not in the workspace's repository ({GIT_DIR}); use an \
                 id that snapshot returned for this workspace"
            )));
        }
        Ok(stdout_line(&output))
    }

    /// A git command with the scrubbed environment and fixed settings, not yet bound to
    /// the repository.
    fn base_command(&self) -> Command {
        let mut command = Command::new("git");
        command.current_dir(&self.work_tree);
        command.env_clear();
        for key in KEPT_ENV {
            if let Some(value) = std::env::var_os(key) {
                command.env(key, value);
            }
        }
        command
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0");
        command.args([
            "-c",
            "user.name=baton",
            "-c",
            "user.email=baton@localhost",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "gc.auto=0",
            "-c",
            "core.logAllRefUpdates=true",
        ]);
        command.stdin(Stdio::null());
        command
    }

    /// A git command on the managed repository and the workspace's work tree.
    fn repo_command(&self) -> Command {
        let mut command = self.base_command();
        command.arg("--git-dir").arg(&self.git_dir).arg("--work-tree").arg(&self.work_tree);
        command
    }

    /// Runs `git <args>` on the repository; an error unless it succeeds.
    fn git(&self, args: &[&str], what: &str) -> Result<Output, WorkspaceError> {
        let mut command = self.repo_command();
        command.args(args);
        self.run(command, what)
    }

    /// Runs a command; an error (with git's stderr) unless it succeeds.
    fn run(&self, command: Command, what: &str) -> Result<Output, WorkspaceError> {
        let output = self.spawn(command, what)?;
        if output.status.success() {
            return Ok(output);
        }
        let stderr = bounded(String::from_utf8_lossy(&output.stderr).trim());
        let status = output.status;
        Err(self.error(if stderr.is_empty() {
            format!("{what} failed ({status})")
        } else {
            format!("{what} failed ({status}): {stderr}")
        }))
    }

    /// Starts a command and waits for it.
    fn spawn(&self, mut command: Command, what: &str) -> Result<Output, WorkspaceError> {
        command.output().map_err(|e| {
            self.error(if e.kind() == io::ErrorKind::InvalidInput {
                format!("cannot run {what}: an argument contains a NUL byte; remove it")
            } else {
                format!("cannot run {what}: {e}; install git and make sure it is on PATH")
            })
        })
    }

    fn invalid_branch(&self, name: &str) -> WorkspaceError {
        self.error(format!(
            "{name:?} is not a valid branch name; use letters, digits, '-', '_' and '/' \
             (see git check-ref-format)"
        ))
    }

    fn error(&self, message: String) -> WorkspaceError {
        WorkspaceError { path: self.work_tree.display().to_string(), message }
    }
}

/// A command's output as one trimmed line (an id).
fn stdout_line(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// `text` cut to at most [`STDERR_BYTES_MAX`] bytes, at a character boundary.
fn bounded(text: &str) -> String {
    if text.len() <= STDERR_BYTES_MAX {
        return text.to_owned();
    }
    let mut end = STDERR_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_is_bounded_at_a_character_boundary() {
        let long = "é".repeat(STDERR_BYTES_MAX);
        let cut = bounded(&long);
        assert!(cut.len() <= STDERR_BYTES_MAX + '…'.len_utf8());
        assert_eq!(bounded("short"), "short");
    }
}

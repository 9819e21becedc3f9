//! The Baton-managed git repository that snapshots a workspace: git dir
//! `<snapshots>/<key>/git`, outside the workspace, work tree the workspace.
//!
//! The repository lives in Baton's data directory, never in the workspace, so nothing a
//! model writes (through the file tools or through code a verifier runs) can change its
//! config, hooks or objects. It is driven through the `git` command line with a scrubbed
//! environment: system and global config are ignored, `HOME` is the repository's own
//! directory (so no `~/.config/git/*` applies), attributes are read from the empty tree
//! (so a workspace's `.gitattributes` cannot convert line ends or name filters), and every
//! setting that could start a program is forced off on the command line
//! ([`FORCED_SETTINGS`]).
//!
//! A snapshot is a commit (on a detached `HEAD`) of every file of the workspace except
//! Baton's own excludes ([`EXCLUDED_DIRS`], [`EXCLUDED_FILES`]): the workspace's
//! `.gitignore`, `.git/info/exclude` and `core.excludesFile` are not read (`git add
//! --force` with exclude pathspecs, `git clean -x` with Baton's patterns), so a restore
//! puts back every file and removes every new one, whatever ignore files a model wrote.
//! Branches name snapshots; none is ever checked out.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, PoisonError};

use baton_engine::workspace::WorkspaceError;

/// The managed repository's directory, inside the workspace's snapshot directory.
pub(crate) const GIT_DIR: &str = "git";

/// Directories (at any depth) that snapshots leave out and restores keep: Baton's own
/// directory, and build output and caches — regenerated, often large, and not the code a
/// level writes. The file tools cannot write into them, so everything a model writes
/// through them is snapshotted and restored. `.git` is never recorded either (git itself
/// skips it).
pub(crate) const EXCLUDED_DIRS: [&str; 7] =
    [".baton", "target", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"];

/// File name patterns (at any depth) that snapshots leave out and restores keep: compiled
/// Python.
pub(crate) const EXCLUDED_FILES: [&str; 1] = ["*.pyc"];

/// Settings passed to every git command with `-c`, overriding any config file: each one
/// could otherwise start a program or change what a snapshot records. System and global
/// config are not read at all; these guard against the repository's own config too.
const FORCED_SETTINGS: [(&str, &str, &str); 20] = [
    ("core.fsmonitor", "false", "an fsmonitor hook runs on every add, status and reset"),
    ("core.hooksPath", "/dev/null", "hooks run on commits, checkouts and gc"),
    ("core.pager", "cat", "a pager is a program"),
    ("core.editor", "false", "an editor is a program (nothing here should open one)"),
    ("core.askPass", "", "an askpass helper is a program"),
    ("core.sshCommand", "false", "ssh transports start a program"),
    ("credential.helper", "", "credential helpers are programs"),
    ("diff.external", "", "an external diff driver is a program"),
    ("protocol.allow", "never", "no transport (fetch, push, ext::) is ever used"),
    ("core.untrackedCache", "false", "a cache written by someone else could hide new files"),
    ("core.autocrlf", "false", "a snapshot restores the bytes it recorded"),
    ("core.sparseCheckout", "false", "a restore writes every file"),
    ("submodule.recurse", "false", "no nested repository is entered"),
    ("commit.gpgSign", "false", "signing runs gpg"),
    ("gc.auto", "0", "automatic gc runs in the background, outside any timeout"),
    ("maintenance.auto", "false", "automatic maintenance likewise"),
    ("core.logAllRefUpdates", "true", "reflogs keep snapshots a restore left behind"),
    ("user.name", "baton", "snapshot commits need an author"),
    ("user.email", "baton@localhost", "and an author's address"),
    ("init.defaultBranch", "baton-unborn", "no branch name a user might mean"),
];

/// The empty tree's id: attributes are read from it (`GIT_ATTR_SOURCE`, git 2.40 and
/// later), so a workspace's `.gitattributes` cannot name filters or convert line ends.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// The most bytes of git's stderr an error keeps.
const STDERR_BYTES_MAX: usize = 2048;

/// The environment variables a git process keeps from Baton's (`HOME` is set to the
/// repository's own directory instead).
const KEPT_ENV: [&str; 3] = ["PATH", "LANG", "TMPDIR"];

/// A workspace's managed repository.
#[derive(Debug)]
pub(crate) struct Repo {
    work_tree: PathBuf,
    /// The workspace's snapshot directory (the repository's `HOME`).
    home: PathBuf,
    git_dir: PathBuf,
    /// Git commands on one repository run one at a time (they share the index lock).
    lock: Mutex<()>,
}

impl Repo {
    /// The repository of the workspace at `work_tree`, kept in `home` (neither need exist
    /// yet).
    pub(crate) fn new(work_tree: &Path, home: &Path) -> Self {
        Repo {
            work_tree: work_tree.to_path_buf(),
            home: home.to_path_buf(),
            git_dir: home.join(GIT_DIR),
            lock: Mutex::new(()),
        }
    }

    /// Whether the repository has been created. Its ignore list is written last, so a
    /// repository whose creation was interrupted is created again (which git allows).
    pub(crate) fn exists(&self) -> bool {
        self.git_dir.join("HEAD").is_file() && self.git_dir.join("info/exclude").is_file()
    }

    /// Creates the repository and writes its ignore list (for people who inspect it with
    /// `git status`; snapshots pass Baton's excludes on the command line).
    pub(crate) fn init(&self) -> Result<(), WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let mut command = self.base_command();
        command.args(["init", "-q", "--bare", "--template="]);
        command.arg(&self.git_dir);
        self.run(command, "git init")?;
        let info = self.git_dir.join("info");
        let mut exclude = String::from("# Written by Baton: what its snapshots leave out.\n");
        for pattern in ignore_patterns() {
            exclude.push_str(&pattern);
            exclude.push('\n');
        }
        std::fs::create_dir_all(&info)
            .and_then(|()| std::fs::write(info.join("exclude"), exclude))
            .map_err(|e| {
                self.error(format!(
                    "cannot write {}: {e}; check that Baton's data directory is writable",
                    info.display()
                ))
            })?;
        Ok(())
    }

    /// Commits every file but Baton's excludes; returns the commit's id.
    ///
    /// Snapshots are commits on a detached `HEAD` (made with `write-tree`, `commit-tree`
    /// and `update-ref` rather than `commit`), so no branch is checked out and every name
    /// is free for [`Repo::branch`]. `--force` makes git read no ignore file at all; Baton's
    /// excludes are pathspecs.
    pub(crate) fn snapshot(&self, message: &str) -> Result<String, WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let mut add = self.repo_command();
        add.args(["add", "--all", "--force", "--", "."]);
        add.args(exclude_pathspecs());
        self.run(add, "git add")?;
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

    /// Resets the work tree to a snapshot and removes every other file but Baton's
    /// excludes (`-x`: the workspace's ignore files do not protect anything; `-ff`: nested
    /// repositories go too).
    pub(crate) fn restore(&self, snapshot: &str) -> Result<(), WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let commit = self.require_commit(snapshot)?;
        self.git(&["reset", "-q", "--hard", &commit], "git reset")?;
        let mut clean = self.repo_command();
        clean.args(["clean", "-q", "-f", "-f", "-d", "-x"]);
        for pattern in ignore_patterns() {
            clean.arg("-e").arg(pattern);
        }
        self.run(clean, "git clean")?;
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
                "snapshot {snapshot} is not in the workspace's repository ({}); use an id \
                 that snapshot returned for this workspace",
                self.git_dir.display()
            )));
        }
        Ok(stdout_line(&output))
    }

    /// A git command with the scrubbed environment and forced settings, not yet bound to
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
            .env("HOME", &self.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ATTR_SOURCE", EMPTY_TREE);
        for (key, value, _why) in FORCED_SETTINGS {
            command.arg("-c").arg(format!("{key}={value}"));
        }
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

/// Baton's excludes as ignore patterns (for `git clean -e` and `info/exclude`).
fn ignore_patterns() -> impl Iterator<Item = String> {
    EXCLUDED_DIRS
        .iter()
        .map(|dir| format!("{dir}/"))
        .chain(EXCLUDED_FILES.iter().map(|&file| file.to_owned()))
}

/// Baton's excludes as exclude pathspecs (for `git add`), matching at any depth.
fn exclude_pathspecs() -> impl Iterator<Item = String> {
    EXCLUDED_DIRS
        .iter()
        .map(|dir| format!(":(exclude,glob)**/{dir}/**"))
        .chain(EXCLUDED_FILES.iter().map(|file| format!(":(exclude,glob)**/{file}")))
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

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

use std::io::{self, Read};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};
use std::time::{Duration, Instant};

use baton_engine::workspace::WorkspaceError;
use baton_jail::{Jail, Watch};

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
/// How git starts where there is no jail: `setpriv --pdeathsig KILL -- git`.
const SETPRIV_GIT: [&str; 5] = ["setpriv", "--pdeathsig", "KILL", "--", "git"];

const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// How deep an objects directory goes (`pack/`, `info/`, `ab/cdef…`).
const OBJECT_DIRS_DEPTH_MAX: usize = 4;

/// Copies a git objects directory into another, file by file, skipping what exists.
fn copy_objects(from: &Path, to: &Path, depth: usize) -> io::Result<()> {
    if depth > OBJECT_DIRS_DEPTH_MAX {
        return Err(io::Error::other(format!(
            "{} is nested deeper than an objects directory",
            from.display()
        )));
    }
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_objects(&entry.path(), &target, depth + 1)?;
        } else if kind.is_file() {
            if !target.exists() {
                std::fs::copy(entry.path(), &target)?;
            }
        } else {
            return Err(io::Error::other(format!(
                "{} is not a regular file or directory",
                entry.path().display()
            )));
        }
    }
    Ok(())
}

/// The most bytes of git's stderr an error keeps.
const STDERR_BYTES_MAX: usize = 2048;

/// The longest one git command may run; past it its process group is killed and the
/// operation fails as transient (the run stays resumable).
pub(crate) const GIT_TIMEOUT: Duration = Duration::from_secs(300);

/// The most bytes of git's standard output kept (ids and short lines are all Baton reads;
/// the rest is read and dropped so git never blocks on a full pipe).
const STDOUT_BYTES_MAX: u64 = 1024 * 1024;

/// How long opening a workspace waits for a process still using its snapshot repository
/// (a git a killed Baton left running, where git cannot die with its driver) before it
/// refuses, leaving the run resumable.
pub(crate) const STALE_HOLDER_WAIT: Duration = Duration::from_secs(5);

/// The most entries of the repository (objects aside) looked at for lock files.
const LOCK_SCAN_ENTRIES_MAX: usize = 100_000;

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
    /// Where git runs: in the jail (seeing the work tree and this repository only) when
    /// there is one, else as Baton's user.
    jail: Arc<Jail>,
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
            jail: Arc::new(Jail::off()),
        }
    }

    /// The workspace's snapshot directory.
    pub(crate) fn home(&self) -> &Path {
        &self.home
    }

    /// The same repository, its git run in `jail`.
    pub(crate) fn jailed(mut self, jail: Arc<Jail>) -> Self {
        self.jail = jail;
        self
    }

    /// `command` (a git command [`Repo::base_command`] built) in the jail, when the jail
    /// is set up: the same git, arguments and environment, seeing the work tree and this
    /// repository only, and the watch to keep while it runs.
    fn in_jail(&self, command: Command) -> Result<(Command, Option<Watch>), WorkspaceError> {
        if !self.jail.is_on() {
            return Ok((command, None));
        }
        let text = |s: &std::ffi::OsStr| {
            s.to_str().map(str::to_owned).ok_or_else(|| {
                self.error(format!(
                    "cannot run git in the jail: {} is not UTF-8; rename it",
                    s.to_string_lossy()
                ))
            })
        };
        let mut argv = std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(text)
            .collect::<Result<Vec<String>, WorkspaceError>>()?;
        if argv.starts_with(&SETPRIV_GIT.map(str::to_owned)) {
            // The jail ties git to Baton itself: git, without setpriv in front.
            argv.drain(..SETPRIV_GIT.len() - 1);
        }
        let mut env = Vec::new();
        for (key, value) in command.get_envs() {
            if let Some(value) = value {
                env.push((text(key)?, text(value)?));
            }
        }
        let cwd = command.get_current_dir().unwrap_or(&self.work_tree).to_path_buf();
        let also = [self.home.clone()];
        let (mut jailed, watch) = self
            .jail
            .std_command(&baton_jail::Program {
                argv: &argv,
                env: &env,
                cwd: &cwd,
                workspace: &self.work_tree,
                also_writable: &also,
                network: false,
                timeout: GIT_TIMEOUT,
                counted: false,
            })
            .map_err(|e| self.transient(format!("cannot start git in the jail: {e}")))?;
        jailed.process_group(0).stdin(Stdio::null());
        Ok((jailed, watch))
    }

    /// Whether the repository has been created. Its ignore list is written last, so a
    /// repository whose creation was interrupted is created again (which git allows).
    pub(crate) fn exists(&self) -> bool {
        self.git_dir.join("HEAD").is_file() && self.git_dir.join("info/exclude").is_file()
    }

    /// Removes the lock files (`index.lock`, `HEAD.lock`, `refs/…/*.lock`…) a dead git left
    /// in the repository; returns one line per lock removed, for the run's log.
    ///
    /// Called with the workspace's driver lock held: no other Baton drives the workspace,
    /// and every git Baton starts dies with its driver, so a lock file found here is stale
    /// — unless some live process still has the repository open (a git started without
    /// `setpriv`, or one a person runs by hand). Such a process is waited for, at most
    /// [`STALE_HOLDER_WAIT`]; still there, nothing is removed and the error (transient)
    /// names it.
    pub(crate) fn recover_stale_locks(&self) -> Result<Vec<String>, WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        if lock_files(&self.git_dir).is_empty() {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + STALE_HOLDER_WAIT;
        loop {
            let users = processes_using(&self.git_dir);
            if users.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let named: Vec<String> =
                    users.iter().map(|(pid, command)| format!("{pid} ({command})")).collect();
                return Err(self.transient(format!(
                    "the snapshot repository {} is still used by process {} and may be locked \
                     by it; waited {} s; let it finish or stop it, then resume the run",
                    self.git_dir.display(),
                    named.join(", "),
                    STALE_HOLDER_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut removed = Vec::new();
        // Listed again: a process waited for may have removed its own locks.
        for lock in lock_files(&self.git_dir) {
            match std::fs::remove_file(&lock) {
                Ok(()) => removed.push(format!(
                    "removed the stale lock {} that a git process which died with its driver \
                     left in the snapshot repository (no live process had the repository open)",
                    lock.display()
                )),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(self.error(format!(
                        "cannot remove the stale lock {}: {e}; remove it by hand once no git \
                         uses the repository",
                        lock.display()
                    )));
                }
            }
        }
        Ok(removed)
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

    /// Takes every object of the repository kept in `other_home` (another workspace's:
    /// the run a fork was made from), so its snapshots keep their ids here. Objects are
    /// named by their content: copied files are never changed, existing ones never
    /// replaced, and anything that is not a plain file or directory is refused.
    pub(crate) fn adopt_objects(&self, other_home: &Path) -> Result<(), WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let from = other_home.join(GIT_DIR).join("objects");
        if !from.is_dir() {
            return Err(self.error(format!(
                "the snapshots of the forked run's workspace are gone ({} is not a directory); the fork cannot restore them",
                from.display()
            )));
        }
        copy_objects(&from, &self.git_dir.join("objects"), 0).map_err(|e| {
            self.error(format!(
                "cannot copy the forked run's snapshots from {}: {e}",
                from.display()
            ))
        })
    }

    /// A git bundle of `HEAD`, which must be snapshot `commit` (the one just taken),
    /// holding what `since` (a commit of this repository) does not reach — everything,
    /// without `since`. One git process: the ids are checked against the bundle's header.
    pub(crate) fn bundle(
        &self,
        commit: &str,
        since: Option<&str>,
    ) -> Result<Vec<u8>, WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        if !is_snapshot_id(commit) || since.is_some_and(|s| !is_snapshot_id(s)) {
            return Err(
                self.error(format!("cannot bundle {commit} since {since:?}: not snapshot ids"))
            );
        }
        let file = self.home.join("push.bundle");
        let mut create = self.repo_command();
        create.args(["bundle", "create", "-q"]).arg(&file).arg("HEAD");
        if let Some(since) = since {
            create.arg(format!("^{since}"));
        }
        let made = self.run(create, "git bundle create");
        let read = made.and_then(|_| {
            std::fs::read(&file)
                .map_err(|e| self.error(format!("cannot read the bundle {}: {e}", file.display())))
        });
        let _ = std::fs::remove_file(&file);
        let bundle = read?;
        let names_it = bundle_header(&bundle)
            .is_ok_and(|h| h.heads.iter().any(|(id, name)| id == commit && name == "HEAD"));
        if !names_it {
            return Err(self.transient(format!(
                "the snapshot moved while it was bundled (HEAD is no longer {commit}); resume the run to try again"
            )));
        }
        Ok(bundle)
    }

    /// Takes the objects of a git bundle into the repository (its prerequisites must be
    /// here already); its refs are not written.
    pub(crate) fn unbundle(&self, bundle: &[u8]) -> Result<(), WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let file = self.home.join("fetch.bundle");
        std::fs::write(&file, bundle).map_err(|e| {
            self.error(format!(
                "cannot write {}: {e}; check that Baton's data directory is writable",
                file.display()
            ))
        })?;
        let mut command = self.repo_command();
        command.args(["bundle", "unbundle"]).arg(&file);
        let taken = self.run(command, "git bundle unbundle");
        let _ = std::fs::remove_file(&file);
        taken.map(|_| ())
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
    /// Whether `snapshot` is a commit of this repository.
    pub(crate) fn holds(&self, snapshot: &str) -> Result<bool, WorkspaceError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        match self.require_commit(snapshot) {
            Ok(_) => Ok(true),
            Err(e) if e.transient => Err(e),
            Err(_) => Ok(false),
        }
    }

    fn require_commit(&self, snapshot: &str) -> Result<String, WorkspaceError> {
        if !is_snapshot_id(snapshot) {
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
        let mut command = match launcher() {
            Launcher::Setpriv => {
                // PR_SET_PDEATHSIG, set by setpriv before it becomes git: the kernel kills
                // git when the thread that started it dies (it waits for git, so only with
                // its process), so a killed Baton never leaves a git holding the index lock.
                let mut command = Command::new(SETPRIV_GIT[0]);
                command.args(&SETPRIV_GIT[1..]);
                command
            }
            Launcher::Direct => Command::new("git"),
        };
        // Its own process group: a timeout kills git and anything it started.
        command.process_group(0);
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

    /// Runs a command; an error (with git's stderr) unless it succeeds. A git killed by a
    /// signal, or refused because another git holds one of the repository's locks, is a
    /// transient failure: the run stays resumable.
    fn run(&self, command: Command, what: &str) -> Result<Output, WorkspaceError> {
        let output = self.spawn(command, what)?;
        if output.status.success() {
            return Ok(output);
        }
        let stderr = bounded(String::from_utf8_lossy(&output.stderr).trim());
        let status = output.status;
        let message = if stderr.is_empty() {
            format!("{what} failed ({status})")
        } else {
            format!("{what} failed ({status}): {stderr}")
        };
        if status.code().is_none() {
            return Err(self.transient(format!("{message}; resume the run to try again")));
        }
        if stderr.contains(".lock': File exists") || stderr.contains(".lock': file exists") {
            return Err(self.transient(format!(
                "{message}; another git process holds the repository's lock: wait for it to \
                 end, then resume the run"
            )));
        }
        Err(self.error(message))
    }

    /// Starts a command and waits for it, at most [`GIT_TIMEOUT`].
    fn spawn(&self, command: Command, what: &str) -> Result<Output, WorkspaceError> {
        let (command, _watch) = self.in_jail(command)?;
        match run_bounded(command, GIT_TIMEOUT) {
            Ok(output) => Ok(output),
            Err(Bounded::TimedOut) => Err(self.transient(format!(
                "{what} did not finish within {} s and was killed; resume the run to try again",
                GIT_TIMEOUT.as_secs()
            ))),
            Err(Bounded::Start(e)) => Err(self.error(if e.kind() == io::ErrorKind::InvalidInput {
                format!("cannot run {what}: an argument contains a NUL byte; remove it")
            } else {
                format!("cannot run {what}: {e}; install git and make sure it is on PATH")
            })),
        }
    }

    fn invalid_branch(&self, name: &str) -> WorkspaceError {
        self.error(format!(
            "{name:?} is not a valid branch name; use letters, digits, '-', '_' and '/' \
             (see git check-ref-format)"
        ))
    }

    fn error(&self, message: String) -> WorkspaceError {
        WorkspaceError::new(self.work_tree.display().to_string(), message)
    }

    fn transient(&self, message: String) -> WorkspaceError {
        WorkspaceError::transient(self.work_tree.display().to_string(), message)
    }
}

/// Whether `id` can name a snapshot: 1 to 64 hex digits (a commit id, or a prefix of
/// one), never an option or a revision expression.
pub(crate) fn is_snapshot_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a git bundle's header says: the commits it needs (`-<id>` lines) and the heads it
/// holds (`<id> <ref>` lines).
#[derive(Debug, Default)]
pub(crate) struct BundleHeader {
    pub(crate) prerequisites: Vec<String>,
    pub(crate) heads: Vec<(String, String)>,
}

/// The header of a git bundle, read from at most its first 1 MiB; an error when the
/// bytes are no v2 or v3 bundle.
pub(crate) fn bundle_header(bundle: &[u8]) -> Result<BundleHeader, String> {
    let head = &bundle[..bundle.len().min(1024 * 1024)];
    let mut lines = head.split(|b| *b == b'\n');
    let first = lines.next().unwrap_or_default();
    if first != b"# v2 git bundle" && first != b"# v3 git bundle" {
        return Err("the object is not a git bundle".to_owned());
    }
    let mut header = BundleHeader::default();
    for line in lines {
        if line.is_empty() {
            return Ok(header);
        }
        let line = String::from_utf8_lossy(line);
        if let Some(rest) = line.strip_prefix('-') {
            let id: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
            if id.len() < 40 {
                return Err("the bundle names a prerequisite that is no commit id".to_owned());
            }
            header.prerequisites.push(id);
        } else if let Some((id, name)) = line.split_once(' ') {
            header.heads.push((id.to_owned(), name.to_owned()));
        }
    }
    Err("the bundle's header does not end within its first 1 MiB".to_owned())
}

/// How git processes are started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Launcher {
    /// Through util-linux `setpriv --pdeathsig KILL`: git dies with the thread that
    /// started it.
    Setpriv,
    /// `git` itself, where `setpriv` is missing: a git started by a Baton that is killed
    /// runs on until it ends (a lock it leaves is recovered on the next open, after it
    /// exits). [`launcher_notice`] says so.
    Direct,
}

/// How this machine starts git (probed once: `setpriv --pdeathsig KILL -- true`).
pub(crate) fn launcher() -> Launcher {
    static LAUNCHER: OnceLock<Launcher> = OnceLock::new();
    *LAUNCHER.get_or_init(|| {
        let probe = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if probe.is_ok_and(|s| s.success()) { Launcher::Setpriv } else { Launcher::Direct }
    })
}

/// What a run's log should say about how git is started, when it is not safe.
pub(crate) fn launcher_notice() -> Option<String> {
    (launcher() == Launcher::Direct).then(|| {
        "util-linux `setpriv` is not installed, so git runs without dying with Baton: a git \
         started by a Baton that is killed runs on until it ends; install util-linux"
            .to_owned()
    })
}

/// Why a bounded command gave no output.
#[derive(Debug)]
pub(crate) enum Bounded {
    /// It could not be started.
    Start(io::Error),
    /// It ran past its deadline; its process group was killed.
    TimedOut,
}

/// Kills a process group when dropped, unless the group's leader was reaped: a panic or
/// an early return never leaves a git running.
struct Group {
    child: Child,
    reaped: bool,
}

impl Group {
    /// Kills every process of the group (through the system's `kill`: no unsafe code),
    /// then the leader itself should the group be gone already.
    fn kill(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
    }

    fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait()?;
        self.reaped = true;
        Ok(status)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a command (in its own process group, which the caller set) with its output
/// piped, waiting at most `timeout`: past it the whole group is killed. The waiting
/// happens on the calling thread, which started the process and so lives as long as it
/// runs (a parent-death signal fires when the starting thread ends).
pub(crate) fn run_bounded(mut command: Command, timeout: Duration) -> Result<Output, Bounded> {
    let deadline = Instant::now() + timeout;
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = command.spawn().map_err(Bounded::Start)?;
    let mut group = Group { child, reaped: false };
    let stdout = group.child.stdout.take();
    let stderr = group.child.stderr.take();
    let (closed, pipes_closed) = mpsc::channel::<()>();
    let (stdout, stderr, timed_out) = std::thread::scope(|scope| {
        let read = |pipe: Option<Box<dyn Read + Send>>, cap: u64| {
            let closed = closed.clone();
            scope.spawn(move || {
                let mut kept = Vec::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.by_ref().take(cap).read_to_end(&mut kept);
                    let _ = io::copy(&mut pipe, &mut io::sink());
                }
                let _ = closed.send(());
                kept
            })
        };
        let out = read(stdout.map(|p| Box::new(p) as Box<dyn Read + Send>), STDOUT_BYTES_MAX);
        let err = read(stderr.map(|p| Box::new(p) as Box<dyn Read + Send>), STDOUT_BYTES_MAX);
        // Both pipes close when git exits (or when the group is killed).
        let mut timed_out = false;
        for _ in 0..2 {
            let left = deadline.saturating_duration_since(Instant::now());
            if pipes_closed.recv_timeout(left).is_err() {
                timed_out = true;
                group.kill();
                break;
            }
        }
        (out.join().unwrap_or_default(), err.join().unwrap_or_default(), timed_out)
    });
    // The pipes are closed: the leader has exited or is about to; wait for it, bounded.
    let status = loop {
        match group.child.try_wait() {
            Ok(Some(status)) => {
                group.reaped = true;
                break status;
            }
            Err(_) => break group.wait().map_err(Bounded::Start)?,
            Ok(None) if Instant::now() >= deadline => {
                group.kill();
                group.wait().map_err(Bounded::Start)?;
                return Err(Bounded::TimedOut);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    if timed_out {
        return Err(Bounded::TimedOut);
    }
    Ok(Output { status, stdout, stderr })
}

/// The lock files in a git directory (`*.lock`, at any depth but under `objects/`),
/// without following symbolic links; the scan is bounded ([`LOCK_SCAN_ENTRIES_MAX`]).
fn lock_files(git_dir: &Path) -> Vec<PathBuf> {
    let mut locks = Vec::new();
    let mut pending = vec![git_dir.to_path_buf()];
    let mut seen = 0;
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            seen += 1;
            if seen > LOCK_SCAN_ENTRIES_MAX {
                return locks;
            }
            let Ok(kind) = entry.file_type() else { continue };
            let path = entry.path();
            if kind.is_dir() {
                if !(dir == git_dir && entry.file_name() == "objects") {
                    pending.push(path);
                }
            } else if kind.is_file() && entry.file_name().as_encoded_bytes().ends_with(b".lock") {
                locks.push(path);
            }
        }
    }
    locks.sort();
    locks
}

/// The live processes (other than this one) that name `git_dir` in their command line
/// or work inside it, as (pid, command line): read from `/proc`, skipping processes that
/// cannot be read.
pub(crate) fn processes_using(git_dir: &Path) -> Vec<(u32, String)> {
    let wanted = git_dir.as_os_str().as_encoded_bytes();
    let mine = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut users = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == mine {
            continue;
        }
        let proc_dir = entry.path();
        let Ok(cmdline) = std::fs::read(proc_dir.join("cmdline")) else { continue };
        let names_it = cmdline.split(|&b| b == 0).any(|arg| names_path(arg, wanted));
        let inside =
            std::fs::read_link(proc_dir.join("cwd")).is_ok_and(|cwd| cwd.starts_with(git_dir));
        if names_it || inside {
            let shown: Vec<String> = cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            users.push((pid, bounded(&shown.join(" "))));
        }
    }
    users
}

/// Whether a command-line argument names `path` (or a path inside it), alone or after an
/// `=` (`--git-dir=PATH`).
fn names_path(arg: &[u8], path: &[u8]) -> bool {
    let value = match arg.iter().position(|&b| b == b'=') {
        Some(i) if !arg.starts_with(path) => &arg[i + 1..],
        _ => arg,
    };
    value.strip_prefix(path).is_some_and(|rest| rest.is_empty() || rest[0] == b'/')
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_header_names_its_prerequisites_and_heads() {
        let (id, head) = ("a".repeat(40), "b".repeat(40));
        let bundle = format!("# v2 git bundle\n-{id} msg\n{head} HEAD\n\nPACK");
        let header = bundle_header(bundle.as_bytes()).unwrap();
        assert_eq!(header.prerequisites, [id]);
        assert_eq!(header.heads, [(head, "HEAD".to_owned())]);
        assert!(bundle_header(b"PK\x03\x04").is_err());
        assert!(bundle_header(b"# v2 git bundle\n-xyz\n\n").is_err());
    }

    #[test]
    fn stderr_is_bounded_at_a_character_boundary() {
        let long = "é".repeat(STDERR_BYTES_MAX);
        let cut = bounded(&long);
        assert!(cut.len() <= STDERR_BYTES_MAX + '…'.len_utf8());
        assert_eq!(bounded("short"), "short");
    }

    /// The live processes whose command line holds `marker` (zombies have none).
    fn alive_with(marker: &str) -> Vec<u32> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            if String::from_utf8_lossy(&cmdline).contains(marker) {
                found.push(pid);
            }
        }
        found
    }

    /// Polls until no live process holds `marker`, at most `within`.
    fn gone_within(marker: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if alive_with(marker).is_empty() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_with_everything_it_started() {
        let marker = format!("baton-deadline-{}", std::process::id());
        let mut command = Command::new("sh");
        // The outer shell starts an inner one in the background: both are in the group.
        command.args(["-c", "sh -c 'sleep 30; :' \"$0-inner\" & wait", &marker]).process_group(0);
        let started = Instant::now();
        let result = run_bounded(command, Duration::from_millis(300));
        assert!(matches!(result, Err(Bounded::TimedOut)), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert!(gone_within(&marker, Duration::from_secs(2)), "{:?}", alive_with(&marker));
    }

    #[test]
    fn a_command_within_its_deadline_gives_its_output_at_once() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2; exit 3"]).process_group(0);
        let started = Instant::now();
        let output = run_bounded(command, Duration::from_secs(30)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(output.status.code(), Some(3));
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");
    }

    #[test]
    fn setpriv_is_there_and_git_dies_with_the_thread_that_started_it() {
        // This machine (Debian, util-linux) has setpriv; without it git would run direct.
        assert_eq!(launcher(), Launcher::Setpriv, "install util-linux for setpriv");
        assert!(launcher_notice().is_none());
        let dir = std::env::temp_dir();
        let command = Repo::new(&dir, &dir).base_command();
        let launcher: Vec<_> = std::iter::once(command.get_program())
            .chain(command.get_args().take(4))
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(launcher, ["setpriv", "--pdeathsig", "KILL", "--", "git"]);
        // The same launcher with a shell in git's place, started on a thread that ends
        // once setpriv has become the shell (its argv[0] is `sh`: setpriv set the signal
        // before that; while its own argv shows, it may not have yet).
        let marker = format!("baton-pdeathsig-{}", std::process::id());
        let mut shell = Command::new("setpriv");
        // The shell waits on its standard input (a builtin: no child to outlive it).
        shell.args(["--pdeathsig", "KILL", "--", "sh", "-c", "read line", &marker]);
        shell.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null());
        let watched = marker.clone();
        let mut child = std::thread::spawn(move || {
            let child = shell.spawn().unwrap();
            let cmdline = format!("/proc/{}/cmdline", child.id());
            let deadline = Instant::now() + Duration::from_secs(5);
            while !std::fs::read(&cmdline).is_ok_and(|c| {
                c.starts_with(b"sh\0") && String::from_utf8_lossy(&c).contains(&watched)
            }) && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            child
        })
        .join()
        .unwrap();
        let started = Instant::now();
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn arguments_name_a_path_alone_or_after_an_equals_sign() {
        let path = b"/data/snapshots/w-1/git";
        assert!(names_path(b"/data/snapshots/w-1/git", path));
        assert!(names_path(b"/data/snapshots/w-1/git/index", path));
        assert!(names_path(b"--git-dir=/data/snapshots/w-1/git", path));
        assert!(!names_path(b"/data/snapshots/w-1/git2", path));
        assert!(!names_path(b"/data/snapshots", path));
        assert!(!names_path(b"--snapshots=/data/snapshots", path));
    }
}

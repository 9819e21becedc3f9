//! Run workspaces: the directory a run's tool-loop levels edit, and its snapshots.
//!
//! This is the only crate that touches a run's workspace files. It implements the
//! engine's [`Workspaces`] and [`Workspace`] traits (`baton_engine::workspace`):
//!
//! - [`LocalWorkspaces`] opens `<root>/<run_id>` (or the directory the request names),
//!   creating it, copying the scenario's seed into it the first time, and creating the
//!   Baton-managed git repository in `<snapshots>/<key>/git`, outside the workspace
//!   (`<key>` names the workspace's canonical path: [`snapshot_key`]).
//! - [`LocalWorkspace`] runs the file tools ([`sandbox`]) through a cap-std directory
//!   handle, so no path a model gives can reach outside the workspace, and snapshots,
//!   restores and branches through the managed repository (driven by the `git` command
//!   line, with a scrubbed environment).
//!
//! The boundary: the engine decides when to run a tool, snapshot, restore or branch, and
//! records what happened; this crate does the filesystem and git work and reports
//! outcomes as text the model can act on. Verifiers run programs in [`Workspace::root`]
//! themselves; this crate runs no programs but `git`.

mod handoff;
mod repo;
pub mod sandbox;

pub use handoff::HandOff;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use baton_engine::workspace::{
    ToolOutcome, Workspace, WorkspaceError, WorkspaceRequest, Workspaces,
};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions, Permissions};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::repo::Repo;

/// The most files and directories a seed may hold.
pub const SEED_ENTRIES_MAX: usize = 10_000;

/// The most bytes a seed's files may hold together.
pub const SEED_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// The longest run id accepted, in bytes.
const RUN_ID_BYTES_MAX: usize = 128;

/// Names never copied from a seed: a project's own repository and Baton's directory.
const SEED_SKIPPED: [&str; 2] = [".git", ".baton"];

/// The most bytes of a workspace directory's name kept in its snapshot key.
const KEY_NAME_BYTES_MAX: usize = 40;

/// Opens run workspaces on the local filesystem, each in `<root>/<run_id>` unless the
/// request names a directory, with their snapshots under `snapshots`.
#[derive(Clone, Debug)]
pub struct LocalWorkspaces {
    root: PathBuf,
    snapshots: PathBuf,
    /// Where the workspaces' git runs.
    jail: Arc<baton_jail::Jail>,
    /// The root's name for itself, once read or made ([`Workspaces::home`]).
    home: Arc<std::sync::OnceLock<Option<String>>>,
    /// Where snapshots are pushed for other hosts, when there is a hand-off store.
    handoff: Option<Arc<HandOff>>,
}

impl LocalWorkspaces {
    /// Workspaces created under `root`, their snapshot repositories kept under
    /// `snapshots` (both created when the first workspace is opened). `snapshots` must not
    /// be inside a workspace a model edits: Baton's data directory, beside its database.
    pub fn new(root: impl Into<PathBuf>, snapshots: impl Into<PathBuf>) -> Self {
        LocalWorkspaces {
            root: root.into(),
            snapshots: snapshots.into(),
            jail: Arc::new(baton_jail::Jail::off()),
            home: Arc::default(),
            handoff: None,
        }
    }

    /// The same workspaces, every snapshot pushed to `handoff` and every snapshot this
    /// host lacks fetched from it ([`handoff`]): runs are bound to no data dir.
    pub fn handing_off(mut self, handoff: Arc<HandOff>) -> Self {
        self.handoff = Some(handoff);
        self
    }

    /// The same workspaces, their git run in `jail`.
    pub fn jailed(mut self, jail: Arc<baton_jail::Jail>) -> Self {
        self.jail = jail;
        self
    }

    /// The directory that holds every workspace's snapshot repository.
    pub fn snapshots(&self) -> &Path {
        &self.snapshots
    }

    /// The directory new workspaces are created in.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Workspaces for LocalWorkspaces {
    fn open(&self, request: &WorkspaceRequest) -> Result<Arc<dyn Workspace>, WorkspaceError> {
        check_run_id(&request.run_id)
            .map_err(|message| WorkspaceError::new(self.root.display().to_string(), message))?;
        let dir = match &request.dir {
            Some(dir) => dir.clone(),
            None => self.root.join(&request.run_id),
        };
        let mut workspace = LocalWorkspace::open_jailed(
            &dir,
            request.seed.as_deref(),
            &self.snapshots,
            Arc::clone(&self.jail),
        )?;
        if let Some(handoff) = &self.handoff {
            workspace.handoff = Some((Arc::clone(handoff), request.run_id.clone()));
        }
        Ok(Arc::new(workspace))
    }

    fn hands_off(&self) -> bool {
        self.handoff.is_some()
    }

    /// The first line of `<root>/.home` (no run id can name it), written once by the
    /// first process that asks — this host's name, the root's path and a random suffix —
    /// and read by every other: it moves with the directory, and stays when the host is
    /// renamed. None when it can be neither read nor made.
    fn home(&self) -> Option<String> {
        if self.handoff.is_some() {
            return None;
        }
        self.home.get_or_init(|| home_of(&self.root).ok()).clone()
    }
}

/// The file in a workspaces root that names the place ([`Workspaces::home`]); no run id
/// can be its name.
pub const HOME_FILE: &str = ".home";

/// The longest name a workspaces root's `.home` file may give.
const HOME_CHARS_MAX: usize = 300;

/// Reads `<root>/.home`, making it first when there is none (published whole, by a link
/// that fails when another process published first).
fn home_of(root: &Path) -> std::io::Result<String> {
    let path = root.join(HOME_FILE);
    // Read bounded, and only from a regular file (a pipe there would never end).
    let read = |path: &Path| -> std::io::Result<Option<String>> {
        use std::io::Read as _;
        let file = match std::fs::File::open(path) {
            Ok(file) if file.metadata()?.is_file() => file,
            Ok(_) => {
                return Err(std::io::Error::other(format!("{} is not a file", path.display())));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut text = String::new();
        file.take(4 * HOME_CHARS_MAX as u64 + 2).read_to_string(&mut text)?;
        let line = text.lines().next().unwrap_or_default().trim();
        let fits = !line.is_empty() && line.chars().count() <= HOME_CHARS_MAX;
        Ok(fits.then(|| line.to_owned()))
    };
    if let Some(home) = read(&path)? {
        return Ok(home);
    }
    std::fs::create_dir_all(root)?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    let absolute = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let digest =
        Sha256::digest(format!("{host} {} {} {nanos}", absolute.display(), std::process::id()));
    let suffix: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let mut home = format!("{host}:{} {suffix}", absolute.display());
    if home.chars().count() > HOME_CHARS_MAX {
        home = format!("{host} {suffix}").chars().take(HOME_CHARS_MAX).collect();
    }
    let draft = root.join(format!("{HOME_FILE}.{}.{nanos}", std::process::id()));
    std::fs::write(&draft, format!("{home}\n"))?;
    let published = std::fs::hard_link(&draft, &path);
    let _ = std::fs::remove_file(&draft);
    match published {
        Ok(()) => Ok(home),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(&path)?
            .ok_or_else(|| std::io::Error::other(format!("{} names no home", path.display()))),
        Err(e) => Err(e),
    }
}

/// Refuses a run id that is not a plain name (it becomes a directory name).
fn check_run_id(run_id: &str) -> Result<(), String> {
    let plain = run_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if run_id.is_empty() || run_id.len() > RUN_ID_BYTES_MAX || !plain {
        return Err(format!(
            "run id {run_id:?} cannot name a workspace directory; a run id is 1 to \
             {RUN_ID_BYTES_MAX} letters, digits, '-' or '_'"
        ));
    }
    Ok(())
}

/// The name of a workspace's snapshot directory: the directory's own name (letters,
/// digits, `-`, `_`; for people who look) and 16 hex digits of the sha256 of its
/// canonical path, so the same directory, however it is spelled, always finds its
/// snapshots and two directories never share them.
pub fn snapshot_key(canonical: &Path) -> String {
    let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let mut key: String = canonical
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(KEY_NAME_BYTES_MAX)
        .collect();
    if key.is_empty() {
        key.push_str("workspace");
    }
    key.push('-');
    for byte in &digest[..8] {
        let _ = write!(key, "{byte:02x}");
    }
    key
}

/// One run's workspace on the local filesystem.
#[derive(Debug)]
pub struct LocalWorkspace {
    /// The workspace directory; every file tool goes through it.
    dir: Dir,
    /// The directory's absolute path, for verifiers and git.
    root: PathBuf,
    repo: Repo,
    /// What opening it repaired, for the run's log ([`Workspace::take_notices`]).
    notices: Mutex<Vec<String>>,
    /// The hand-off store and the run whose objects this workspace pushes and fetches.
    handoff: Option<(Arc<HandOff>, String)>,
    /// The last snapshot this process pushed: the next push holds only what is new since.
    pushed: Mutex<Option<String>>,
    /// Held while the workspace is open (`<snapshots>/<key>/lock`, locked exclusively).
    _lock: std::fs::File,
}

impl LocalWorkspace {
    /// Opens the workspace in `dir`, creating the directory if it is missing, with its
    /// snapshot repository in `snapshots/<key>` ([`snapshot_key`]). The first time (no
    /// repository yet), `seed` is copied in if the directory is empty (`.baton` aside)
    /// and the repository is created; later opens change nothing. A `.baton/git` left in
    /// the workspace by an older Baton is neither read nor changed.
    pub fn open(dir: &Path, seed: Option<&Path>, snapshots: &Path) -> Result<Self, WorkspaceError> {
        LocalWorkspace::open_jailed(dir, seed, snapshots, Arc::new(baton_jail::Jail::off()))
    }

    /// [`LocalWorkspace::open`], its git run in `jail`.
    pub fn open_jailed(
        dir: &Path,
        seed: Option<&Path>,
        snapshots: &Path,
        jail: Arc<baton_jail::Jail>,
    ) -> Result<Self, WorkspaceError> {
        let failed = |what: &str, e: io::Error| {
            WorkspaceError::new(
                dir.display().to_string(),
                format!("{what}: {e}; check that the path is a directory Baton may write"),
            )
        };
        std::fs::create_dir_all(dir).map_err(|e| failed("cannot create the directory", e))?;
        let root = std::fs::canonicalize(dir).map_err(|e| failed("cannot resolve the path", e))?;
        let handle = Dir::open_ambient_dir(&root, ambient_authority())
            .map_err(|e| failed("cannot open the directory", e))?;
        let home = snapshots.join(snapshot_key(&root));
        let data_failed = |what: &str, e: io::Error| {
            WorkspaceError::new(
                dir.display().to_string(),
                format!(
                    "{what} {}: {e}; check that Baton's data directory is writable",
                    home.display()
                ),
            )
        };
        std::fs::create_dir_all(&home).map_err(|e| data_failed("cannot create", e))?;
        let home = std::fs::canonicalize(&home).map_err(|e| data_failed("cannot resolve", e))?;
        if home.starts_with(&root) && !home.starts_with(root.join(".baton")) {
            return Err(WorkspaceError::new(
                dir.display().to_string(),
                format!(
                    "the snapshot directory {} is inside the workspace, where a model could \
                     change it; keep Baton's data directory (--db, --snapshots) outside the \
                     workspace or in its .baton directory",
                    home.display()
                ),
            ));
        }
        // One process at a time drives a workspace: the lock is the operating system's, so
        // a process that dies leaves it free for the run's next driver.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(home.join("lock"))
            .map_err(|e| data_failed("cannot open the lock in", e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(WorkspaceError::transient(
                    dir.display().to_string(),
                    "another process is driving a run in this workspace; wait for it to finish or cancel that run (`baton cancel RUN`)",
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(data_failed("cannot lock the lock in", e));
            }
        }
        let repo = Repo::new(&root, &home).jailed(jail);
        // Holding the driver lock, with every git Baton starts dying with its driver: a
        // lock file in the repository now was left by a git that died (checked on /proc).
        let mut notices = repo.recover_stale_locks()?;
        notices.extend(repo::launcher_notice());
        let workspace = LocalWorkspace {
            dir: handle,
            root,
            repo,
            notices: Mutex::new(notices),
            handoff: None,
            pushed: Mutex::new(None),
            _lock: lock,
        };
        if !workspace.repo.exists() {
            if let Some(seed) = seed
                && workspace.is_empty()?
            {
                workspace.copy_seed(seed)?;
            }
            workspace.repo.init()?;
        }
        Ok(workspace)
    }

    /// Whether the workspace holds nothing but `.baton`.
    fn is_empty(&self) -> Result<bool, WorkspaceError> {
        let entries = self.dir.entries().map_err(|e| self.error(format!("cannot list it: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| self.error(format!("cannot list it: {e}")))?;
            if entry.file_name() != ".baton" {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Copies the seed directory's regular files and directories into the workspace
    /// (symbolic links and special files are skipped). The seed is measured first, so a
    /// seed over the limits copies nothing.
    fn copy_seed(&self, seed: &Path) -> Result<(), WorkspaceError> {
        let seed_error = |message: String| {
            self.error(format!("cannot copy the seed {}: {message}", seed.display()))
        };
        let plan = plan_seed(seed).map_err(seed_error)?;
        let mut budget = SEED_BYTES_MAX;
        for entry in &plan {
            match entry {
                SeedEntry::Dir(rel) => self
                    .dir
                    .create_dir_all(rel)
                    .map_err(|e| seed_error(format!("{}: {e}", rel.display())))?,
                SeedEntry::File(rel) => {
                    let copied = self
                        .copy_seed_file(&seed.join(rel), rel, budget)
                        .map_err(|e| seed_error(format!("{}: {e}", rel.display())))?;
                    budget -= copied;
                }
            }
        }
        Ok(())
    }

    /// Copies one seed file to `rel` in the workspace, at most `budget` bytes of it;
    /// returns how many bytes it copied.
    fn copy_seed_file(&self, from: &Path, rel: &Path, budget: u64) -> io::Result<u64> {
        let source = std::fs::File::open(from)?;
        let metadata = source.metadata()?;
        if !metadata.is_file() {
            return Err(io::Error::other("it is no longer a regular file"));
        }
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        let mut target = self.dir.open_with(rel, &options)?;
        let copied = io::copy(&mut source.take(budget + 1), &mut target)?;
        if copied > budget {
            return Err(io::Error::other(format!(
                "the seed grew over {SEED_BYTES_MAX} bytes while it was copied"
            )));
        }
        target.set_permissions(Permissions::from_std(metadata.permissions()))?;
        Ok(copied)
    }

    fn error(&self, message: String) -> WorkspaceError {
        WorkspaceError::new(self.root.display().to_string(), message)
    }

    /// The hand-off store failed: transient, the run stays resumable.
    fn store_failed(&self, message: &str) -> WorkspaceError {
        WorkspaceError::transient(
            self.root.display().to_string(),
            format!("{message}; the run stays resumable once the store answers"),
        )
    }

    /// Pushes snapshot `commit` to the hand-off store (nothing without one): a bundle of
    /// what this process has not pushed before. A store that fails is transient.
    fn push(&self, commit: &str) -> Result<(), WorkspaceError> {
        let Some((handoff, run_id)) = &self.handoff else { return Ok(()) };
        let mut pushed = self.pushed.lock().unwrap_or_else(PoisonError::into_inner);
        if pushed.as_deref() == Some(commit) {
            return Ok(());
        }
        let bundle = self.repo.bundle(commit, pushed.as_deref())?;
        handoff.put(run_id, commit, bundle).map_err(|message| self.store_failed(&message))?;
        *pushed = Some(commit.to_owned());
        Ok(())
    }

    /// Makes sure the repository holds `snapshot`, fetching it (and the snapshots it
    /// builds on) from the hand-off store when there is one. False: neither has it.
    fn fetched(&self, snapshot: &str) -> Result<bool, WorkspaceError> {
        if self.repo.holds(snapshot)? {
            return Ok(true);
        }
        let Some((handoff, run_id)) = &self.handoff else { return Ok(false) };
        if !repo::is_snapshot_id(snapshot) {
            return Ok(false);
        }
        let mut wanted = vec![snapshot.to_owned()];
        // What the chain's bundles hold together, bounded as one bundle is.
        let mut bytes: u64 = 0;
        let mut bundles: Vec<Vec<u8>> = Vec::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        while let Some(id) = wanted.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            if bundles.len() >= handoff::CHAIN_DEPTH_MAX {
                return Err(self.error(format!(
                    "snapshot {snapshot} builds on more than {} bundles in {}; the run cannot be handed off",
                    handoff::CHAIN_DEPTH_MAX,
                    handoff.shown()
                )));
            }
            let bundle = match handoff.get(run_id, &id) {
                Ok(bundle) => bundle,
                Err(handoff::HandOffError::Missing(_)) if id == snapshot => return Ok(false),
                Err(handoff::HandOffError::Missing(message)) => {
                    return Err(self.error(format!(
                        "snapshot {snapshot} builds on {id}, which neither this host nor the store holds: {message}"
                    )));
                }
                Err(handoff::HandOffError::Failed(message)) => {
                    return Err(self.store_failed(&message));
                }
            };
            bytes += bundle.len() as u64;
            if bytes > handoff::BUNDLE_BYTES_MAX {
                return Err(self.error(format!(
                    "snapshot {snapshot} builds on bundles of more than {} bytes in {}; the run cannot be handed off",
                    handoff::BUNDLE_BYTES_MAX,
                    handoff.shown()
                )));
            }
            let header = repo::bundle_header(&bundle).map_err(|why| {
                self.error(format!("the store's object for snapshot {id} is unusable: {why}"))
            })?;
            for prerequisite in header.prerequisites {
                if !self.repo.holds(&prerequisite)? {
                    wanted.push(prerequisite);
                }
            }
            bundles.push(bundle);
        }
        // Prerequisites first: each was found after what needs it.
        for bundle in bundles.iter().rev() {
            self.repo.unbundle(bundle)?;
        }
        let held = self.repo.holds(snapshot)?;
        if held {
            // The store has it: this process's next push need hold only what is newer.
            let mut pushed = self.pushed.lock().unwrap_or_else(PoisonError::into_inner);
            pushed.get_or_insert_with(|| snapshot.to_owned());
        }
        Ok(held)
    }

    /// [`LocalWorkspace::fetched`], an error when neither this host nor the store has it.
    fn require(&self, snapshot: &str) -> Result<(), WorkspaceError> {
        if self.fetched(snapshot)? {
            return Ok(());
        }
        Err(self.error(match &self.handoff {
            Some((handoff, _)) => format!(
                "snapshot {snapshot} is neither in this host's repository nor in {}",
                handoff.shown()
            ),
            None => format!("snapshot {snapshot} is not in the workspace's repository"),
        }))
    }
}

/// One thing to copy from a seed, by its path relative to the seed.
#[derive(Debug)]
enum SeedEntry {
    Dir(PathBuf),
    File(PathBuf),
}

/// Lists a seed's directories (parents first) and regular files, within the limits.
fn plan_seed(seed: &Path) -> Result<Vec<SeedEntry>, String> {
    let metadata = std::fs::metadata(seed).map_err(|e| e.to_string())?;
    if !metadata.is_dir() {
        return Err("it is not a directory".to_owned());
    }
    let mut plan = Vec::new();
    let mut bytes: u64 = 0;
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let listing = std::fs::read_dir(seed.join(&rel))
            .map_err(|e| format!("cannot list {}: {e}", shown_rel(&rel)))?;
        let mut names = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", shown_rel(&rel)))?;
            names.push(entry.file_name());
        }
        names.sort();
        for name in names {
            if SEED_SKIPPED.iter().any(|s| name == *s) {
                continue;
            }
            let child = rel.join(&name);
            let metadata = std::fs::symlink_metadata(seed.join(&child))
                .map_err(|e| format!("cannot read {}: {e}", child.display()))?;
            if metadata.is_dir() {
                pending.push(child.clone());
                plan.push(SeedEntry::Dir(child));
            } else if metadata.is_file() {
                bytes = bytes.saturating_add(metadata.len());
                plan.push(SeedEntry::File(child));
            } else {
                continue;
            }
            if plan.len() > SEED_ENTRIES_MAX {
                return Err(format!(
                    "it holds more than {SEED_ENTRIES_MAX} files and directories; use a smaller \
                     seed"
                ));
            }
            if bytes > SEED_BYTES_MAX {
                return Err(format!(
                    "its files hold more than {SEED_BYTES_MAX} bytes; use a smaller seed"
                ));
            }
        }
    }
    Ok(plan)
}

/// A seed-relative directory as messages name it.
fn shown_rel(rel: &Path) -> String {
    if rel.as_os_str().is_empty() { ".".to_owned() } else { rel.display().to_string() }
}

impl Workspace for LocalWorkspace {
    fn root(&self) -> &Path {
        &self.root
    }

    fn execute(
        &self,
        tool: &str,
        arguments: &Value,
        touched: &mut BTreeSet<String>,
        max_touched: usize,
    ) -> ToolOutcome {
        sandbox::execute(&self.dir, tool, arguments, touched, max_touched)
    }

    fn snapshot(&self, message: &str) -> Result<String, WorkspaceError> {
        let id = self.repo.snapshot(message)?;
        self.push(&id)?;
        Ok(id)
    }

    fn restore(&self, snapshot: &str) -> Result<(), WorkspaceError> {
        if self.handoff.is_some() {
            self.require(snapshot)?;
        }
        self.repo.restore(snapshot)
    }

    fn branch(&self, name: &str, snapshot: &str) -> Result<(), WorkspaceError> {
        if self.handoff.is_some() {
            self.require(snapshot)?;
        }
        self.repo.branch(name, snapshot)
    }

    fn holds(&self, snapshot: &str) -> Result<bool, WorkspaceError> {
        self.fetched(snapshot)
    }

    fn adopt(&self, from: &Path, snapshot: &str) -> Result<(), WorkspaceError> {
        let failed = |e: io::Error| {
            WorkspaceError::new(
                self.root.display().to_string(),
                format!("the forked run's workspace {}: {e}", from.display()),
            )
        };
        let from = std::fs::canonicalize(from).map_err(failed)?;
        let snapshots = self.repo.home().parent().unwrap_or(Path::new("."));
        self.repo.adopt_objects(&snapshots.join(snapshot_key(&from)))?;
        self.repo.restore(snapshot)
    }

    fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_plain_names() {
        assert!(check_run_id("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b").is_ok());
        assert!(check_run_id("run_1").is_ok());
        for bad in ["", "..", "a/b", "a b", "a\0", "é", &"x".repeat(RUN_ID_BYTES_MAX + 1)] {
            assert!(check_run_id(bad).is_err(), "{bad:?} was accepted");
        }
    }
}

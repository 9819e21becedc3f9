//! The workspace, as the kernel sees it: the directory a run's tool-loop levels edit
//! through file tools, and the snapshots that make a level's edits all-or-nothing.
//!
//! The kernel names no filesystem API: [`Workspaces`] opens a run's workspace and
//! [`Workspace`] runs the file tools inside it and snapshots it. `baton-workspace`
//! implements both (cap-std for the sandbox, a Baton-managed git repository for the
//! snapshots).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::event::{EventData, NewEvent};

/// The file tools a tool-loop level offers, in the order models see them. `finish` is
/// handled by the kernel; the others by [`Workspace::execute`].
pub const FILE_TOOLS: [&str; 6] =
    ["read_file", "write_file", "edit_file", "list_dir", "delete_file", "finish"];

/// What a file tool did, as the model will read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The tool result's text: the file's lines, the listing, what changed, or why the
    /// call was refused (a message the model can act on).
    pub content: String,
    pub is_error: bool,
    /// The path the call created (relative to the workspace, `/`-separated), for
    /// `file_created`.
    pub created: Option<String>,
}

impl ToolOutcome {
    /// A refused or failed call.
    pub fn error(message: impl Into<String>) -> Self {
        ToolOutcome { content: message.into(), is_error: true, created: None }
    }

    /// A call that did what it was asked.
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutcome { content: content.into(), is_error: false, created: None }
    }
}

/// Why a workspace could not be opened, snapshotted or restored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("workspace {path}: {message}")]
pub struct WorkspaceError {
    pub path: String,
    pub message: String,
    /// The failure says nothing about the run: another process held a lock, git was
    /// killed or ran out of time. A step that meets one stops without recording anything,
    /// and the run stays resumable (the engine's `Error::Interrupted`).
    pub transient: bool,
}

impl WorkspaceError {
    /// A failure that a later try would meet again (a bad path, a missing snapshot).
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        WorkspaceError { path: path.into(), message: message.into(), transient: false }
    }

    /// A failure that says nothing about the run ([`WorkspaceError::transient`]).
    pub fn transient(path: impl Into<String>, message: impl Into<String>) -> Self {
        WorkspaceError { path: path.into(), message: message.into(), transient: true }
    }
}

/// One run's workspace.
pub trait Workspace: Send + Sync + std::fmt::Debug {
    /// The directory, for verifiers that run programs in it.
    fn root(&self) -> &Path;

    /// Runs one file tool (`read_file`, `write_file`, `edit_file`, `list_dir`,
    /// `delete_file`) with its JSON arguments. Never fails: a bad argument, a path outside
    /// the workspace or an I/O error is an error outcome. Every path a write tool changed
    /// is added to `touched` (relative, `/`-separated); a write that would make `touched`
    /// larger than `max_touched` is refused.
    fn execute(
        &self,
        tool: &str,
        arguments: &Value,
        touched: &mut BTreeSet<String>,
        max_touched: usize,
    ) -> ToolOutcome;

    /// Records the workspace's current files; returns the snapshot's id.
    fn snapshot(&self, message: &str) -> Result<String, WorkspaceError>;

    /// Puts the workspace back to a snapshot: changed files restored, files created since
    /// removed whatever ignore files the workspace holds (only the build output and caches
    /// the implementation leaves out of snapshots, such as `target/`, are kept).
    fn restore(&self, snapshot: &str) -> Result<(), WorkspaceError>;

    /// Names a snapshot with a branch of the managed repository.
    fn branch(&self, name: &str, snapshot: &str) -> Result<(), WorkspaceError>;

    /// Whether `snapshot` is one of this workspace's (a process that does not see the
    /// run's snapshots — another host, another data directory — finds it is not).
    fn holds(&self, snapshot: &str) -> Result<bool, WorkspaceError> {
        let _ = snapshot;
        Ok(true)
    }

    /// Brings the snapshots of another workspace (the run a fork was made from, at
    /// `from`) into this one and restores `snapshot`, which keeps its id here.
    fn adopt(&self, from: &Path, snapshot: &str) -> Result<(), WorkspaceError> {
        let _ = (from, snapshot);
        Err(WorkspaceError::new(
            self.root().display().to_string(),
            "this kind of workspace cannot take another workspace's snapshots, so the run cannot be forked with its files",
        ))
    }

    /// What opening the workspace had to repair and the run's log should say (a stale
    /// lock removed, git started without dying with its driver), each once: the engine
    /// records them as warnings.
    fn take_notices(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Where a run's workspace comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceRequest {
    pub run_id: String,
    /// The directory to use, when the user named one or the log recorded one.
    pub dir: Option<PathBuf>,
    /// Files to copy into a new workspace (the scenario's seed directory).
    pub seed: Option<PathBuf>,
}

/// Opens run workspaces.
pub trait Workspaces: Send + Sync + std::fmt::Debug {
    /// Opens a run's workspace, creating and seeding it the first time (a seed is copied
    /// only into a directory that is new or empty); opening it again gives the same
    /// directory and repository.
    fn open(&self, request: &WorkspaceRequest) -> Result<Arc<dyn Workspace>, WorkspaceError>;

    /// The name the place these workspaces live goes by, the same for every process that
    /// opens them there (it is kept beside them): a run with a workspace records it, and
    /// only a process whose workspaces go by the same name may drive the run's job. None:
    /// the workspaces are wherever every process sees them.
    fn home(&self) -> Option<String> {
        None
    }

    /// Whether these workspaces hand snapshots off between hosts (an object store): a
    /// process that does not see a run's workspace directory opens one of its own and
    /// fetches the run's snapshots into it.
    fn hands_off(&self) -> bool {
        false
    }
}

/// How an engine gives runs their workspaces.
#[derive(Clone, Debug)]
pub struct WorkspaceSetup {
    pub opener: Arc<dyn Workspaces>,
    /// The directory new runs use (`--workspace`), instead of one per run.
    pub dir: Option<PathBuf>,
    /// The branch a completed run's result is committed on.
    pub branch: Option<String>,
}

/// Runs workspace I/O (file copies, git) on the blocking pool, off the async workers.
pub async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, WorkspaceError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(WorkspaceError::new(String::new(), format!("workspace task failed: {e}")))
    })
}

/// A workspace written only while its run's hold is this process's ([`crate::store::Fence`]):
/// once another process has taken the run over, every write — a file tool that changes
/// files, a snapshot, a restore, a branch — is refused, and reads go on.
#[derive(Debug)]
pub struct FencedWorkspace {
    inner: Arc<dyn Workspace>,
    fence: crate::store::Fence,
}

impl FencedWorkspace {
    pub fn new(inner: Arc<dyn Workspace>, fence: crate::store::Fence) -> Self {
        FencedWorkspace { inner, fence }
    }

    fn check(&self) -> Result<(), WorkspaceError> {
        self.fence.check().map_err(|why| {
            WorkspaceError::new(self.inner.root().display().to_string(), format!("refused: {why}"))
        })
    }
}

impl Workspace for FencedWorkspace {
    fn root(&self) -> &Path {
        self.inner.root()
    }

    fn execute(
        &self,
        tool: &str,
        arguments: &Value,
        touched: &mut BTreeSet<String>,
        max_touched: usize,
    ) -> ToolOutcome {
        if !matches!(tool, "read_file" | "list_dir")
            && let Err(e) = self.check()
        {
            return ToolOutcome::error(e.message);
        }
        self.inner.execute(tool, arguments, touched, max_touched)
    }

    fn snapshot(&self, message: &str) -> Result<String, WorkspaceError> {
        self.check()?;
        self.inner.snapshot(message)
    }

    fn restore(&self, snapshot: &str) -> Result<(), WorkspaceError> {
        self.check()?;
        self.inner.restore(snapshot)
    }

    fn branch(&self, name: &str, snapshot: &str) -> Result<(), WorkspaceError> {
        self.check()?;
        self.inner.branch(name, snapshot)
    }

    fn adopt(&self, from: &Path, snapshot: &str) -> Result<(), WorkspaceError> {
        self.check()?;
        self.inner.adopt(from, snapshot)
    }

    fn holds(&self, snapshot: &str) -> Result<bool, WorkspaceError> {
        self.inner.holds(snapshot)
    }

    fn take_notices(&self) -> Vec<String> {
        self.inner.take_notices()
    }
}

/// `workspace`, fenced by `guard`'s hold when that hold can run out.
pub fn fenced(
    workspace: Option<Arc<dyn Workspace>>,
    guard: &crate::store::RunGuard,
) -> Option<Arc<dyn Workspace>> {
    match (workspace, guard.fence()) {
        (Some(w), Some(fence)) => Some(Arc::new(FencedWorkspace::new(w, fence))),
        (w, _) => w,
    }
}

/// What opening a workspace had to repair (a stale lock removed), as run warnings.
pub(crate) fn workspace_notices(workspace: Option<&Arc<dyn Workspace>>) -> Vec<NewEvent> {
    let Some(workspace) = workspace else { return Vec::new() };
    workspace
        .take_notices()
        .into_iter()
        .map(|message| NewEvent::run(EventData::Warning(crate::event::Warning { message })))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::store::Fence;

    /// A workspace that only counts what reached it.
    #[derive(Debug, Default)]
    struct Counting {
        calls: Mutex<Vec<String>>,
    }

    impl Workspace for Counting {
        fn root(&self) -> &Path {
            Path::new("/nowhere")
        }
        fn execute(
            &self,
            tool: &str,
            _: &Value,
            _: &mut BTreeSet<String>,
            _: usize,
        ) -> ToolOutcome {
            self.calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(tool.to_owned());
            ToolOutcome::ok("done")
        }
        fn snapshot(&self, _: &str) -> Result<String, WorkspaceError> {
            self.calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push("snapshot".to_owned());
            Ok("s1".to_owned())
        }
        fn restore(&self, _: &str) -> Result<(), WorkspaceError> {
            self.calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push("restore".to_owned());
            Ok(())
        }
        fn branch(&self, _: &str, _: &str) -> Result<(), WorkspaceError> {
            self.calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push("branch".to_owned());
            Ok(())
        }
    }

    #[test]
    fn a_lost_hold_refuses_every_write_and_lets_reads_through() {
        let inner = Arc::new(Counting::default());
        let lost = Arc::new(AtomicBool::new(false));
        let fence = {
            let lost = Arc::clone(&lost);
            Fence::new(move || {
                if lost.load(Ordering::SeqCst) { Err("taken over".to_owned()) } else { Ok(()) }
            })
        };
        let fenced = FencedWorkspace::new(Arc::clone(&inner) as Arc<dyn Workspace>, fence);
        let mut touched = BTreeSet::new();
        let args = serde_json::json!({"path": "a.txt", "content": "x"});
        assert!(!fenced.execute("write_file", &args, &mut touched, 10).is_error);
        assert!(fenced.snapshot("m").is_ok());
        lost.store(true, Ordering::SeqCst);
        for tool in ["write_file", "edit_file", "delete_file"] {
            let out = fenced.execute(tool, &args, &mut touched, 10);
            assert!(out.is_error && out.content.contains("taken over"), "{tool}: {out:?}");
        }
        assert!(fenced.snapshot("m").is_err());
        assert!(fenced.restore("s1").is_err());
        assert!(fenced.branch("b", "s1").is_err());
        assert!(!fenced.execute("read_file", &args, &mut touched, 10).is_error);
        assert!(!fenced.execute("list_dir", &args, &mut touched, 10).is_error);
        let calls = inner.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        assert_eq!(
            calls,
            ["write_file", "snapshot", "read_file", "list_dir"],
            "nothing refused reached the workspace"
        );
    }
}

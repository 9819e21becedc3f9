//! The workspace a run recorded, opened again for a driver that goes on with it — fetched
//! from the hand-off store when this process does not see it (another host, another data
//! directory) and there is one, refused when there is none, so that no run goes on in an
//! empty workspace.

use std::sync::Arc;

use super::{Engine, Error};
use crate::state::RunState;
use crate::workspace::{Workspace, WorkspaceRequest, off_thread};

impl Engine {
    /// Opens the workspace a run recorded, to resume it or to settle it when it ends.
    pub(crate) async fn recorded_workspace(
        &self,
        run_id: &str,
        state: &RunState,
    ) -> Result<Option<Arc<dyn Workspace>>, Error> {
        let Some(info) = &state.workspace else { return Ok(None) };
        let Some(setup) = &self.runtime.workspaces else {
            return Err(Error::NoWorkspaces { scenario: state.scenario_id.clone() });
        };
        // A process that does not see the run's workspace (another host, another data
        // directory) must not go on in an empty one: the run stays as it is, for a process
        // that does.
        let elsewhere = |why: String| Error::Refused {
            run_id: run_id.to_owned(),
            message: format!(
                "its workspace is not here: {why}; drive it from a process that shares the data directory (or the --snapshots) of the one that started it, or give every process the same --object-store"
            ),
        };
        // With a hand-off store, a host that does not have the directory opens the run's
        // workspace in its own data dir and restores it from the store.
        let here = std::path::Path::new(&info.dir).is_dir();
        let moved = !here && setup.opener.hands_off();
        if !here && !moved {
            return Err(elsewhere(format!("{} is not a directory on this host", info.dir)));
        }
        let request = WorkspaceRequest {
            run_id: run_id.to_owned(),
            dir: (!moved).then(|| std::path::PathBuf::from(&info.dir)),
            seed: None,
        };
        let opener = Arc::clone(&setup.opener);
        let workspace = off_thread(move || opener.open(&request)).await?;
        let head = state.workspace_head.clone().unwrap_or_else(|| info.base.clone());
        let probe = Arc::clone(&workspace);
        let at = head.clone();
        if !off_thread(move || probe.holds(&at)).await? {
            let kept = if setup.opener.hands_off() {
                "this host's snapshots or the hand-off store"
            } else {
                "the snapshots this process keeps"
            };
            return Err(elsewhere(format!(
                "its snapshot {head} is not among {kept} for {}",
                info.dir
            )));
        }
        if moved {
            // The files this host has never seen: the last snapshot's (an attempt cut
            // short goes on from its log, over these).
            let files = Arc::clone(&workspace);
            off_thread(move || files.restore(&head)).await?;
        }
        Ok(Some(workspace))
    }
}

//! What driving a run ends with: where it left the run ([`Outcome`]), or why the engine
//! could not do what was asked ([`Error`]).

use crate::state::Status;
use crate::store;
use crate::workspace::WorkspaceError;

/// Why the engine could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("run {run_id} belongs to scenario `{expected}`, not `{found}`")]
    WrongScenario { run_id: String, expected: String, found: String },
    #[error(
        "run {run_id} was started from scenario `{scenario}` with checksum {recorded}, but the loaded one has {loaded}; resume it with the scenario files it started with"
    )]
    ChecksumChanged { run_id: String, scenario: String, recorded: String, loaded: String },
    #[error("run {run_id}: {message}")]
    Refused { run_id: String, message: String },
    /// The approver's data was refused; nothing was recorded.
    #[error("run {run_id}, approval request {request_id}: {message}; nothing was recorded")]
    Data { run_id: String, request_id: String, message: String },
    /// What a person sent was refused as it is (an empty or oversized steering message);
    /// nothing was recorded.
    #[error("run {run_id}: {message}; nothing was recorded")]
    Invalid { run_id: String, message: String },
    #[error("template: {0}")]
    Template(String),
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(
        "scenario `{scenario}` has tool_loop levels, which need a workspace, and this engine was set up without one; give the engine a `WorkspaceSetup`"
    )]
    NoWorkspaces { scenario: String },
}

/// Where a call to [`Engine::drive`] left the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The run ended; its status says how.
    Finished(Status),
    /// The run waits for a person.
    Paused,
    /// The run stopped without ending (`run_interrupted`: every model unavailable, or the
    /// driver was stopped); `baton resume` continues it.
    Interrupted(String),
    /// The run waits for its child runs ([`Engine::drive_tree`] drives them).
    Waiting,
    /// The driver let go of the run between two steps ([`Engine::drain`]): nothing was
    /// cut and no interruption recorded; the run is `running`, for any driver to go on.
    Released,
}

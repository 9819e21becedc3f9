//! The Baton kernel: events, the projection, the pure planner, the executor and the
//! runners' interface.
//!
//! `fold(events) -> RunState` and `plan(&Scenario, &RunState) -> Step` do no I/O and read
//! no clock. The executor hands each step to the embedder's [`runner::LevelRunner`] and
//! appends what happened. Everything reaches the world only through the traits defined
//! here — [`model::ModelProvider`], [`verifier::Verifier`], [`redact::Redact`],
//! [`workspace::Workspaces`], [`store::EventStore`], [`clock::Clock`] — so the kernel never
//! names a concrete provider, store, verifier or runner, starts no program and opens no
//! file.

pub mod cancel;
pub mod cassette;
pub mod chain;
pub mod clock;
pub mod decide;
pub mod event;
pub mod exec;
pub mod fan_in;
pub mod forecast;
pub mod fork;
pub mod future;
pub mod gate_ctx;
pub mod job;
pub mod jobs;
pub mod join;
pub mod limits;
pub mod model;
pub mod outcome;
pub mod pinning;
pub mod plan;
pub mod redact;
pub mod render;
pub mod replay;
pub mod replay_drive;
pub mod reservation;
pub mod run_ids;
pub mod runner;
pub mod scratchpad;
pub mod state;
pub mod steering;
pub mod store;
pub mod textdiff;
pub mod tools;
pub mod verifier;
pub mod wave;
pub mod wave_actions;
pub mod wave_drive;
pub mod wave_plan;
pub mod workspace;

pub use decide::Decision;
pub use exec::{Engine, Outcome};
pub use state::{RunState, Status, fold};

//! Forks: a new run whose log begins as another run's did, up to an event, and goes on
//! from there with edits — another input, scratchpad notes, another version of the
//! scenario — and a workspace of its own restored to the snapshot that event had reached.
//!
//! The copied events keep their times; the fork's first own event is `run_forked`, which
//! says what it was forked from and what changed. A fork is made at a *fork point*
//! ([`fork_points`]): after an event where no level is in flight (a level boundary, the
//! start) or the run waits for a person, before the run ended, and before it started any
//! child run (a child's id comes from its parent's, which a fork does not share).

use std::sync::Arc;

use baton_scenario::Scenario;
use serde_json::{Map, Value};

use crate::event::{Event, EventData, NewEvent, RunForked, ScenarioUpgraded, WorkspaceInfo};
use crate::exec::{Engine, Error};
use crate::state::{RunState, Status};
use crate::store::RunRecord;
use crate::workspace::off_thread;

/// What a fork changes.
#[derive(Clone, Debug, Default)]
pub struct ForkEdits {
    pub input: Option<String>,
    /// Scratchpad keys to set (null removes one).
    pub scratchpad: Map<String, Value>,
    /// Where the fork's answers come from (`script:PATH`, `cassette:PATH`; none for the
    /// configured providers).
    pub model_source: Option<String>,
}

/// The events of `events` after which a fork may be made, in order.
pub fn fork_points(events: &[Event]) -> Vec<u64> {
    let mut state = RunState::default();
    let mut points = Vec::new();
    for e in events {
        state.apply(e);
        if state.finished.is_some() || !state.children.is_empty() {
            break;
        }
        if state.in_flight.is_none() || state.awaiting_person() {
            points.push(e.seq);
        }
    }
    points
}

impl Engine {
    /// Creates `new_run` as a fork of `from` at event `at`, to go on with `scenario` (the
    /// copied run's version, or another version of its scenario that has every level the
    /// copied events ran). Returns the fork's state; drive it with [`Engine::drive_tree`].
    pub async fn fork(
        &self,
        from: &str,
        at: u64,
        new_run: &str,
        scenario: &Arc<Scenario>,
        edits: ForkEdits,
    ) -> Result<RunState, Error> {
        let refuse = |message: String| Error::Refused { run_id: from.to_owned(), message };
        let events = self.store.load(from, 0).await?;
        let last = events.last().map_or(0, |e| e.seq);
        if at == 0 || at > last {
            return Err(refuse(format!(
                "there is no event {at}: the run's events are 1 to {last}"
            )));
        }
        let prefix: Vec<Event> = events.iter().take_while(|e| e.seq <= at).cloned().collect();
        let mut state = RunState::default();
        for e in &prefix {
            state.apply(e);
        }
        if let Some(parent) = &state.parent {
            return Err(refuse(format!(
                "it is a child run of {}; fork its job's root",
                parent.parent_run_id
            )));
        }
        if let Some(started) =
            prefix.iter().find(|e| matches!(e.data, EventData::ChildRunStarted(_)))
        {
            return Err(refuse(format!(
                "it started a child run at event {}; a fork is made before a run starts children (their ids come from their parent's)",
                started.seq
            )));
        }
        if let Some(end) = prefix.iter().find(|e| matches!(e.data, EventData::ScenarioFinished(_)))
        {
            return Err(refuse(format!(
                "it had ended by event {}; fork it at an earlier event",
                end.seq
            )));
        }
        let points = fork_points(&events);
        if !points.contains(&at) {
            let before = points.iter().rev().find(|p| **p < at);
            let after = points.iter().find(|p| **p > at);
            let near: Vec<String> = before.into_iter().chain(after).map(u64::to_string).collect();
            return Err(refuse(format!(
                "event {at} is inside a level's attempt; a fork is made at a level boundary or a pause (the nearest: {})",
                if near.is_empty() { "none".to_owned() } else { near.join(", ") }
            )));
        }
        if scenario.id != state.scenario_id {
            return Err(Error::WrongScenario {
                run_id: from.to_owned(),
                expected: state.scenario_id.clone(),
                found: scenario.id.clone(),
            });
        }
        let upgrade = if scenario.checksum == state.checksum {
            None
        } else {
            crate::pinning::check_upgrade(from, &state, scenario)?;
            self.keep_texts(scenario).await?;
            Some(ScenarioUpgraded {
                from_version: state.scenario_version,
                from_checksum: state.checksum.clone(),
                version: scenario.version,
                checksum: scenario.checksum.clone(),
            })
        };
        for (key, value) in &edits.scratchpad {
            crate::scratchpad::check_key(key)
                .and_then(|()| {
                    crate::scratchpad::check_write(&state.session.scratchpad, key, value)
                })
                .map_err(|why| refuse(format!("--set scratchpad.{key}: {why}")))?;
        }
        let (workspace, restored) = match &state.workspace {
            None => (None, None),
            Some(info) => {
                let head = state.workspace_head.clone().unwrap_or_else(|| info.base.clone());
                let (opened, fresh) = self
                    .new_workspace(scenario, new_run, true)
                    .await?
                    .ok_or_else(|| refuse("the fork's scenario has no workspace".to_owned()))?;
                let from_dir = std::path::PathBuf::from(&info.dir);
                let snapshot = head.clone();
                off_thread(move || opened.adopt(&from_dir, &snapshot)).await?;
                let own =
                    WorkspaceInfo { dir: fresh.dir, base: info.base.clone(), branch: fresh.branch };
                (Some(own), Some(head))
            }
        };
        let forked = RunForked {
            from_run_id: from.to_owned(),
            at_seq: at,
            input: edits.input,
            scratchpad: edits.scratchpad,
            scenario: upgrade,
            workspace,
            restored,
            model_source: edits.model_source,
        };
        let now = self.clock.now();
        let mut copied = prefix;
        copied.push(NewEvent::run(EventData::RunForked(Box::new(forked))).at(at + 1, now));
        let mut fork_state = RunState::default();
        for e in &copied {
            fork_state.apply(e);
        }
        let status = if fork_state.awaiting_person() { Status::Paused } else { Status::Running };
        let record = RunRecord {
            tenant: fork_state.tenant.clone(),
            ..RunRecord::new(new_run, &scenario.id, status.as_str(), now)
        };
        self.store.create_run(&record, copied).await?;
        Ok(fork_state)
    }
}

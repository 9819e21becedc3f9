//! Runs keep the scenario version they started with.
//!
//! A scenario version is its checksum: the canonical scenario and every template, rubric,
//! schema and rules file it read. The first run of a version keeps those texts in the
//! store ([`Engine::keep_texts`]), once per checksum, so that every run of it can be
//! continued on exactly that version whatever later happens to the files (the embedder
//! loads it with `baton_scenario::Registry::load_texts`). A run moves to another version
//! only when asked ([`Engine::upgrade`]), which is recorded as a `scenario_upgraded` event.

use baton_scenario::{Scenario, Texts};

use crate::event::{EventData, NewEvent, ScenarioUpgraded};
use crate::exec::{EXTERNAL_APPEND_TRIES_MAX, Engine, Error};
use crate::state::{Next, RunState};
use crate::store;

/// What asking to upgrade a run did.
#[derive(Clone, Debug, PartialEq)]
pub enum Upgrade {
    /// The run was on another version; this event moved it.
    Moved(ScenarioUpgraded),
    /// The run already is on the scenario's current version: nothing was recorded.
    Current,
}

impl Engine {
    /// Keeps `scenario`'s texts in the store under its checksum unless they are kept
    /// already; true when this call wrote them.
    pub async fn keep_texts(&self, scenario: &Scenario) -> Result<bool, Error> {
        if self.kept_here(&scenario.checksum) {
            return Ok(false);
        }
        let texts = serde_json::to_string(&*scenario.texts).map_err(|e| {
            store::Error::Backend(format!(
                "cannot encode the texts of scenario `{}` version {}: {e}",
                scenario.id, scenario.checksum
            ))
        })?;
        let written =
            self.store.put_scenario_texts(&scenario.checksum, &scenario.id, &texts).await?;
        self.mark_kept(&scenario.checksum);
        Ok(written)
    }

    /// The texts kept for the version with this checksum, if the store has them (a run
    /// started before versions were kept has none).
    pub async fn kept_texts(&self, checksum: &str) -> Result<Option<Texts>, Error> {
        let Some(json) = self.store.scenario_texts(checksum).await? else {
            return Ok(None);
        };
        let texts = serde_json::from_str(&json).map_err(|e| {
            store::Error::Backend(format!(
                "the stored texts of scenario version {checksum} cannot be read: {e}"
            ))
        })?;
        Ok(Some(texts))
    }

    /// Moves a run that has not ended to `scenario` (the same scenario, another version):
    /// its texts are kept and a `scenario_upgraded` event records the move. Refused when
    /// the run has ended, is being driven, belongs to another scenario, or when a level it
    /// already ran (or is about to run) is not in the new version.
    pub async fn upgrade(&self, run_id: &str, scenario: &Scenario) -> Result<Upgrade, Error> {
        let _driving = self.store.hold(run_id).await?;
        let mut state = self.state(run_id).await?;
        for _ in 0..EXTERNAL_APPEND_TRIES_MAX {
            check_upgrade(run_id, &state, scenario)?;
            if state.checksum == scenario.checksum {
                return Ok(Upgrade::Current);
            }
            self.keep_texts(scenario).await?;
            let upgraded = ScenarioUpgraded {
                from_version: state.scenario_version,
                from_checksum: state.checksum.clone(),
                version: scenario.version,
                checksum: scenario.checksum.clone(),
            };
            let seq = state.last_seq + 1;
            let event = NewEvent::run(EventData::ScenarioUpgraded(upgraded.clone()))
                .at(seq, self.clock.now());
            let status = state.recorded_status();
            match self.store.append(run_id, seq, vec![event], status.as_str()).await {
                Ok(()) => return Ok(Upgrade::Moved(upgraded)),
                // A decision or an answer landed meanwhile: check again on the new log.
                Err(store::Error::Conflict { .. }) => state = self.state(run_id).await?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Refused {
            run_id: run_id.to_owned(),
            message: format!(
                "gave up recording the upgrade after {EXTERNAL_APPEND_TRIES_MAX} tries: another writer advanced the log before each; nothing was recorded, try again"
            ),
        })
    }
}

/// Why `state` cannot move to `scenario`, if it cannot.
pub(crate) fn check_upgrade(
    run_id: &str,
    state: &RunState,
    scenario: &Scenario,
) -> Result<(), Error> {
    let refuse = |message: String| Error::Refused { run_id: run_id.to_owned(), message };
    if let Some(finished) = &state.finished {
        return Err(refuse(format!(
            "the run has ended ({}); only a run that has not ended can move to another scenario version",
            finished.status.as_str()
        )));
    }
    if state.scenario_id != scenario.id {
        return Err(Error::WrongScenario {
            run_id: run_id.to_owned(),
            expected: state.scenario_id.clone(),
            found: scenario.id.clone(),
        });
    }
    let mut missing: Vec<&str> = state
        .levels
        .keys()
        .map(String::as_str)
        .chain(match &state.next {
            Some(Next::Level(next)) => Some(next.as_str()),
            _ => None,
        })
        .filter(|id| scenario.level(id).is_none())
        .collect();
    missing.sort_unstable();
    missing.dedup();
    if !missing.is_empty() {
        return Err(refuse(format!(
            "cannot move to version {} of scenario `{}` ({}): it has no level {}, which the run already ran or is about to run; resume it without --upgrade to finish on its own version",
            scenario.version,
            scenario.id,
            scenario.file,
            missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}

//! A tool-loop attempt an earlier driver began: what it committed, for the attempt given
//! again to go through before it acts ([`crate::runner::LevelRun::resumed`]).

use std::sync::Arc;

use baton_scenario::Scenario;
use baton_scenario::model::{LevelIdx, LevelKind};

use super::Writer;
use crate::event::{Event, EventData};
use crate::store::Error;

impl Writer<'_> {
    /// What an earlier driver committed of this tool-loop attempt, after its
    /// `level_started` ([`LevelRun::resumed`]), but its takeovers (which the loop does not
    /// make again); nothing for other kinds, whose steps are
    /// atomic, or when the attempt has no committed events yet.
    pub(crate) async fn resumed_attempt(
        &self,
        scenario: &Scenario,
        level: LevelIdx,
        attempt: u32,
    ) -> Result<Arc<[Event]>, Error> {
        let id = &scenario.levels[level].id;
        let started = match (&scenario.levels[level].kind, self.state.level(id)) {
            (LevelKind::ToolLoop { .. }, Some(l))
                if l.running && l.started_seq < self.stored_seq =>
            {
                l.started_seq
            }
            _ => return Ok(Arc::from(Vec::new())),
        };
        let events = self.engine.store.load(self.run_id, started).await?;
        Ok(events
            .into_iter()
            .filter(|e| {
                e.level_id.as_deref() == Some(id.as_str())
                    && e.attempt == Some(attempt)
                    && !matches!(
                        e.data,
                        EventData::Heartbeat(_)
                            | EventData::LevelStarted(_)
                            | EventData::RunTakenOver(_)
                    )
            })
            .collect())
    }
}

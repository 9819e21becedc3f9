//! What a driver does about steering: each step's mailbox (a replay's runs given what the
//! recording's calls took), and an append lost only to steering messages written again
//! after them instead of planned again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Engine, Error, Writer};
use crate::event::{Event, EventData};
use crate::state::RunState;

impl Engine {
    /// The mailbox of a step of run `run_id`: the messages the run has not delivered, and
    /// for a replay's run, what the recording's calls were given.
    pub(super) fn mailbox(&self, run_id: &str, state: &RunState) -> crate::steering::Mailbox {
        let script = lock_map(&self.replayed_steering).get(run_id).cloned();
        match script {
            Some(script) => crate::steering::Mailbox::replaying(&state.session.steering, script),
            None => crate::steering::Mailbox::new(&state.session.steering),
        }
    }

    /// Makes a replay's runs give their calls the steering the recording gave them: by
    /// the replay's run id, each call's messages.
    pub(crate) fn replay_steering(&self, scripts: HashMap<String, crate::steering::Script>) {
        let mut map = lock_map(&self.replayed_steering);
        for (run_id, script) in scripts {
            if !script.is_empty() {
                map.insert(run_id, Arc::new(script));
            }
        }
    }
}

impl Writer<'_> {
    /// `events` numbered after what another writer appended, when that was only steering
    /// messages (which commute with everything a driver writes: they only add to the
    /// messages waiting); the state is the log's with `events` folded on. `None` when
    /// anything else was appended: the caller re-reads and plans again.
    pub(super) async fn after_steering(
        &mut self,
        events: Vec<Event>,
    ) -> Result<Option<Vec<Event>>, Error> {
        if self.create.is_some() {
            return Ok(None);
        }
        let newer = self.engine.store.load(self.run_id, self.stored_seq).await?;
        if newer.is_empty()
            || !newer.iter().all(|e| matches!(e.data, EventData::SteeringReceived(_)))
        {
            return Ok(None);
        }
        let mut state = self.engine.state(self.run_id).await?;
        if state.last_seq != self.stored_seq + newer.len() as u64 {
            return Ok(None);
        }
        if let Some(mailbox) = &self.steering {
            for e in &newer {
                if let EventData::SteeringReceived(m) = &e.data {
                    mailbox.post(m);
                }
            }
        }
        self.stored_seq = state.last_seq;
        let staged = self.pending.len();
        let mut renumbered = Vec::with_capacity(events.len() + staged);
        for mut e in events.into_iter().chain(std::mem::take(&mut self.pending)) {
            e.seq = state.last_seq + 1;
            state.apply(&e);
            renumbered.push(e);
        }
        self.pending = renumbered.split_off(renumbered.len() - staged);
        self.state = Arc::new(state);
        Ok(Some(renumbered))
    }
}

fn lock_map<K, V>(m: &Mutex<HashMap<K, V>>) -> std::sync::MutexGuard<'_, HashMap<K, V>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

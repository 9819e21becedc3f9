//! Jobs: runs that start runs.
//!
//! A job arrives with an optional pin, intent route or kind; [`select`] picks its scenario
//! (000 §2). Its first run is the root of a tree: a run whose result names an intent route
//! chains the job to the scenario owning it (002), as a *child run* — a whole run with its
//! own log and id, linked to its parent. The parent records `child_run_started` (the
//! child's id, derived from the parent's id and the link, and everything it starts from)
//! before the child exists, so a crash can never start it twice; once the child has ended
//! the parent records `child_run_settled`, exactly once (conditional on the parent's log).
//! A parent waiting for children is `waiting` and holds no driver: [`Engine::drive_tree`]
//! drives one run of the tree at a time, coming back to the parent once its children have
//! settled, so a tree completes with one driver.
//!
//! Any end of a parent with open children (a cancel) cancels them and waits for each to
//! settle, up to the settle timeout; a child that has not ended by then is recorded as
//! `child_run_unsettled`. A crash anywhere in the tree is reconciled by the next driver:
//! a child recorded but not created is created, an unfinished one driven on, a finished
//! one settled (idempotently).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_scenario::{Registry, Scenario};
use serde_json::Value;

use crate::event::{
    ChildRunSettled, ChildRunStarted, ChildRunUnsettled, EventData, NewEvent, ParentLink,
    ScenarioChained,
};
use crate::exec::{Engine, Error, Outcome};
use crate::limits::CHAIN_LINK;
use crate::state::{ChildRun, RunState, Status};
use crate::store;

pub use crate::jobs::*;

impl Engine {
    fn jobs(&self) -> Option<&Arc<Jobs>> {
        self.runtime.jobs.as_ref()
    }

    /// The events that chain the run to the scenario owning `route` (a child run, not yet
    /// created): `scenario_chained` and `child_run_started`. Without jobs (an embedder that
    /// starts no child runs) or when no scenario can take the job, the run ends as it would
    /// have, with a warning saying why.
    pub(crate) async fn chain(
        &self,
        run_id: &str,
        state: &RunState,
        level_id: &str,
        route: &str,
        reason: Option<String>,
    ) -> Result<Vec<NewEvent>, Error> {
        // A route is an id; what a model wrote there beyond that is not recorded whole.
        let cut_route: String;
        let route = if route.chars().count() > crate::limits::ROUTE_CHARS_MAX {
            cut_route = format!(
                "{}…",
                route.chars().take(crate::limits::ROUTE_CHARS_MAX).collect::<String>()
            );
            cut_route.as_str()
        } else {
            route
        };
        let Some(jobs) = self.jobs() else {
            let message = format!(
                "level `{level_id}` names intent route `{route}`, and this engine starts no child runs; the run ends with its own result"
            );
            return Ok(self.end_unchained(state, message));
        };
        // A process that lives long sees the scenarios as they are when it chains, and
        // records what a reload found.
        let mut events = Vec::new();
        let reloaded = match jobs.refresh() {
            Some(Err(diagnostics)) => Some(format!(
                "the scenarios changed on disk and do not load; the chain uses them as they were before:\n{}",
                cut(&diagnostics)
            )),
            Some(Ok(warnings)) if !warnings.trim().is_empty() => Some(format!(
                "the scenarios changed on disk and were reloaded, with warnings:\n{}",
                cut(&warnings)
            )),
            _ => None,
        };
        if let Some(message) = reloaded {
            events.push(NewEvent::run(EventData::Warning(crate::event::Warning { message })));
        }
        let registry = jobs.registry();
        let (target, warning) = match chain_target(&registry, &jobs.selection, route) {
            Ok(found) => found,
            // Not even the fallback is loaded (the directory did not load, or names none):
            // that is the configuration's fault, not the job's — it stops without ending,
            // and the next driver, once the scenarios load, chains it.
            Err(message) => {
                let reason = format!(
                    "no scenario to chain to: {message}; fix the scenarios or `[selection] fallback`, then `baton resume`"
                );
                let event = crate::runner::interrupted(CAUSE_SCENARIOS, reason);
                events.push(NewEvent::run(EventData::RunInterrupted(event)));
                return Ok(events);
            }
        };
        // A chain to a scenario that starts programs where no jail can be set up ends the
        // run failed with the jail's reason before the child exists: no model is told.
        if let Some(why) = program_refusal(&self.runtime.verifiers, &registry, &target) {
            let message = format!("the chain to scenario `{}` was refused: {why}", target.id);
            events.push(NewEvent::run(EventData::Warning(crate::event::Warning {
                message: message.clone(),
            })));
            events.extend(crate::plan::end(
                state,
                crate::event::FinalStatus::Failed,
                Some(message),
            ));
            return Ok(events);
        }
        self.keep_texts(&target).await?;
        let depth = state.depth() + 1;
        let warning = match (reason, warning) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        let child_run_id = child_run_id(run_id, CHAIN_LINK);
        let slice = state.tree_cost_left();
        let mut metadata = state.session.metadata.clone();
        metadata.insert("chained_from".to_owned(), Value::String(state.scenario_id.clone()));
        metadata.insert("chosen_intent_route".to_owned(), Value::String(route.to_owned()));
        events.extend([
            NewEvent::run(EventData::ScenarioChained(ScenarioChained {
                from: state.scenario_id.clone(),
                to: target.id.clone(),
                route: route.to_owned(),
                level_id: level_id.to_owned(),
                depth,
                warning,
            })),
            NewEvent::run(EventData::ChildRunStarted(Box::new(ChildRunStarted {
                child_run_id,
                link: CHAIN_LINK.to_owned(),
                scenario_id: target.id.clone(),
                scenario_version: target.version,
                checksum: target.checksum.clone(),
                input: state.session.input.clone(),
                metadata,
                budget: caps(&target, slice),
                depth,
            }))),
        ]);
        Ok(events)
    }

    /// The end of a run whose chain cannot be made: its own result, with why.
    fn end_unchained(&self, state: &RunState, message: String) -> Vec<NewEvent> {
        let mut events = vec![NewEvent::run(EventData::Warning(crate::event::Warning { message }))];
        let status = match &state.next {
            Some(crate::state::Next::End) if state.aborted_reason.is_none() => {
                crate::event::FinalStatus::Completed
            }
            _ => crate::event::FinalStatus::Failed,
        };
        let reason = (status != crate::event::FinalStatus::Completed)
            .then(|| state.aborted_reason.clone().unwrap_or_else(|| "no_route".to_owned()));
        events.extend(crate::plan::end(state, status, reason));
        events
    }

    /// The scenario a run of the tree continues on: the loaded one when it is the very
    /// version the run recorded, else the version the store kept.
    pub async fn scenario_of(
        &self,
        state: &RunState,
        run_id: &str,
    ) -> Result<Arc<Scenario>, Error> {
        let jobs = self.jobs();
        if let Some(s) = jobs.and_then(|j| j.registry().get(&state.scenario_id).cloned())
            && s.checksum == state.checksum
        {
            return Ok(s);
        }
        let refused = |message: String| Error::Refused { run_id: run_id.to_owned(), message };
        let Some(texts) = self.kept_texts(&state.checksum).await? else {
            return Err(refused(format!(
                "the store keeps no version {} of scenario `{}`",
                state.checksum, state.scenario_id
            )));
        };
        let root = jobs.map_or_else(|| PathBuf::from("."), |j| j.scenarios_dir.clone());
        let name = format!("{} (version {}, as stored)", state.scenario_id, state.scenario_version);
        let scenario = Registry::load_texts(&name, &root, &texts).map_err(|e| {
            refused(format!(
                "the stored version of scenario `{}` does not load: {e}",
                state.scenario_id
            ))
        })?;
        if scenario.checksum != state.checksum {
            return Err(refused(format!(
                "the stored texts of scenario `{}` hash to {}, not to the run's checksum {}",
                state.scenario_id, scenario.checksum, state.checksum
            )));
        }
        Ok(scenario)
    }

    /// Drives a run and the runs it starts until the run ends or waits for a person (or
    /// is interrupted): whenever it waits for children, each open child is created when
    /// it does not exist yet, driven (its own children likewise), and settled in the
    /// parent, then the parent goes on. One run is driven at a time.
    pub fn drive_tree<'a>(
        &'a self,
        run_id: &'a str,
        scenario: &'a Arc<Scenario>,
    ) -> crate::future::BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(async move { self.tree_loop(run_id, scenario, None).await })
    }

    /// Starts a job's first run and drives its tree (see [`Engine::drive_tree`]).
    pub async fn run_job(
        &self,
        run_id: &str,
        scenario: &Arc<Scenario>,
        start: Start,
    ) -> Result<Outcome, Error> {
        self.tree_loop(run_id, scenario, Some(start)).await
    }

    async fn tree_loop(
        &self,
        run_id: &str,
        scenario: &Arc<Scenario>,
        mut start: Option<Start>,
    ) -> Result<Outcome, Error> {
        loop {
            let outcome = match start.take() {
                Some(s) => self.run_from(run_id, scenario, s).await,
                None => self.drive(run_id, scenario).await,
            };
            let outcome = match outcome {
                // Another process ended this parent (a cancel of the tree) while its
                // children were being driven here: what it decided is the outcome.
                Err(Error::Store(store::Error::Busy(_))) => {
                    return self.await_end(run_id).await;
                }
                other => other?,
            };
            if outcome != Outcome::Waiting {
                return Ok(outcome);
            }
            let state = self.state(run_id).await?;
            if state.cancel_requested.is_some()
                && crate::wave_drive::wave_in_flight(&state).is_none()
            {
                self.stop_children(run_id, &state).await?;
                continue;
            }
            if state.open_children().next().is_none() {
                // Nothing of its own to drive: a manual wave waits for outside agents.
                return Ok(Outcome::Waiting);
            }
            if crate::wave_drive::wave_in_flight(&state).is_some() {
                if state.cancel_requested.is_some() {
                    // Workers this process drives end by the cancel; then the rest are
                    // stopped and waited for like any child.
                    if let Some(outcome) = self.wave_window(run_id, scenario, state).await? {
                        return Ok(outcome);
                    }
                    let state = self.state(run_id).await?;
                    if state.open_children().next().is_some() {
                        self.stop_children(run_id, &state).await?;
                    }
                    continue;
                }
                match self.wave_window(run_id, scenario, state).await? {
                    Some(outcome) => return Ok(outcome),
                    None => continue,
                }
            }
            let mut waits = None;
            for child in state.open_children() {
                match self.drive_child(run_id, &state, child).await? {
                    Outcome::Finished(_) => {}
                    other => {
                        waits.get_or_insert(other);
                    }
                }
            }
            // The parent's driver settles the children that ended, with what follows.
            if let Some(outcome) = waits {
                // A child waits for a person or was interrupted: so does the job.
                return Ok(outcome);
            }
        }
    }

    /// Waits (up to the settle timeout) for a run another process is ending, and says how
    /// it ended.
    async fn await_end(&self, run_id: &str) -> Result<Outcome, Error> {
        let timeout = self.jobs().map_or(Duration::from_secs(15), |j| j.settle_timeout);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = crate::clock::Backoff::SETTLE;
        loop {
            let state = match self.state(run_id).await {
                Ok(state) => state,
                // Another process holds it to create it: the job goes on there.
                Err(Error::Store(store::Error::NotFound(_))) => {
                    return Ok(Outcome::Interrupted(format!(
                        "run {run_id} is being started by another process"
                    )));
                }
                Err(e) => return Err(e),
            };
            if state.status.is_final() {
                return Ok(Outcome::Finished(state.status));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(store::Error::Busy(run_id.to_owned()).into());
            }
            // Woken by the run's next event where the store can tell, else after the wait.
            self.store.wait_for_events(run_id, state.last_seq, backoff.next(deadline)).await?;
        }
    }

    /// Creates a child from its parent's record when it does not exist yet, then drives
    /// its tree.
    pub(crate) async fn drive_child(
        &self,
        parent_run_id: &str,
        parent: &RunState,
        child: &ChildRun,
    ) -> Result<Outcome, Error> {
        let c = &child.started;
        let existing = match self.store.run(&c.child_run_id).await? {
            Some(_) => Some(self.state(&c.child_run_id).await?),
            None => None,
        };
        if let Some(state) = &existing
            && state.status.is_final()
        {
            return Ok(Outcome::Finished(state.status));
        }
        let scenario = match &existing {
            Some(state) => self.scenario_of(state, &c.child_run_id).await?,
            None => {
                let mut recorded = RunState::default();
                recorded.scenario_id.clone_from(&c.scenario_id);
                recorded.scenario_version = c.scenario_version;
                recorded.checksum.clone_from(&c.checksum);
                self.scenario_of(&recorded, &c.child_run_id).await?
            }
        };
        let outcome = match existing {
            Some(_) => Box::pin(self.drive_tree(&c.child_run_id, &scenario)).await,
            // A parent that is ending starts no child (asked again under the child's
            // hold by the creator).
            None if parent.cancel_requested.is_some() => {
                return Ok(Outcome::Finished(Status::Cancelled));
            }
            None => {
                let root = parent
                    .parent
                    .as_ref()
                    .map_or_else(|| parent_run_id.to_owned(), |p| p.root_run_id.clone());
                // A chain starts from the level whose output named the route.
                let level_id = parent
                    .chained
                    .as_ref()
                    .filter(|ch| c.link == CHAIN_LINK && !ch.level_id.is_empty())
                    .map(|ch| ch.level_id.clone());
                let start = Start {
                    input: c.input.clone(),
                    metadata: c.metadata.clone(),
                    model_source: self
                        .children_model_source
                        .clone()
                        .or_else(|| parent.model_source.clone()),
                    selected: None,
                    tree_max_cost_usd: c.budget.tree_max_cost_usd,
                    budget: Some(c.budget),
                    parent: Some(ParentLink {
                        parent_run_id: parent_run_id.to_owned(),
                        root_run_id: root,
                        level_id,
                        link: c.link.clone(),
                        depth: c.depth,
                    }),
                    idempotency: None,
                    tenant: parent.tenant.clone(),
                    parent_seq: (child.started_seq > 0).then_some(child.started_seq),
                    replay: None,
                    failures_unrouted: !parent.failures_routed,
                    // It waits where its root does (a claim looks at the root's queue).
                    placement: crate::store::Placement::default(),
                };
                Box::pin(self.tree_loop(&c.child_run_id, &scenario, Some(start))).await
            }
        };
        match outcome {
            // Another process drives the child: the job goes on there.
            Err(Error::Store(store::Error::Busy(_))) => Ok(Outcome::Interrupted(format!(
                "child run {} is driven by another process",
                c.child_run_id
            ))),
            other => other,
        }
    }

    /// The settlements of a parent's open children that have ended, as of their logs.
    pub(crate) async fn ended_children(
        &self,
        parent: &RunState,
    ) -> Result<Vec<ChildRunSettled>, Error> {
        let mut out = Vec::new();
        let open: Vec<&ChildRun> = parent.open_children().collect();
        if open.is_empty() {
            return Ok(out);
        }
        let ids: Vec<String> = open.iter().map(|c| c.started.child_run_id.clone()).collect();
        let records = self.store.runs_named(&ids).await?;
        for (child, record) in open.into_iter().zip(records) {
            let id = &child.started.child_run_id;
            // The run list says whether it ended; only then is its end read: the last
            // event of an ended run is its `scenario_finished`.
            let Some(record) = record else { continue };
            if !Status::from_name(&record.status).is_some_and(Status::is_final) {
                continue;
            }
            let last = self.store.load(id, record.last_seq.saturating_sub(1)).await?;
            let finished = match last.into_iter().rev().find_map(|e| match e.data {
                EventData::ScenarioFinished(f) => Some(*f),
                _ => None,
            }) {
                Some(f) => f,
                None => match self.state(id).await?.finished {
                    Some(f) => f,
                    None => continue,
                },
            };
            out.push(ChildRunSettled {
                child_run_id: id.clone(),
                link: child.started.link.clone(),
                status: finished.status,
                aborted_reason: finished.aborted_reason,
                final_output: finished.final_output,
                totals: finished.totals,
                tree_totals: finished.tree_totals.unwrap_or(finished.totals),
            });
        }
        Ok(out)
    }

    /// Records `child_run_settled` in the parent for every open child that has ended,
    /// each exactly once (conditional on the parent's log: of two settlers, one writes).
    /// True when every child is settled.
    pub async fn settle_children(&self, parent_run_id: &str) -> Result<bool, Error> {
        let state = self.state(parent_run_id).await?;
        for settled in self.ended_children(&state).await? {
            let id = settled.child_run_id.clone();
            self.close_child(parent_run_id, &id, EventData::ChildRunSettled(Box::new(settled)))
                .await?;
        }
        Ok(self.state(parent_run_id).await?.open_children().next().is_none())
    }

    /// Appends `closing` (a child's settlement or unsettlement) to the parent, exactly once:
    /// only while the parent's log, as it is at the append, still has the child open.
    async fn close_child(
        &self,
        parent_run_id: &str,
        child: &str,
        closing: EventData,
    ) -> Result<(), Error> {
        self.append_external(parent_run_id, |state, _, _| {
            let open = state.open_children().any(|c| c.started.child_run_id == child);
            Ok(open.then(|| (NewEvent::run(closing.clone()), ())))
        })
        .await?;
        Ok(())
    }

    /// The end of a parent with open children: each is cancelled (its tree with it) and
    /// ended here when nobody drives it, else waited for; those ended by the settle
    /// timeout are settled, the others recorded as `child_run_unsettled`.
    async fn stop_children(&self, run_id: &str, state: &RunState) -> Result<(), Error> {
        let timeout = self.jobs().map_or(Duration::from_secs(15), |j| j.settle_timeout);
        let started = tokio::time::Instant::now();
        let deadline = started + timeout;
        let by = state.cancel_requested.as_ref().and_then(|c| c.by.clone());
        let ids: Vec<(String, String)> = state
            .open_children()
            .map(|c| (c.started.child_run_id.clone(), c.started.link.clone()))
            .collect();
        let mut never_created = Vec::new();
        for (id, link) in &ids {
            if self.store.run(id).await?.is_none() {
                // Under the child's own hold no creator is half-way: a child still missing
                // now is never created (a creator asks its parent again under that hold).
                match self.store.hold(id).await {
                    Ok(_creating) => {
                        if self.store.run(id).await?.is_none() {
                            never_created.push((id.clone(), link.clone()));
                            continue;
                        }
                    }
                    // A creator is at work: wait (within the deadline) until the child is
                    // stored, then cancel it like any other.
                    Err(store::Error::Busy(_)) => {
                        let mut backoff = crate::clock::Backoff::SETTLE;
                        while self.store.run(id).await?.is_none()
                            && tokio::time::Instant::now() < deadline
                        {
                            tokio::time::sleep(backoff.next(deadline)).await;
                        }
                        if self.store.run(id).await?.is_none() {
                            continue;
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let reason = Some(format!("its parent run {run_id} is ending"));
            match self.cancel_tree(id, by.clone(), reason).await {
                Ok(()) | Err(Error::Refused { .. }) => {}
                Err(e) => return Err(e),
            }
            match Box::pin(self.end_cancelled_tree(id)).await {
                Ok(_) | Err(Error::Store(store::Error::Busy(_))) => {}
                Err(e) => return Err(e),
            }
        }
        for (id, link) in never_created {
            let unsettled = ChildRunUnsettled {
                child_run_id: id.clone(),
                link,
                status: "not created".to_owned(),
                waited_ms: 0,
            };
            self.close_child(run_id, &id, EventData::ChildRunUnsettled(unsettled)).await?;
        }
        // Wait for the children other processes are ending, looking again soon at first
        // and seldom later.
        let mut backoff = crate::clock::Backoff::SETTLE;
        loop {
            let mut open = Vec::new();
            let state = self.state(run_id).await?;
            for (id, link) in &ids {
                if !state.open_children().any(|c| &c.started.child_run_id == id) {
                    continue;
                }
                let status = match self.store.run(id).await? {
                    None => None,
                    Some(_) => Some(self.state(id).await?.status),
                };
                if !status.is_some_and(Status::is_final) {
                    open.push((id, link, status));
                }
            }
            if open.is_empty() || tokio::time::Instant::now() >= deadline {
                self.settle_children(run_id).await?;
                for (id, link, status) in open {
                    let waited_ms = crate::clock::elapsed_ms(started.into_std());
                    let unsettled = ChildRunUnsettled {
                        child_run_id: id.clone(),
                        link: link.clone(),
                        status: status.map_or("not created", Status::as_str).to_owned(),
                        waited_ms,
                    };
                    self.close_child(run_id, id, EventData::ChildRunUnsettled(unsettled)).await?;
                }
                return Ok(());
            }
            tokio::time::sleep(backoff.next(deadline)).await;
        }
    }

    /// Requests a cancel of a run and of every run below it that has not ended (a run
    /// that has ended is left as it is). Refused only when the run itself has ended.
    pub async fn cancel_tree(
        &self,
        run_id: &str,
        by: Option<String>,
        reason: Option<String>,
    ) -> Result<(), Error> {
        let mut pending = vec![run_id.to_owned()];
        let mut first = true;
        while let Some(id) = pending.pop() {
            match self.cancel(&id, by.clone(), reason.clone()).await {
                Ok(()) => {}
                Err(Error::Refused { .. }) if !first => {}
                Err(e) => return Err(e),
            }
            first = false;
            let state = self.state(&id).await?;
            for child in &state.children {
                if self.store.run(&child.started.child_run_id).await?.is_some() {
                    pending.push(child.started.child_run_id.clone());
                }
            }
        }
        Ok(())
    }

    /// Ends a cancelled run that nobody drives, and its tree: its open children are
    /// stopped and settled first (see [`Engine::end_cancelled`]).
    pub fn end_cancelled_tree<'a>(
        &'a self,
        run_id: &'a str,
    ) -> crate::future::BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(async move {
            let state = self.state(run_id).await?;
            if state.status.is_final() {
                return Ok(Outcome::Finished(state.status));
            }
            if state.open_children().next().is_some() {
                // Held while its children are stopped, so no driver takes it meanwhile.
                let guard = self.store.hold(run_id).await?;
                self.stop_children(run_id, &state).await?;
                drop(guard);
            }
            self.end_cancelled(run_id).await
        })
    }
}

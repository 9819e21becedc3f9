//! Replaying a recorded job: its tree read from the store, and a new job driven from it.
//!
//! The engine a replay runs on is set up by its embedder with the recording's answers as
//! its model (a [`crate::cassette::Replayer`] over [`Tree::cassette`]) and, for
//! `trust_validation`, its verifiers trusting [`Tree::trusted`]. [`Engine::replay`] starts
//! the new job from what the recording's root started with, records `run_replayed`, and
//! makes each recorded outside decision again when the job pauses for it.

use std::sync::Arc;

use baton_scenario::Scenario;

use crate::decide::Decision as ApprovalDecision;
use crate::event::{EventData, RunReplayed};
use crate::exec::{Engine, Error, Outcome};
use crate::job::Start;
use crate::limits;
use crate::replay::{Decision, Tree, TreeRun};

impl Engine {
    /// The job whose root is `root_run_id`, as recorded: every run its runs started and
    /// the store holds, each log checked by the store's load.
    pub async fn recorded_tree(&self, root_run_id: &str) -> Result<Tree, Error> {
        let mut tree = Tree::default();
        let events = self.store.load(root_run_id, 0).await?;
        tree.runs.push(TreeRun { links: Vec::new(), run_id: root_run_id.to_owned(), events });
        let mut next = 0;
        while next < tree.runs.len() {
            let children: Vec<(String, Vec<String>)> = {
                let run = &tree.runs[next];
                run.children()
                    .map(|(id, link)| {
                        let mut links = run.links.clone();
                        links.push(link.to_owned());
                        (id.to_owned(), links)
                    })
                    .collect()
            };
            for (id, links) in children {
                // A child its parent recorded but never created (the parent ended first).
                if self.store.run(&id).await?.is_none() {
                    continue;
                }
                if tree.runs.len() >= limits::TREE_RUNS_MAX {
                    return Err(Error::Refused {
                        run_id: root_run_id.to_owned(),
                        message: format!(
                            "the job has more than {} runs; a replay reads at most that many",
                            limits::TREE_RUNS_MAX
                        ),
                    });
                }
                let events = self.store.load(&id, 0).await?;
                tree.runs.push(TreeRun { links, run_id: id, events });
            }
            next += 1;
        }
        Ok(tree)
    }

    /// Starts `new_root` as a replay of `recorded` on `scenario` and drives its tree,
    /// making each recorded approval and answer again, in their order, whenever the job
    /// pauses. Returns where the job stopped: at its end, or paused when the recording
    /// holds no decision for the pause.
    pub async fn replay(
        &self,
        new_root: &str,
        scenario: &Arc<Scenario>,
        recorded: &Tree,
        record: RunReplayed,
    ) -> Result<Outcome, Error> {
        let refuse = |message: String| Error::Refused { run_id: new_root.to_owned(), message };
        let Some(root) = recorded.root() else {
            return Err(refuse("the recording has no run".to_owned()));
        };
        let mut start = Start { replay: Some(record), ..Start::default() };
        for e in &root.events {
            match &e.data {
                EventData::ScenarioStarted(s) => {
                    start.input.clone_from(&s.input);
                    start.metadata.clone_from(&s.metadata);
                    start.model_source.clone_from(&s.model_source);
                    start.tenant.clone_from(&s.tenant);
                    // A tree cap narrowed the run's own cap; the scenario's own is kept.
                    start.tree_max_cost_usd = s.budget.tree_max_cost_usd;
                    // The replay runs under the rules the recording ran under.
                    start.failures_unrouted = !s.failures_routed;
                }
                EventData::ScenarioSelected(s) => start.selected = Some(s.clone()),
                _ => {}
            }
        }
        if let Some(why) = recorded.unreplayable() {
            return Err(refuse(why));
        }
        self.steer_as_recorded(new_root, recorded);
        let outcome = self.run_job(new_root, scenario, start).await?;
        self.make_decisions(new_root, scenario, recorded, outcome, 0).await
    }

    /// Drives on a replay that stopped (a crash, a signal): the recorded decisions it has
    /// not made yet are made when it pauses for them.
    pub async fn resume_replay(
        &self,
        root: &str,
        scenario: &Arc<Scenario>,
        recorded: &Tree,
    ) -> Result<Outcome, Error> {
        self.steer_as_recorded(root, recorded);
        let mut made = 0;
        for run in &self.recorded_tree(root).await?.runs {
            made += run
                .events
                .iter()
                .filter(|e| match &e.data {
                    EventData::ApprovalDecided(d) => !d.timed_out,
                    EventData::UserAnswered(_) => true,
                    _ => false,
                })
                .count();
        }
        let outcome = self.drive_tree(root, scenario).await?;
        self.make_decisions(root, scenario, recorded, outcome, made).await
    }

    /// Gives each call of the replay's runs the steering messages the recording's call was
    /// given (a replay is steered as its recording was, without anyone sending them).
    fn steer_as_recorded(&self, new_root: &str, recorded: &Tree) {
        let ids = recorded.new_ids(new_root);
        let scripts = recorded
            .runs
            .iter()
            .filter_map(|run| {
                let id = ids.get(&run.links)?;
                Some((id.clone(), crate::steering::script_of(&run.events)))
            })
            .collect();
        self.replay_steering(scripts);
    }

    /// Makes the recording's decisions after the first `made`, one at each pause.
    async fn make_decisions(
        &self,
        new_root: &str,
        scenario: &Arc<Scenario>,
        recorded: &Tree,
        mut outcome: Outcome,
        made: usize,
    ) -> Result<Outcome, Error> {
        let refuse = |message: String| Error::Refused { run_id: new_root.to_owned(), message };
        let ids = recorded.new_ids(new_root);
        let mut decisions = recorded.decisions().into_iter().skip(made);
        while outcome == Outcome::Paused {
            let Some(decision) = decisions.next() else { break };
            let links = match &decision {
                Decision::Approval { links, .. } | Decision::Answer { links, .. } => links,
            };
            let Some(run_id) = ids.get(links) else {
                return Err(refuse(format!(
                    "the recording's decision for {} has no run in the replay",
                    crate::replay::place(links)
                )));
            };
            match decision {
                Decision::Approval { decided, .. } => {
                    self.decide(
                        run_id,
                        ApprovalDecision {
                            request_id: Some(decided.request_id),
                            approved: decided.approved,
                            comment: decided.comment,
                            by: decided.by,
                            data: decided.data,
                        },
                    )
                    .await?;
                }
                Decision::Answer { answer, .. } => self.answer(run_id, answer).await?,
            }
            outcome = self.drive_tree(new_root, scenario).await?;
        }
        Ok(outcome)
    }
}

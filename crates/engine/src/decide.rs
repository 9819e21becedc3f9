//! The outside decisions on a run, each made exactly once: an approval decided, a
//! question answered, a cancel, a steering message, and the conditional append they all go through
//! ([`Engine::append_external`]), which re-reads the log and checks the decision still
//! applies before it writes.

use baton_scenario::schema::JsonSchema;
use serde_json::{Map, Value};

use crate::event::{ApprovalDecided, CancelRequested, Event, EventData, NewEvent, UserAnswered};
use crate::exec::{EXTERNAL_APPEND_TRIES_MAX, Engine, Error, Outcome, Writer, settle_workspace};
use crate::state::{PendingApproval, RunState, fold};
use crate::store;

impl Engine {
    /// Records an approval decision for the only open request, exactly once.
    pub async fn approve(
        &self,
        run_id: &str,
        approved: bool,
        comment: Option<String>,
        by: Option<String>,
    ) -> Result<ApprovalDecided, Error> {
        self.decide(run_id, Decision { request_id: None, approved, comment, by, data: None }).await
    }

    /// Records a decision on one approval request, exactly once per request.
    ///
    /// `request_id` may be left out when exactly one request is open. The approver's data is
    /// validated against the schema recorded on the request before anything is written; an
    /// approval whose decision does not satisfy the schema without data is refused, so that
    /// the level's output always matches its `output_schema` (a rejection needs no data).
    pub async fn decide(&self, run_id: &str, d: Decision) -> Result<ApprovalDecided, Error> {
        // Checked again on the log as it is before each try: of two deciders racing for one
        // request, the store takes one append per sequence number, and the loser re-reads
        // the log, finds the request decided and writes nothing.
        // The request a person decided is the one open when they decided: a retry decides
        // that request, not whichever is open by then.
        let mut chosen = d.request_id.clone();
        let decided = self
            .append_external(run_id, |state, log, now| {
                let on = Decision { request_id: chosen.clone(), ..d.clone() };
                let decided = decision(run_id, state, log, &on, now)?;
                chosen = Some(decided.request_id.clone());
                let event = NewEvent::run(EventData::ApprovalDecided(decided.clone()));
                Ok(Some((event, decided)))
            })
            .await?;
        decided.ok_or_else(|| Error::Refused {
            run_id: run_id.to_owned(),
            message: "the decision was not recorded".to_owned(),
        })
    }

    /// Records the answer to the pending `ask_user` request, exactly once.
    pub async fn answer(&self, run_id: &str, answer: Value) -> Result<(), Error> {
        self.append_external(run_id, |state, log, _| {
            let refuse = |message: String| Error::Refused { run_id: run_id.to_owned(), message };
            if state.status.is_final() {
                return Err(refuse(format!("the run has ended ({})", state.status.as_str())));
            }
            let Some(ask) = &state.pending_ask else {
                return Err(refuse("the run is not waiting for an answer".to_owned()));
            };
            if state.session.answers.iter().any(|(id, _)| id == &ask.call_id) {
                let at = log.iter().rev().find_map(|e| match &e.data {
                    EventData::UserAnswered(a) if a.call_id == ask.call_id => Some(e.at),
                    _ => None,
                });
                return Err(refuse(format!(
                    "question {} was already answered{}",
                    ask.call_id,
                    at.map(|t| format!(" at {}", t.to_rfc3339())).unwrap_or_default()
                )));
            }
            // A question that says what answers it takes (a JSON Schema, such as the routes a
            // disambiguation offers) gets one of those or nothing.
            if let Some(schema) = ask.question.get("schema").filter(|s| s.is_object()) {
                let problems = match JsonSchema::compile(schema.clone()) {
                    Ok(compiled) => compiled.violations(&answer),
                    Err(e) => vec![format!("the question's schema does not compile: {e}")],
                };
                if !problems.is_empty() {
                    let offered = schema
                        .get("enum")
                        .map(|e| format!("; the answers it takes: {e}"))
                        .unwrap_or_default();
                    return Err(refuse(format!(
                        "the answer does not fit question {}: {}{offered}; nothing was recorded",
                        ask.call_id,
                        problems.join("; ")
                    )));
                }
            }
            let event = NewEvent::run(EventData::UserAnswered(UserAnswered {
                call_id: ask.call_id.clone(),
                answer: answer.clone(),
            }));
            Ok(Some((event, ())))
        })
        .await?;
        Ok(())
    }

    /// Records a cancel request; a running executor stops at its next check. A cancel
    /// already requested is left as it is (nothing is written).
    pub async fn cancel(
        &self,
        run_id: &str,
        by: Option<String>,
        reason: Option<String>,
    ) -> Result<(), Error> {
        self.append_external(run_id, |state, _, _| {
            if state.status.is_final() {
                return Err(Error::Refused {
                    run_id: run_id.to_owned(),
                    message: format!("the run has already ended ({})", state.status.as_str()),
                });
            }
            if state.cancel_requested.is_some() {
                return Ok(None);
            }
            let event = NewEvent::run(EventData::CancelRequested(CancelRequested {
                by: by.clone(),
                reason: reason.clone(),
            }));
            Ok(Some((event, ())))
        })
        .await?;
        Ok(())
    }

    /// Ends a run whose cancel was requested and that no process drives (a paused run, or
    /// one whose driver died), without its scenario: the end of a cancelled run reads
    /// nothing from it (the log holds the totals and the workspace's base), so a run can be
    /// stopped after its scenario files changed or went away. The workspace goes back to
    /// its base, as when [`Engine::drive`] ends a cancelled run. A run being driven is
    /// [`store::Error::Busy`]: its driver stops at its next check.
    pub async fn end_cancelled(&self, run_id: &str) -> Result<Outcome, Error> {
        let _driving = self.store.hold(run_id).await?;
        for _ in 0..EXTERNAL_APPEND_TRIES_MAX {
            let state = self.state(run_id).await?;
            if state.cancel_requested.is_none() && !state.status.is_final() {
                return Err(Error::Refused {
                    run_id: run_id.to_owned(),
                    message: "no cancel was requested; request one with `baton cancel`".to_owned(),
                });
            }
            let mut w = Writer::over_stored(self, run_id, state);
            if !w.state.status.is_final() {
                let events = crate::plan::cancelled(&w.state);
                w.stage(events);
                w.flush().await?;
            }
            // A conflicting writer (an approval recorded meanwhile) makes the flush re-read
            // the log: try again on it.
            if !w.state.status.is_final() {
                continue;
            }
            if let Some(workspace) = self.recorded_workspace(run_id, &w.state).await? {
                // Without the scenario, the log says whether the run edited its workspace:
                // only a tool loop does.
                let edits = w.state.levels.values().any(|l| l.kind == "tool_loop");
                settle_workspace(workspace, edits, &w.state).await?;
            }
            return Ok(Outcome::Finished(w.state.status));
        }
        Err(Error::Refused {
            run_id: run_id.to_owned(),
            message: format!(
                "gave up ending the cancelled run after {EXTERNAL_APPEND_TRIES_MAX} tries: another writer advanced the log before each; try again"
            ),
        })
    }

    /// Appends one event from outside the executor, conditional on the log it was decided
    /// on: `check` looks at the run as it is (its state and its log) and gives the event to
    /// append with what to return, nothing when there is nothing to write, or a refusal.
    /// The store appends only at the next sequence number, inside its transaction; when
    /// another writer got there first, the log is read again and `check` runs again on it,
    /// so a request decided meanwhile is refused and nothing is written.
    ///
    /// `check` is also given the time the event will be recorded with: a deadline is
    /// checked against the very time the decision carries.
    pub(crate) async fn append_external<T>(
        &self,
        run_id: &str,
        mut check: impl FnMut(
            &RunState,
            &[Event],
            chrono::DateTime<chrono::Utc>,
        ) -> Result<Option<(NewEvent, T)>, Error>,
    ) -> Result<Option<T>, Error> {
        let mut kind = "the decision";
        for _ in 0..EXTERNAL_APPEND_TRIES_MAX {
            // A run that does not exist is `NotFound` from the load (every store's
            // conformance), so the log is the one read a try makes.
            let log = self.store.load(run_id, 0).await?;
            let state = fold(&log);
            let now = self.clock.now();
            let Some((event, out)) = check(&state, &log, now)? else {
                return Ok(None);
            };
            kind = event.data.kind();
            let seq = state.last_seq + 1;
            let stamped = event.at(seq, now);
            let mut next = state;
            next.apply(&stamped);
            let status = next.recorded_status();
            match self.store.append(run_id, seq, vec![stamped], status.as_str()).await {
                Ok(()) => return Ok(Some(out)),
                Err(store::Error::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Refused {
            run_id: run_id.to_owned(),
            message: format!(
                "gave up recording {kind} after {EXTERNAL_APPEND_TRIES_MAX} tries: another writer advanced the log before each; nothing was recorded, try again"
            ),
        })
    }
}

impl Engine {
    /// Records `message` from `by` for run `run_id` of `scenario`, exactly once: refused
    /// (nothing written) when the run has ended, when no steerable level is running or
    /// ahead, or when the run already holds [`crate::steering::UNDELIVERED_MAX`] messages no call took.
    pub async fn steer(
        &self,
        run_id: &str,
        scenario: &baton_scenario::Scenario,
        message: &str,
        by: &str,
    ) -> Result<crate::event::SteeringReceived, Error> {
        crate::steering::check_message(message, by)
            .map_err(|message| Error::Invalid { run_id: run_id.to_owned(), message })?;
        let recorded = self
            .append_external(run_id, |state, _, _| {
                let refuse =
                    |message: String| Error::Refused { run_id: run_id.to_owned(), message };
                if state.status.is_final() {
                    return Err(refuse(format!(
                        "the run has ended ({}); nothing was recorded",
                        state.status.as_str()
                    )));
                }
                if state.scenario_id != scenario.id {
                    return Err(Error::WrongScenario {
                        run_id: run_id.to_owned(),
                        expected: state.scenario_id.clone(),
                        found: scenario.id.clone(),
                    });
                }
                if !crate::steering::steerable_ahead(scenario, state) {
                    let steerable: Vec<&str> = scenario
                        .levels
                        .iter()
                        .filter(|l| l.steerable)
                        .map(|l| l.id.as_str())
                        .collect();
                    return Err(refuse(format!(
                        "no steerable level is running or ahead ({}); nothing was recorded",
                        if steerable.is_empty() {
                            format!(
                                "scenario `{}` has none: a prompt or tool_loop level takes steering with `steerable: true`",
                                scenario.id
                            )
                        } else {
                            format!("the steerable levels are {}", steerable.join(", "))
                        }
                    )));
                }
                if state.session.steering.len() >= crate::steering::UNDELIVERED_MAX {
                    return Err(refuse(format!(
                        "the run holds {} steering messages no model call has taken yet; send more once it has (nothing was recorded)",
                        crate::steering::UNDELIVERED_MAX
                    )));
                }
                let received = crate::event::SteeringReceived {
                    id: format!("steer-{}", state.session.steering_received + 1),
                    by: by.to_owned(),
                    message: message.to_owned(),
                };
                let event = NewEvent::run(EventData::SteeringReceived(received.clone()));
                Ok(Some((event, received)))
            })
            .await?;
        recorded.ok_or_else(|| Error::Refused {
            run_id: run_id.to_owned(),
            message: "the message was not recorded".to_owned(),
        })
    }
}

/// ` by NAME at TIME` for a decided request, from the log.
fn decided_by(log: &[Event], request_id: &str) -> String {
    log.iter()
        .rev()
        .find_map(|e| match &e.data {
            EventData::ApprovalDecided(d) if d.request_id == request_id => Some(format!(
                " by {} at {}",
                d.by.as_deref().unwrap_or("an unnamed approver"),
                e.at.to_rfc3339()
            )),
            _ => None,
        })
        .unwrap_or_default()
}

/// The decision `d` on the run as `state` and `log` have it, or why it is refused.
fn decision(
    run_id: &str,
    state: &RunState,
    log: &[Event],
    d: &Decision,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<ApprovalDecided, Error> {
    let refuse = |message: String| Error::Refused { run_id: run_id.to_owned(), message };
    if state.status.is_final() {
        return Err(refuse(format!(
            "the run has ended ({}); there is nothing to approve",
            state.status.as_str()
        )));
    }
    if d.by.as_deref().is_some_and(|b| b.trim().is_empty()) {
        return Err(refuse("the approver (`by`) must not be empty".to_owned()));
    }
    let open: Vec<&PendingApproval> = state.open_approvals().collect();
    let pending = match &d.request_id {
        Some(id) => match state.pending_approvals.iter().find(|p| &p.request.request_id == id) {
            _ if state.decisions.contains_key(id) => {
                return Err(refuse(format!(
                    "approval request {id} was already decided{}{}",
                    decided_by(log, id),
                    open_list(&open)
                )));
            }
            Some(p) => p,
            None => {
                return Err(refuse(format!(
                    "no approval request {id}{}",
                    if open.is_empty() {
                        "; the run is not waiting for an approval".to_owned()
                    } else {
                        open_list(&open)
                    }
                )));
            }
        },
        None => match open.as_slice() {
            [] => return Err(refuse("the run is not waiting for an approval".to_owned())),
            [one] => *one,
            several => {
                return Err(refuse(format!(
                    "{} approval requests are open; name one with --request ID{}",
                    several.len(),
                    open_list(several)
                )));
            }
        },
    };
    let request_id = pending.request.request_id.clone();
    if let Some(deadline) = pending.request.deadline
        && deadline <= now
    {
        return Err(refuse(format!(
            "approval request {request_id} timed out at {} (level `{}` waits at most its timeout_s); nothing was recorded — `baton resume {run_id}` records the timeout and goes on",
            deadline.to_rfc3339(),
            pending.level_id
        )));
    }
    if let Some(data) = &d.data
        && !data.is_object()
    {
        return Err(Error::Data {
            run_id: run_id.to_owned(),
            request_id,
            message: "the approver's data must be a JSON object".to_owned(),
        });
    }
    if let Some(key) = d.data.as_ref().and_then(|v| {
        v.as_object().and_then(|m| DECISION_KEYS.iter().find(|k| m.contains_key(**k)))
    }) {
        return Err(Error::Data {
            run_id: run_id.to_owned(),
            request_id,
            message: format!(
                "the approver's data must not set `{key}`: the decision itself sets it (--reject, --comment, --by)"
            ),
        });
    }
    if d.approved || d.data.is_some() {
        let violations = decision_violations(&pending.request.schema, d);
        if !violations.is_empty() {
            let hint = if d.data.is_none() {
                "; level `{level}` declares an output_schema: give the approver's data with --data FILE.json".replace("{level}", &pending.level_id)
            } else {
                String::new()
            };
            return Err(Error::Data {
                run_id: run_id.to_owned(),
                request_id,
                message: format!(
                    "the decision does not match the output_schema of level `{}`: {}{hint}",
                    pending.level_id,
                    violations.join("; ")
                ),
            });
        }
    }
    Ok(ApprovalDecided {
        request_id,
        approved: d.approved,
        comment: d.comment.clone(),
        by: d.by.clone(),
        data: d.data.clone(),
        timed_out: false,
    })
}

/// A decision on an approval request, as a person gives it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// The request decided; may be left out when exactly one is open.
    pub request_id: Option<String>,
    pub approved: bool,
    pub comment: Option<String>,
    pub by: Option<String>,
    /// The approver's data for the level's `output_schema` (a JSON object).
    pub data: Option<Value>,
}

/// The keys of an approval level's output that the decision sets, not the approver's data.
const DECISION_KEYS: &[&str] = &["approved", "comment", "by"];

/// The level's output a decision gives (the approver's data with the decision's fields),
/// checked against the schema recorded on the request: violations by JSON pointer.
fn decision_violations(schema: &Value, d: &Decision) -> Vec<String> {
    let compiled = match JsonSchema::compile(schema.clone()) {
        Ok(c) => c,
        Err(e) => return vec![format!("the recorded schema does not compile: {e}")],
    };
    let mut output = match &d.data {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    output.insert("approved".to_owned(), Value::Bool(d.approved));
    // Absent fields are left out rather than null, as a schema's optional fields expect.
    if let Some(comment) = &d.comment {
        output.insert("comment".to_owned(), Value::String(comment.clone()));
    }
    if let Some(by) = &d.by {
        output.insert("by".to_owned(), Value::String(by.clone()));
    }
    compiled.violations(&Value::Object(output))
}

/// `; open: ID (level `L`: prompt…), …`, or nothing when no request is open.
fn open_list(open: &[&PendingApproval]) -> String {
    if open.is_empty() {
        return String::new();
    }
    let items: Vec<String> = open
        .iter()
        .map(|p| {
            format!(
                "{} (level `{}`: {})",
                p.request.request_id,
                p.level_id,
                summary(&p.request.question)
            )
        })
        .collect();
    format!("; open requests: {}", items.join(", "))
}

/// The first line of a question, cut at [`crate::limits::PROMPT_SUMMARY_CHARS`] characters.
pub fn summary(question: &str) -> String {
    let line = question.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let max = crate::limits::PROMPT_SUMMARY_CHARS;
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max).collect::<String>())
    } else {
        line.to_owned()
    }
}

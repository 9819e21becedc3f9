//! Calls of the user's own tools inside a tool loop: each checked against its tool's
//! schema and limits, keyed and recorded in the effect ledger (a write call's
//! `tool_call_started` committed before it is made, its receipt after), answered from its
//! receipt when the log already holds one, and made through the runtime's
//! [`ToolHost`](baton_engine::tools::ToolHost).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_engine::event::ledger::{CallPlace, ListedTool, ToolsListed, idempotency_key};
use baton_engine::event::{
    ApprovalRequested, BudgetExceeded, EventData, NewEvent, ToolCallAsked, ToolCallFinished,
    ToolCallReissued, ToolCallStarted,
};
use baton_engine::model::{ToolCall, ToolSpec};
use baton_engine::tools::{OwnCall, RESULTS_PER_ATTEMPT_BYTES_MAX, ToolSession, bounded_result};
use baton_engine::workspace::{ToolOutcome, Workspace, off_thread};
use baton_scenario::limits::{TOOL_DESCRIPTION_BYTES_MAX, TOOL_SCHEMA_BYTES_MAX};
use baton_scenario::model::{Effect, ErrorKind, OwnTool, ToolSource};
use baton_scenario::schema::JsonSchema;

use crate::resume::{RecordedTool, Resume};
use crate::{Attempt, Stop};

/// Most schema violations named in the result of a call whose arguments fail.
const VIOLATIONS_SHOWN: usize = 5;

/// The user's tools of one attempt, and what the attempt has called of them.
#[derive(Debug, Default)]
pub(crate) struct OwnTools {
    tools: Vec<Arc<OwnTool>>,
    /// What makes the calls, for this attempt; none when the process cannot call them.
    session: Option<Box<dyn ToolSession>>,
    /// What MCP tools' servers said of them: description and compiled schema.
    served: HashMap<String, (String, JsonSchema)>,
    /// Calls made (or answered from receipts) per tool.
    calls: HashMap<String, u32>,
    /// The next call's index among the attempt's calls of these tools.
    index: u32,
    /// Bytes of results given to the model so far.
    result_bytes: usize,
    /// What the attempt's calls cost.
    pub(crate) cost_usd: f64,
    /// Of which, what calls an earlier driver made cost (already counted in the state).
    pub(crate) replayed_cost_usd: f64,
}

impl OwnTools {
    pub(crate) fn new(tools: &[Arc<OwnTool>]) -> Self {
        OwnTools { tools: tools.to_vec(), ..OwnTools::default() }
    }

    /// Takes the attempt's session: an MCP tool its server offers gets the server's
    /// description and schema (compiled, bounded); one it does not is not offered. Says why
    /// a tool is left out, one line each.
    pub(crate) fn open(&mut self, session: Box<dyn ToolSession>) -> Vec<String> {
        let mut problems = session.problems().to_vec();
        let listed = session.listed();
        let mut offered = Vec::new();
        for tool in std::mem::take(&mut self.tools) {
            if !matches!(tool.source, ToolSource::Mcp(_)) {
                offered.push(tool);
                continue;
            }
            let Some(listed) = listed.get(&tool.name) else { continue };
            let bytes = listed.schema.to_string().len();
            if bytes > TOOL_SCHEMA_BYTES_MAX {
                problems.push(format!(
                    "`{}` is not offered: its server's schema is {bytes} bytes, over {TOOL_SCHEMA_BYTES_MAX}",
                    tool.name
                ));
                continue;
            }
            match JsonSchema::compile(listed.schema.clone()) {
                Ok(schema) => {
                    let mut description = listed.description.clone();
                    if description.len() > TOOL_DESCRIPTION_BYTES_MAX {
                        let mut cut = TOOL_DESCRIPTION_BYTES_MAX;
                        while !description.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        description.truncate(cut);
                    }
                    self.served.insert(tool.name.clone(), (description, schema));
                    offered.push(tool);
                }
                Err(e) => problems.push(format!(
                    "`{}` is not offered: its server's schema is not a JSON Schema: {e}",
                    tool.name
                )),
            }
        }
        self.tools = offered;
        self.session = Some(session);
        problems
    }

    /// What the attempt's MCP servers said of the tools it offers, to record; none when it
    /// offers no MCP tool.
    pub(crate) fn listing(&self) -> Option<ToolsListed> {
        let tools: Vec<ListedTool> = self
            .tools
            .iter()
            .filter_map(|t| {
                let (description, schema) = self.served.get(&t.name)?;
                Some(ListedTool {
                    name: t.name.clone(),
                    description: description.clone(),
                    schema: schema.value().clone(),
                })
            })
            .collect();
        (!tools.is_empty()).then_some(ToolsListed { tools })
    }

    /// The tools as models see them, in their declared order.
    pub(crate) fn specs(&self) -> impl Iterator<Item = ToolSpec> + '_ {
        self.tools.iter().map(|t| match self.served.get(&t.name) {
            Some((description, schema)) => ToolSpec {
                name: t.name.clone(),
                description: description.clone(),
                parameters: schema.value().clone(),
            },
            None => ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.value().clone(),
            },
        })
    }

    /// The schema a call of `tool` is checked against: its server's for an MCP tool.
    fn schema<'s>(&'s self, tool: &'s OwnTool) -> &'s JsonSchema {
        self.served.get(&tool.name).map_or(&tool.parameters, |(_, s)| s)
    }

    /// The tool with this name, if the level has one.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<OwnTool>> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    /// Their names, for a result naming every tool.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|t| t.name.as_str())
    }
}

/// How a call that passed its checks is made.
enum Making {
    /// Live, a first time.
    New,
    /// Again, with the key of its start that has no receipt.
    Again(String),
}

impl Attempt {
    /// One call of a user's tool: refused with a result that says why when its arguments
    /// fail the schema or a limit is reached, answered from its receipt when the log holds
    /// one, else made — a write call after its `tool_call_started` is committed. `Err` when
    /// the attempt must stop: the budget refused the call, or the step is being cut.
    pub(crate) async fn own_call(
        &self,
        tool: &OwnTool,
        call: &ToolCall,
        own: &mut OwnTools,
        resume: &mut Resume,
        events: &mut Vec<NewEvent>,
        workspace: &Arc<dyn Workspace>,
    ) -> Result<ToolOutcome, Stop> {
        let violations = own.schema(tool).violations(&call.arguments);
        if !violations.is_empty() {
            let mut message =
                format!("not run: these arguments do not match the schema of `{}`:", tool.name);
            for v in violations.iter().take(VIOLATIONS_SHOWN) {
                let _ = write!(message, "\n- {v}");
            }
            if violations.len() > VIOLATIONS_SHOWN {
                let _ = write!(message, "\n- and {} more", violations.len() - VIOLATIONS_SHOWN);
            }
            return Ok(ToolOutcome::error(message));
        }
        let made = own.calls.get(&tool.name).copied().unwrap_or(0);
        if let Some(max) = tool.max_calls
            && made >= max
        {
            return Ok(ToolOutcome::error(format!(
                "not run: `{}` may be called at most {max} times in one attempt of this level",
                tool.name
            )));
        }
        if own.result_bytes >= RESULTS_PER_ATTEMPT_BYTES_MAX {
            return Ok(ToolOutcome::error(format!(
                "not run: this attempt's tools have returned {} bytes already, the most one attempt may take in; finish with what you have",
                own.result_bytes
            )));
        }
        own.calls.insert(tool.name.clone(), made + 1);
        let index = own.index;
        own.index += 1;
        if tool.approval.needed(&call.arguments) {
            let request_id = format!("{}#{}:{}#{index}", self.id(), self.attempt, tool.name);
            match self.state.decisions.get(&request_id) {
                Some(decision) => {
                    resume.approval();
                    if !decision.approved {
                        let comment = decision.comment.as_deref().unwrap_or("no comment");
                        if decision.timed_out {
                            return Ok(ToolOutcome::error(format!(
                                "not made: its approval timed out ({comment})"
                            )));
                        }
                        let by = decision.by.as_deref().unwrap_or("the approver");
                        return Ok(ToolOutcome::error(format!("rejected by {by}: {comment}")));
                    }
                }
                None => {
                    // The run waits for the decision; the loop runs again once it is in.
                    let asked = ApprovalRequested {
                        request_id,
                        approver_role: tool.approver_role.clone(),
                        question: format!(
                            "May `{}` (toolset `{}`) be called with {}?",
                            tool.name, tool.toolset, call.arguments
                        ),
                        schema: baton_scenario::schema::approval_default(),
                        // Its timeout bounds the wait for a decision.
                        deadline: tool
                            .approval_timeout_s
                            .and_then(|s| {
                                chrono::Duration::from_std(std::time::Duration::from_secs_f64(s))
                                    .ok()
                            })
                            .map(|limit| self.clock.now() + limit),
                        tool: Some(Box::new(ToolCallAsked {
                            call_id: call.id.clone(),
                            tool: tool.name.clone(),
                            toolset: tool.toolset.clone(),
                            arguments: call.arguments.clone(),
                        })),
                    };
                    resume.emit(events, self.event(EventData::ApprovalRequested(asked)));
                    return Err(Stop::Halted);
                }
            }
        }
        let key = (tool.effect == Effect::Write).then(|| {
            idempotency_key(&CallPlace {
                run_id: &self.run_id,
                level_id: self.id(),
                attempt: (!tool.once_per_run).then_some(self.attempt),
                index,
                tool: &tool.name,
                arguments: &call.arguments,
            })
        });
        // What the log holds of the call: this attempt's own record, or, for a tool called
        // once per run, an earlier attempt's.
        let recorded = if resume.is_live() {
            match key.as_ref().filter(|_| tool.once_per_run).and_then(|k| self.state.ledger.get(k))
            {
                Some(Some(receipt)) => {
                    // Reused: its cost was counted when it was made.
                    // Its files are those of its own attempt's workspace, not this one's.
                    let reused =
                        ToolCallFinished { cost_usd: 0.0, snapshot: None, ..receipt.clone() };
                    return Ok(self.receipt_read(reused, own, resume, events, false));
                }
                Some(None) => key.clone().map(Making::Again),
                None => None,
            }
        } else {
            match resume.tool_call() {
                Some(RecordedTool::Finished(receipt)) => {
                    // What the program did to the files is taken from its snapshot.
                    if let Some(snapshot) = receipt.snapshot.clone() {
                        let ws = Arc::clone(workspace);
                        if let Err(e) = off_thread(move || ws.restore(&snapshot)).await {
                            return Err(Stop::Failed(
                                format!("cannot go through `{}` again: {e}", tool.name),
                                Some(ErrorKind::Tool),
                            ));
                        }
                    }
                    return Ok(self.receipt_read(receipt, own, resume, events, true));
                }
                Some(RecordedTool::Started(started)) => Some(Making::Again(started.key)),
                None => None,
            }
        };
        let making = recorded.unwrap_or(Making::New);
        let reservation = if tool.cost_usd > 0.0
            && let Some(max) = self.state.budget.max_cost_usd
        {
            match self.reservations.reserve(self.state.totals.cost_usd, tool.cost_usd, max) {
                Ok(r) => Some(r),
                Err(reached) => {
                    resume.emit(
                        events,
                        self.event(EventData::BudgetExceeded(BudgetExceeded {
                            limit_kind: "cost".to_owned(),
                            limit_value: max,
                            observed_value: reached,
                            refused_before_call: true,
                        })),
                    );
                    return Err(Stop::Halted);
                }
            }
        } else {
            None
        };
        let key = match (making, key) {
            (Making::Again(recorded), _) => {
                let reissued = self.event(EventData::ToolCallReissued(ToolCallReissued {
                    call_id: call.id.clone(),
                    tool: tool.name.clone(),
                    key: recorded.clone(),
                }));
                if !self.commit_before(events, reissued).await {
                    return Err(Stop::Halted);
                }
                Some(recorded)
            }
            (Making::New, Some(key)) => {
                let started = self.event(EventData::ToolCallStarted(ToolCallStarted {
                    call_id: call.id.clone(),
                    tool: tool.name.clone(),
                    toolset: tool.toolset.clone(),
                    key: key.clone(),
                }));
                if !self.commit_before(events, started).await {
                    return Err(Stop::Halted);
                }
                Some(key)
            }
            (Making::New, None) => None,
        };
        let outcome = self.make_own_call(tool, call, key.as_deref(), own.session.as_deref()).await;
        if let Some(reservation) = reservation {
            reservation.settle(tool.cost_usd);
        }
        // A program (a command, an MCP server in the workspace) may have changed the files:
        // the receipt keeps them as it left them.
        let snapshot = match (&tool.source, &key) {
            (ToolSource::Command { .. } | ToolSource::Mcp(_), Some(_)) => {
                let ws = Arc::clone(workspace);
                let message =
                    format!("baton: {} attempt {} after {}", self.id(), self.attempt, call.id);
                match off_thread(move || ws.snapshot(&message)).await {
                    Ok(s) => Some(s),
                    // Another process's lock, git killed: the run stops, to be resumed (the
                    // call, without its receipt, is then made again with its key).
                    Err(e) if e.transient => {
                        self.cancel.progress().interrupt(e);
                        return Err(Stop::Halted);
                    }
                    Err(e) => {
                        return Err(Stop::Failed(
                            format!("the workspace after `{}` could not be kept: {e}", tool.name),
                            Some(ErrorKind::Tool),
                        ));
                    }
                }
            }
            _ => None,
        };
        own.cost_usd += tool.cost_usd;
        own.result_bytes += outcome.content.len();
        let receipt = ToolCallFinished {
            call_id: call.id.clone(),
            tool: tool.name.clone(),
            key,
            content: outcome.content.clone(),
            is_error: outcome.is_error,
            cost_usd: tool.cost_usd,
            snapshot,
        };
        resume.emit(events, self.event(EventData::ToolCallFinished(receipt)));
        Ok(outcome)
    }

    /// A call answered from its receipt: the receipt is recorded when it is a reused one
    /// (`once_per_run`), gone through when it is this attempt's own (`replayed`).
    fn receipt_read(
        &self,
        receipt: ToolCallFinished,
        own: &mut OwnTools,
        resume: &mut Resume,
        events: &mut Vec<NewEvent>,
        replayed: bool,
    ) -> ToolOutcome {
        own.cost_usd += receipt.cost_usd;
        if replayed {
            own.replayed_cost_usd += receipt.cost_usd;
        }
        own.result_bytes += receipt.content.len();
        let outcome = ToolOutcome {
            content: receipt.content.clone(),
            is_error: receipt.is_error,
            created: None,
        };
        if !replayed {
            resume.emit(events, self.event(EventData::ToolCallFinished(receipt)));
        }
        outcome
    }

    /// Makes the call through the runtime's tool host, within the tool's timeout and the
    /// attempt's deadline; its result bounded and redacted.
    async fn make_own_call(
        &self,
        tool: &OwnTool,
        call: &ToolCall,
        key: Option<&str>,
        session: Option<&dyn ToolSession>,
    ) -> ToolOutcome {
        let Some(session) = session else {
            return ToolOutcome::error(format!(
                "not run: this Baton process cannot call the user's tools, so `{}` is unavailable",
                tool.name
            ));
        };
        let timeout = Duration::from_secs_f64(tool.timeout_s);
        let mut deadline = Instant::now() + timeout;
        if let Some(attempt_deadline) = self.deadline {
            deadline = deadline.min(attempt_deadline);
        }
        let dir = self.workspace_dir();
        let own_call = OwnCall {
            tool,
            level_id: self.id(),
            arguments: &call.arguments,
            key,
            workspace: &dir,
            deadline,
            tenant: self.state.tenant.as_deref(),
        };
        let mut outcome = session.call(own_call, &self.cancel).await;
        outcome.content = bounded_result(outcome.content);
        self.runtime.redactor.redact_in_place(&mut outcome.content);
        outcome
    }
}

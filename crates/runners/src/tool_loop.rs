//! The tool-loop runner: a model changes the run's workspace through file tools, turn by
//! turn, until it calls `finish`.
//!
//! Each turn is one model call followed by the tools it asked for, recorded as `tool_call`
//! / `tool_result` (and `file_created`) events. Tools go to the model natively (the
//! provider's tool calling); when the first native turn fails and the level allows models
//! outside its `allow` list, the loop falls back to a textual protocol — fenced ```` ```tool
//! ```` blocks in the model's text, answered with ```` ```tool_result ```` blocks — that
//! drives the same tools. The loop ends on `finish`, a turn without tool calls,
//! `max_iterations`, the budget, or a cancel (checked every turn). The attempt starts from
//! the workspace's last snapshot and ends with a new one, so a crash mid-level leaves no
//! half-applied edits behind: a resumed run starts the level again from the snapshot.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use baton_scenario::model::{ErrorKind, LevelKind};
use serde_json::{Map, Value, json};

use crate::own_tools::OwnTools;
use crate::resume::{RecordedCall, Resume};
use crate::{Attempt, Stop};
use baton_engine::clock::elapsed_ms;
use baton_engine::event::{
    EventData, FileCreated, LevelFinished, NewEvent, ToolCalled, ToolResult, Warning,
};
use baton_engine::limits;
use baton_engine::model::{ModelRequest, ToolCall, ToolReply, ToolSpec, Turn};
use baton_engine::model::{OMITTED_KEY, cap_tool_calls};
use baton_engine::plan::over_caps;
use baton_engine::render;
use baton_engine::workspace::{FILE_TOOLS, ToolOutcome, off_thread};

/// The standing rules of a tool-loop level, sent as its system prompt.
pub const SYSTEM: &str = "You work inside a project workspace through file tools. Paths are relative to the workspace root; you cannot leave it, and `.git` and `.baton` are off limits. A tool that fails returns an error message: read it and adjust. Edits are kept only when the level ends, so work until the task is done, then call `finish` with a summary of what you changed.";

/// The file tools and the scratchpad's, as models see them.
pub fn tool_specs() -> Vec<ToolSpec> {
    let path = json!({"type": "string", "description": "path relative to the workspace root"});
    let spec = |name: &str, description: &str, parameters: Value| ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
    };
    vec![
        spec(
            "read_file",
            "Read a text file of the workspace, optionally only lines start_line..=end_line (1-based).",
            json!({"type": "object", "properties": {"path": path, "start_line": {"type": "integer", "minimum": 1}, "end_line": {"type": "integer", "minimum": 1}}, "required": ["path"], "additionalProperties": false}),
        ),
        spec(
            "write_file",
            "Create or replace a file with the given content; parent directories are created.",
            json!({"type": "object", "properties": {"path": path, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false}),
        ),
        spec(
            "edit_file",
            "Replace old_string with new_string in a file; old_string must occur exactly once.",
            json!({"type": "object", "properties": {"path": path, "old_string": {"type": "string"}, "new_string": {"type": "string"}}, "required": ["path", "old_string", "new_string"], "additionalProperties": false}),
        ),
        spec(
            "list_dir",
            "List a directory of the workspace (default: its root); directories end with `/`.",
            json!({"type": "object", "properties": {"path": path}, "additionalProperties": false}),
        ),
        spec(
            "delete_file",
            "Delete a file of the workspace.",
            json!({"type": "object", "properties": {"path": path}, "required": ["path"], "additionalProperties": false}),
        ),
        spec(
            "finish",
            "End the task: report what you changed and what remains.",
            json!({"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"], "additionalProperties": false}),
        ),
    ]
    .into_iter()
    .chain(baton_engine::scratchpad::specs())
    .collect()
}

/// The textual protocol's instructions, appended to the prompt of a model without tools.
fn textual_protocol(specs: &[ToolSpec]) -> String {
    let mut out = String::from(
        "\n\n## Tools\nYou work on the files of a workspace through tools. To call a tool, write a fenced block tagged `tool` holding one JSON object with `name` and `arguments`, for example:\n\n```tool\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"README.md\"}}\n```\n\nYou may write several blocks in one answer; they run in order, and their results come back in ```tool_result blocks. When the task is done, call `finish` with a `summary`.\n\nThe tools and their arguments (JSON Schema):\n",
    );
    for spec in specs {
        let _ =
            writeln!(out, "- `{}`: {} Arguments: {}", spec.name, spec.description, spec.parameters);
    }
    out
}

/// The ```` ```tool ```` blocks of a model's text, in order: each a call, or why it is not one.
pub fn parse_tool_blocks(text: &str, turn: u32) -> Vec<Result<ToolCall, String>> {
    let mut calls = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let opener = line.trim();
        if opener != "```tool" && opener != "~~~tool" {
            continue;
        }
        let fence = &opener[..3];
        let mut body = String::new();
        let mut closed = false;
        for inner in lines.by_ref() {
            if inner.trim() == fence {
                closed = true;
                break;
            }
            body.push_str(inner);
            body.push('\n');
        }
        let id = format!("text_{turn}_{}", calls.len());
        if !closed {
            calls.push(Err("a ```tool block is not closed with ```".to_owned()));
            break;
        }
        calls.push(match serde_json::from_str::<Value>(&body) {
            Ok(Value::Object(mut call)) => match call.remove("name") {
                Some(Value::String(name)) => Ok(ToolCall {
                    id,
                    name,
                    arguments: call.remove("arguments").unwrap_or_else(|| json!({})),
                }),
                _ => Err("a ```tool block needs a string `name`".to_owned()),
            },
            Ok(_) => Err("a ```tool block must hold one JSON object".to_owned()),
            Err(e) => Err(format!("a ```tool block is not valid JSON: {e}")),
        });
    }
    calls
}

/// Tool results in the textual protocol.
fn textual_results(results: &[ToolReply]) -> String {
    let mut out = String::new();
    for r in results {
        let status = if r.is_error { "error" } else { "ok" };
        let _ = write!(out, "```tool_result {} {status}\n{}\n```\n", r.name, r.content);
    }
    out
}

/// The conversation as the model gets it: when it holds more than `max` bytes, the oldest
/// tool results give way to a note saying what was there, so a long loop that reads many
/// files stays within bounds. The newest turn is always kept whole.
pub fn bounded(turns: &[Turn], max: usize) -> Vec<Turn> {
    let size = |t: &Turn| match t {
        Turn::Assistant { text, tool_calls } => {
            text.len() + tool_calls.iter().map(|c| c.arguments.to_string().len()).sum::<usize>()
        }
        Turn::Tools { results } => results.iter().map(|r| r.content.len()).sum(),
        Turn::User { text } => text.len(),
    };
    let mut total: usize = turns.iter().map(size).sum();
    let mut out = turns.to_vec();
    let last = out.len().saturating_sub(1);
    for turn in &mut out[..last] {
        if total <= max {
            break;
        }
        let before = size(turn);
        match turn {
            Turn::Tools { results } => {
                for r in results.iter_mut().filter(|r| r.content.len() > 200) {
                    r.content = format!(
                        "[{} bytes of this `{}` result were dropped to keep the conversation short; call the tool again if you need them]",
                        r.content.len(),
                        r.name
                    );
                }
            }
            Turn::User { text } if text.len() > 200 => {
                *text = format!(
                    "[{} bytes of tool results were dropped to keep the conversation short; call the tools again if you need them]",
                    text.len()
                );
            }
            _ => {}
        }
        total = total - before + size(turn);
    }
    out
}

/// How the tools reach the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Native,
    Textual,
}

/// What a turn's tools did to the loop.
enum Next {
    Continue,
    Finished(String),
    /// The run was cancelled between two calls; the rest of the turn's calls did not run.
    Cancelled,
    /// A call could not be run at all (its task died); the attempt ends without a result.
    Failed(String),
    /// A call of a user's tool stopped the attempt (the budget refused it, or the step is
    /// being cut).
    Stopped(Stop),
}

/// What one turn's tool calls work on: the attempt's files touched, its scratchpad, its
/// calls of the user's tools, what it goes through again of an earlier driver's, and the
/// turn's results for the model.
struct TurnState<'a> {
    touched: &'a mut BTreeSet<String>,
    pad: &'a mut Map<String, Value>,
    own: &'a mut OwnTools,
    resume: &'a mut Resume,
    results: &'a mut Vec<ToolReply>,
}

/// The refusal of a call whose arguments [`cap_tool_calls`] left out.
fn oversized(arguments: &Value) -> Option<ToolOutcome> {
    let bytes = arguments.get(OMITTED_KEY)?.as_u64()?;
    Some(ToolOutcome::error(format!(
        "not run: this call's arguments are {bytes} bytes; a call may send at most {} bytes \
         of arguments and one turn at most {} bytes in all; write large files in several \
         smaller calls (edit_file, or write_file for parts of the project)",
        limits::TOOL_ARGUMENTS_BYTES_MAX,
        limits::TURN_ARGUMENTS_BYTES_MAX
    )))
}

impl Attempt {
    /// One attempt of a tool-loop level.
    pub(crate) async fn tool_loop(&self) -> Vec<NewEvent> {
        let started = Instant::now();
        let level = &self.scenario.levels[self.level];
        let LevelKind::ToolLoop { prompt, max_iterations, tools } = &level.kind else {
            return Vec::new();
        };
        let mut events = Vec::new();
        let fail = |message: String, events: &mut Vec<NewEvent>| {
            events.push(self.event(EventData::LevelFinished(Box::new(LevelFinished::failed(
                message,
                elapsed_ms(started),
            )))));
            std::mem::take(events)
        };
        let Some(workspace) = self.workspace.clone() else {
            return fail(
                format!("level `{}` is a tool_loop and the run has no workspace", level.id),
                &mut events,
            );
        };
        // Start from the last completed level's files: a crash mid-level or a failed
        // attempt's half-done edits are gone.
        if let Some(head) = self.state.workspace_head.clone() {
            let ws = Arc::clone(&workspace);
            if let Err(e) = off_thread(move || ws.restore(&head)).await {
                return self.failed_workspace(e, fail, &mut events);
            }
        }
        let ctx = render::context(&self.state, &self.run_id, &level.id, &self.runtime.catalog);
        let text = match self.renderer.render(prompt, &ctx) {
            Ok(t) => t,
            Err(e) => return fail(e, &mut events),
        };
        let mut own = OwnTools::new(tools);
        // An attempt an earlier driver began: its committed events answer its calls.
        let mut resume = Resume::new(&self.resumed);
        if !tools.is_empty()
            && let Some(host) = &self.runtime.tools
        {
            let dir = workspace.root().to_path_buf();
            let session = host.open(tools, &dir, &self.cancel).await;
            for problem in own.open(session) {
                let message = format!("level `{}`: {problem}", level.id);
                resume.emit(&mut events, self.event(EventData::Warning(Warning { message })));
            }
            if let Some(listed) = own.listing() {
                resume.emit(&mut events, self.event(EventData::ToolsListed(Box::new(listed))));
            }
        }
        let specs: Vec<ToolSpec> = tool_specs().into_iter().chain(own.specs()).collect();
        // What the calls an earlier driver made spent: in the state's totals already.
        let (mut replayed_usd, mut replayed_tokens) = (0.0, 0);
        let may_go_textual = level.model.as_ref().is_some_and(|m| m.fallback_outside_allow);
        let mut transport = Transport::Native;
        let mut calls = self.calls();
        let mut turns: Vec<Turn> = Vec::new();
        let mut touched: BTreeSet<String> = BTreeSet::new();
        // The run's notes with this attempt's writes, as the scratchpad tools see them.
        let mut pad = self.state.session.scratchpad.clone();
        let mut last_text = String::new();
        let mut turn = 0;
        let ending = loop {
            if self.cancel.is_cancelled() {
                return Stop::Halted.finish(self, &mut events, started);
            }
            if turn >= *max_iterations {
                resume.emit(&mut events, self.event(EventData::Warning(Warning {
                    message: format!(
                        "level `{}` stopped after max_iterations ({max_iterations}) turns without calling finish",
                        level.id
                    ),
                })));
                let mut cut = last_text.len().min(2048);
                while !last_text.is_char_boundary(cut) {
                    cut -= 1;
                }
                break format!(
                    "stopped after {max_iterations} turns without calling finish; last message: {}",
                    &last_text[..cut]
                );
            }
            let textual = transport == Transport::Textual;
            // A person's steering is a user turn after the conversation so far; it stays in
            // the conversation once a call has taken it.
            let steer = if resume.is_live() { calls.steering() } else { None };
            let steered = steer.as_ref().map(|s| Turn::User { text: s.text() });
            let mut request = ModelRequest {
                scenario_id: self.scenario.id.clone(),
                level_id: level.id.clone(),
                call_index: 0,
                system: Some(SYSTEM.to_owned()),
                prompt: if textual {
                    format!("{text}{}", textual_protocol(&specs))
                } else {
                    text.clone()
                },
                json: false,
                schema: None,
                max_tokens: limits::MAX_TOKENS_DEFAULT,
                constraint: level.model.clone(),
                turns: bounded(&turns, limits::CONVERSATION_BYTES_MAX),
                tools: if textual { Vec::new() } else { specs.clone() },
                deadline: None,
            };
            request.turns.extend(steered.clone());
            let first = calls.call == 0;
            let answer = match resume.model_call() {
                Some(RecordedCall::Answered(response, stop)) => {
                    replayed_usd += response.cost_usd;
                    replayed_tokens += response.usage.total();
                    calls.recorded(*response, stop)
                }
                Some(RecordedCall::Failed(failed)) => Err(Stop::Failed(
                    format!("model call failed ({}): {}", failed.provider, failed.message),
                    Some(ErrorKind::Provider),
                )),
                // Its prompt is in the log already.
                Some(RecordedCall::Sent) => {
                    calls.send(&mut events, &prompt.name, request, false, steer).await
                }
                None => calls.send(&mut events, &prompt.name, request, first, steer).await,
            };
            let reply = match answer {
                Ok(r) => r,
                Err(Stop::Failed(message, _))
                    if turn == 0 && transport == Transport::Native && may_go_textual =>
                {
                    resume.emit(&mut events, self.event(EventData::Warning(Warning {
                        message: format!(
                            "native tool calling failed ({message}); level `{}` goes on with the textual tool protocol",
                            level.id
                        ),
                    })));
                    calls.skip();
                    transport = Transport::Textual;
                    continue;
                }
                Err(stop) => {
                    // The attempt ends without a result: none of its edits stay.
                    self.discard(&workspace).await;
                    return stop.finish(self, &mut events, started);
                }
            };
            turn += 1;
            turns.extend(steered);
            let mut requested: Vec<Result<ToolCall, String>> = match transport {
                Transport::Native => reply.tool_calls.iter().cloned().map(Ok).collect(),
                Transport::Textual => parse_tool_blocks(&reply.text, turn),
            };
            // Native calls were capped before their `model_response`; textual ones here.
            cap_tool_calls(requested.iter_mut().filter_map(|r| r.as_mut().ok()));
            last_text.clone_from(&reply.text);
            turns.push(Turn::Assistant {
                text: reply.text.clone(),
                tool_calls: if transport == Transport::Native {
                    reply.tool_calls
                } else {
                    Vec::new()
                },
            });
            if requested.is_empty() {
                break if reply.text.trim().is_empty() {
                    "ended with an empty turn".to_owned()
                } else {
                    reply.text
                };
            }
            let mut results = Vec::new();
            let mut turn_state = TurnState {
                touched: &mut touched,
                pad: &mut pad,
                own: &mut own,
                resume: &mut resume,
                results: &mut results,
            };
            let next = self.run_tools(&workspace, requested, &mut turn_state, &mut events).await;
            match next {
                Next::Cancelled => return Stop::Halted.finish(self, &mut events, started),
                Next::Stopped(stop) => {
                    self.discard(&workspace).await;
                    return stop.finish(self, &mut events, started);
                }
                Next::Failed(message) => {
                    self.discard(&workspace).await;
                    return Stop::Failed(message, Some(ErrorKind::Tool)).finish(
                        self,
                        &mut events,
                        started,
                    );
                }
                Next::Continue | Next::Finished(_) => {}
            }
            turns.push(match transport {
                Transport::Native => Turn::Tools { results },
                Transport::Textual => Turn::User { text: textual_results(&results) },
            });
            if let Next::Finished(summary) = next {
                break summary;
            }
            // The budget counts every turn: a loop stops as soon as a cap is crossed.
            let mut totals = self.state.totals;
            totals.cost_usd += calls.cost_usd + own.cost_usd - replayed_usd - own.replayed_cost_usd;
            totals.tokens += calls.tokens - replayed_tokens;
            totals.duration_ms += elapsed_ms(started);
            if let Some(exceeded) = over_caps(self.state.budget, totals) {
                events.push(self.event(EventData::BudgetExceeded(exceeded)));
                self.discard(&workspace).await;
                return Stop::Halted.finish(self, &mut events, started);
            }
        };
        let message = format!("baton: {} attempt {}", level.id, self.attempt);
        let ws = Arc::clone(&workspace);
        let snapshot = match off_thread(move || ws.snapshot(&message)).await {
            Ok(s) => s,
            Err(e) => return self.failed_workspace(e, fail, &mut events),
        };
        events.push(self.event(EventData::LevelFinished(Box::new(LevelFinished {
            ok: true,
            skipped: false,
            verdict: None,
            output: ending,
            parsed: None,
            confidence: None,
            scratchpad: Map::new(),
            conflict: None,
            error: None,
            error_kind: None,
            cost_usd: calls.cost_usd + own.cost_usd,
            tokens: calls.tokens,
            duration_ms: elapsed_ms(started),
            terminal: level.terminal,
            touched_paths: touched.into_iter().collect(),
            snapshot: Some(snapshot),
        }))));
        events
    }

    /// The attempt's end when its workspace failed: a transient failure (a lock another
    /// process held, git killed or out of time) interrupts the step — nothing of it is
    /// recorded, the driver returns the error and the run stays resumable; any other fails
    /// the attempt.
    fn failed_workspace(
        &self,
        error: baton_engine::workspace::WorkspaceError,
        fail: impl FnOnce(String, &mut Vec<NewEvent>) -> Vec<NewEvent>,
        events: &mut Vec<NewEvent>,
    ) -> Vec<NewEvent> {
        if error.transient {
            self.cancel.progress().interrupt(error);
            events.clear();
            return Vec::new();
        }
        fail(error.to_string(), events)
    }

    /// Puts the workspace back to the last snapshot (best effort: a failure here leaves
    /// the next attempt's restore to do it).
    async fn discard(&self, workspace: &Arc<dyn baton_engine::workspace::Workspace>) {
        if let Some(head) = self.state.workspace_head.clone() {
            let ws = Arc::clone(workspace);
            let _ = off_thread(move || ws.restore(&head)).await;
        }
    }

    /// Runs one turn's tool calls in order, recording each; stops at `finish` or a
    /// cancel (checked before each call). File tools run on the blocking pool, so the
    /// async workers stay free (heartbeats and the cancel poll go on during a long call).
    async fn run_tools(
        &self,
        workspace: &Arc<dyn baton_engine::workspace::Workspace>,
        requested: Vec<Result<ToolCall, String>>,
        turn: &mut TurnState<'_>,
        events: &mut Vec<NewEvent>,
    ) -> Next {
        let TurnState { touched, pad, own, resume, results } = turn;
        let mut written = None;
        for (n, call) in requested.into_iter().enumerate() {
            let (call, outcome) = match call {
                Err(why) => {
                    let call = ToolCall {
                        id: format!("invalid_{n}"),
                        name: "invalid".to_owned(),
                        arguments: Value::Null,
                    };
                    (call, ToolOutcome::error(why))
                }
                Ok(call) => {
                    if self.cancel.is_cancelled() {
                        return Next::Cancelled;
                    }
                    self.cancel.progress().tool_call();
                    resume.emit(
                        events,
                        self.event(EventData::ToolCall(ToolCalled {
                            call_id: call.id.clone(),
                            tool: call.name.clone(),
                            arguments: call.arguments.clone(),
                        })),
                    );
                    let outcome = if let Some(refusal) = oversized(&call.arguments) {
                        refusal
                    } else if n >= limits::TOOL_CALLS_PER_TURN_MAX {
                        ToolOutcome::error(format!(
                            "not run: at most {} tool calls are run per turn; call it again in the next turn",
                            limits::TOOL_CALLS_PER_TURN_MAX
                        ))
                    } else if call.name == "finish" {
                        match call.arguments.get("summary").and_then(Value::as_str) {
                            Some(summary) => {
                                let summary = summary.to_owned();
                                let result = self.result_event(&call, &ToolOutcome::ok("finished"));
                                resume.emit(events, result);
                                return Next::Finished(summary);
                            }
                            None => ToolOutcome::error(
                                "finish needs a string argument `summary`: what you changed and what remains",
                            ),
                        }
                    } else if baton_engine::scratchpad::TOOLS.contains(&call.name.as_str()) {
                        let (outcome, write) =
                            baton_engine::scratchpad::call(pad, &call.name, &call.arguments);
                        written = write;
                        outcome
                    } else if FILE_TOOLS.contains(&call.name.as_str()) {
                        let ws = Arc::clone(workspace);
                        let (name, arguments) = (call.name.clone(), call.arguments.clone());
                        let mut set = std::mem::take(*touched);
                        let ran = tokio::task::spawn_blocking(move || {
                            let outcome = ws.execute(
                                &name,
                                &arguments,
                                &mut set,
                                limits::FILES_TOUCHED_PER_LEVEL_MAX,
                            );
                            (outcome, set)
                        })
                        .await;
                        match ran {
                            Ok((outcome, set)) => {
                                **touched = set;
                                outcome
                            }
                            Err(e) => {
                                // The set went with the task; the touched paths are
                                // unknown, so the attempt must not keep its edits.
                                return Next::Failed(format!(
                                    "file tool `{}` failed: {e}",
                                    call.name
                                ));
                            }
                        }
                    } else if let Some(tool) = own.get(&call.name) {
                        match self.own_call(&tool, &call, own, resume, events, workspace).await {
                            Ok(outcome) => outcome,
                            Err(stop) => return Next::Stopped(stop),
                        }
                    } else {
                        let mut names: Vec<&str> = FILE_TOOLS.to_vec();
                        names.extend(baton_engine::scratchpad::TOOLS);
                        names.extend(own.names());
                        ToolOutcome::error(format!(
                            "there is no tool `{}`; the tools are {}",
                            call.name,
                            names.join(", ")
                        ))
                    };
                    (call, outcome)
                }
            };
            resume.emit(events, self.result_event(&call, &outcome));
            if let Some((key, value)) = written.take() {
                resume.emit(
                    events,
                    self.event(EventData::ScratchpadWritten(
                        baton_engine::event::ScratchpadWritten { key, value },
                    )),
                );
            }
            if let Some(path) = &outcome.created {
                resume.emit(
                    events,
                    self.event(EventData::FileCreated(FileCreated { path: path.clone() })),
                );
            }
            results.push(ToolReply {
                call_id: call.id,
                name: call.name,
                content: outcome.content,
                is_error: outcome.is_error,
            });
        }
        Next::Continue
    }

    /// The `tool_result` of a call: what the model was given, cut at the event's limit.
    fn result_event(&self, call: &ToolCall, outcome: &ToolOutcome) -> NewEvent {
        let mut content = outcome.content.clone();
        if content.len() > limits::TOOL_RESULT_EVENT_BYTES_MAX {
            let mut cut = limits::TOOL_RESULT_EVENT_BYTES_MAX;
            while !content.is_char_boundary(cut) {
                cut -= 1;
            }
            let dropped = content.len() - cut;
            content.truncate(cut);
            let _ =
                write!(content, "\n[{dropped} more bytes went to the model, not to this event]");
        }
        self.event(EventData::ToolResult(ToolResult {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            content,
            is_error: outcome.is_error,
        }))
    }
}

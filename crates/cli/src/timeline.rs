//! Printing a run's events as a timeline: one line per event worth reading. Every line
//! goes through [`escape::one_line`]: names, summaries and reasons come from models, tools
//! and files, and a control character in them must not reach the terminal raw.

use baton_engine::event::{Event, EventData};

use crate::escape;

/// The line for an event, or `None` for events the timeline leaves out; control
/// characters in it are escaped.
pub(crate) fn line(e: &Event) -> Option<String> {
    let level = e.level_id.as_deref().unwrap_or("");
    let attempt = e.attempt.unwrap_or(0);
    let text = match &e.data {
        EventData::ScenarioStarted(s) => format!(
            "started   {} v{} (checksum {}…)",
            s.scenario_id,
            s.scenario_version,
            &s.checksum[..s.checksum.len().min(12)]
        ),
        EventData::LevelStarted(s) => match &s.parent {
            Some(p) => format!("level     {level} ({}, attempt {attempt}, child of {p})", s.kind),
            None => format!("level     {level} ({}, attempt {attempt})", s.kind),
        },
        EventData::ModelResponse(r) => format!(
            "model     {level}: {} tokens, ${:.4} — {}",
            r.usage.total(),
            r.cost_usd,
            match (r.text.trim().is_empty(), r.tool_calls.len()) {
                (true, 1) => "(1 tool call)".to_owned(),
                (true, n) if n > 1 => format!("({n} tool calls)"),
                _ => preview(&r.text, 60),
            }
        ),
        EventData::ToolCall(c) => {
            let path = c.arguments.get("path").and_then(|p| p.as_str()).unwrap_or("");
            format!("tool      {level}: {} {}", c.tool, preview(path, 60))
        }
        EventData::ToolResult(r) if r.is_error => {
            format!("tool      {level}: {} refused — {}", r.tool, preview(&r.content, 80))
        }
        EventData::FileCreated(f) => format!("created   {level}: {}", f.path),
        EventData::VerifierFinished(v) => format!(
            "verifier  {level}/{}: {}{}",
            v.name,
            match (v.passed, v.not_run()) {
                (true, _) => "passed",
                (false, true) => "not run",
                (false, false) => "FAILED",
            },
            if v.reasons.is_empty() {
                String::new()
            } else {
                format!(" — {}", preview(&v.reasons.join("; "), 80))
            }
        ),
        EventData::AskUser(a) => format!(
            "question  {level}: {} — answer with `baton answer RUN --answer JSON`",
            preview(&a.question.to_string(), 80)
        ),
        EventData::UserAnswered(a) => format!("answered  {}", preview(&a.answer.to_string(), 80)),
        EventData::ApprovalRequested(a) => format!(
            "approval  {level}: {} (role {}, request {}) — decide with `baton approve RUN --request {} [--reject]`",
            preview(&a.question, 80),
            a.approver_role,
            a.request_id,
            a.request_id
        ),
        EventData::ApprovalDecided(d) if d.timed_out => {
            format!("decided   {} timed out: nobody decided before its deadline", d.request_id)
        }
        EventData::ApprovalDecided(d) => format!(
            "decided   {} {} by {}{}",
            d.request_id,
            if d.approved { "approved" } else { "rejected" },
            d.by.as_deref().unwrap_or("someone"),
            d.comment.as_ref().map_or(String::new(), |c| format!(": {c}"))
        ),
        EventData::LevelFinished(f) if f.skipped => format!("skipped   {level}"),
        EventData::LevelFinished(f) => match &f.error {
            Some(err) => match f.error_kind {
                Some(kind) => format!("failed    {level} ({}): {err}", kind.as_str()),
                None => format!("failed    {level}: {err}"),
            },
            None => format!(
                "done      {level}{} ${:.4} {} tok {} ms",
                f.verdict.as_ref().map_or(String::new(), |v| format!(" {v}")),
                f.cost_usd,
                f.tokens,
                f.duration_ms
            ),
        },
        EventData::GateDecision(g) => format!(
            "gate      {} → {}{}",
            g.source,
            g.target,
            match (&g.expression, g.fallthrough) {
                (_, true) => " (no edge matched)".to_owned(),
                (Some(x), _) => format!("  [{x}]"),
                (None, _) => String::new(),
            }
        ),
        EventData::BudgetExceeded(b) => format!(
            "budget    {} cap {} crossed ({}){}",
            b.limit_kind,
            b.limit_value,
            b.observed_value,
            if b.refused_before_call { ", call refused before it was made" } else { "" }
        ),
        EventData::RetryScheduled(r) => {
            format!("retry     {level} ({}/{}): {}", r.retry, r.retries_max, preview(&r.reason, 80))
        }
        EventData::RetryAttempted(r) => {
            format!("retry     {} attempt {}: {}", r.level, r.attempt, preview(&r.reason, 80))
        }
        EventData::CancelRequested(c) => format!(
            "cancel    requested{}{}",
            c.by.as_ref().map_or(String::new(), |b| format!(" by {b}")),
            c.reason.as_ref().map_or(String::new(), |r| format!(": {}", preview(r, 80)))
        ),
        EventData::Warning(w) => format!("warning   {}", w.message),
        EventData::ScenarioUpgraded(u) => format!(
            "upgraded  v{} ({}…) → v{} ({}…)",
            u.from_version,
            u.from_checksum.chars().take(12).collect::<String>(),
            u.version,
            u.checksum.chars().take(12).collect::<String>()
        ),
        EventData::ModelStopped(m) => {
            format!("stopped   {level}: call {} ended with `{}`", m.call, m.stop_reason)
        }
        EventData::ProviderRetry(r) => format!(
            "retry     {level}: {} ({}) attempt {} failed, retrying in {} ms: {}",
            r.provider,
            r.model,
            r.attempt,
            r.wait_ms,
            preview(&r.reason, 80)
        ),
        EventData::ProviderFailover(f) => format!(
            "failover  {level}: {} ({}) failed: {}",
            f.provider,
            f.model,
            preview(&f.reason, 80)
        ),
        EventData::ScenarioFinished(f) => format!(
            "finished  {} — ${:.4}, {} tokens, {} levels{}{}",
            f.status.as_str(),
            f.totals.cost_usd,
            f.totals.tokens,
            f.totals.levels_run,
            f.tree_totals.map_or(String::new(), |t| format!(
                "; with the runs it started ${:.4}, {} tokens, {} levels",
                t.cost_usd, t.tokens, t.levels_run
            )),
            f.aborted_reason.as_ref().map_or(String::new(), |r| format!(" ({r})"))
        ),
        EventData::RoutingDecision(r) => format!(
            "routing   {level}: {}:{}/{} ({}){}",
            r.tier,
            r.provider,
            r.model,
            r.source,
            if r.failovers.is_empty() {
                String::new()
            } else {
                format!(" after failing over: {}", preview(&r.failovers.join("; "), 80))
            }
        ),
        EventData::LevelTimedOut(t) => format!(
            "timed out {level}: cut after {:.1} s (timeout_s {:.1} s)",
            t.elapsed_ms as f64 / 1000.0,
            t.timeout_ms as f64 / 1000.0
        ),
        EventData::ModelCallCut(c) => format!(
            "cut       {level}: {} ({}) cut after {} bytes: ~{} tokens, ${:.4} counted",
            c.provider,
            c.model,
            c.streamed_bytes,
            c.usage.total(),
            c.cost_usd
        ),
        EventData::RunInterrupted(i) => format!(
            "interrupted {}: {} — continue with `baton resume RUN`",
            i.cause,
            preview(&i.reason, 120)
        ),
        EventData::RunResumed(r) => {
            let by = r.by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
            let process = r.process.as_deref().map(|p| format!(" in {p}")).unwrap_or_default();
            format!(
                "resumed   (resume {}){by}{} after: {}",
                r.resumes,
                preview(&process, 60),
                preview(&r.after, 100)
            )
        }
        EventData::RunTakenOver(t) => format!(
            "takeover  {level}: {} takes the run over from {}{}",
            preview(&t.by, 60),
            preview(t.previous.as_deref().unwrap_or("a driver the log does not name"), 60),
            if t.cut.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} call(s) it sent unanswered, counted at ${:.4}",
                    t.cut.len(),
                    t.charged_usd
                )
            }
        ),
        EventData::RunPaused(p) => format!(
            "paused    {}{}",
            p.reason,
            p.detail.as_deref().map(|d| format!(": {}", preview(d, 100))).unwrap_or_default()
        ),
        EventData::SteeringReceived(m) => {
            format!("steering  {} from {}: {}", m.id, m.by, preview(&m.message, 80))
        }
        EventData::LateResultDiscarded(l) => format!(
            "late      {level}: a result{} ({} bytes) came after the cancel and was dropped",
            l.verdict.as_ref().map_or(String::new(), |v| format!(" ({v})")),
            l.output_bytes
        ),
        EventData::ToolCallStarted(t) => {
            format!(
                "effect    {level}: {} (toolset {}) called with key {}",
                t.tool, t.toolset, t.key
            )
        }
        EventData::ToolCallReissued(t) => format!(
            "effect    {level}: {} called again with key {}: its first call left no receipt",
            t.tool, t.key
        ),
        EventData::ToolCallFinished(t) if t.is_error && t.key.is_some() => {
            format!("effect    {level}: {} failed — {}", t.tool, preview(&t.content, 80))
        }
        EventData::SteeringDelivered(d) => {
            format!("steered   {level}: call {} took {}", d.call_index, d.ids.join(", "))
        }
        EventData::AgentHandoff(h) => {
            format!("handoff   {level}: {} → {} (attempt {})", h.from_role, h.to_role, h.attempt)
        }
        EventData::Heartbeat(h) => {
            let mut line = format!("working   {level}: {:.0} s", h.elapsed_ms as f64 / 1000.0);
            if h.streamed_bytes > 0 {
                line.push_str(&format!(", {} bytes streamed", h.streamed_bytes));
            }
            if h.tool_calls > 0 {
                line.push_str(&format!(", {} tool calls", h.tool_calls));
            }
            line
        }
        EventData::ModelCallFailed(f) => {
            format!("model     {level}: call failed ({}) — {}", f.provider, preview(&f.message, 80))
        }
        EventData::RunForked(f) => format!(
            "forked    from run {} at event {}{}{}",
            f.from_run_id,
            f.at_seq,
            if f.input.is_some() { ", new input" } else { "" },
            f.restored
                .as_deref()
                .map(|s| format!(", workspace restored to {}", s.get(..12).unwrap_or(s)))
                .unwrap_or_default()
        ),
        EventData::RunReplayed(r) => {
            format!("replay    of run {} ({}, from {})", r.of_run_id, r.strategy.as_str(), r.source)
        }
        EventData::ScenarioSelected(s) => format!(
            "selected  {} ({}{}){}",
            s.scenario_id,
            match s.how.as_str() {
                "pin" => "pinned".to_owned(),
                "intent" => format!("intent route {}", s.intent.as_deref().unwrap_or("")),
                "classifier" =>
                    format!("job kind {}: the classifier picks", s.kind.as_deref().unwrap_or("")),
                other => other.to_owned(),
            },
            s.kind
                .as_ref()
                .filter(|_| s.how != "classifier")
                .map_or(String::new(), |k| format!(", kind {k}")),
            s.warning.as_ref().map_or(String::new(), |w| format!(" — warning: {w}"))
        ),
        EventData::ScenarioChained(c) => format!(
            "chained   {} → {} (route `{}` from {}, hop {}){}",
            c.from,
            c.to,
            c.route,
            if c.level_id.is_empty() { "no level" } else { c.level_id.as_str() },
            c.depth,
            c.warning.as_ref().map_or(String::new(), |w| format!(" — warning: {w}"))
        ),
        EventData::ChildRunStarted(c) => format!(
            "child     {} {} ({}){}",
            c.link,
            c.child_run_id,
            c.scenario_id,
            c.budget.max_cost_usd.map_or(String::new(), |usd| format!(", up to ${usd:.4}"))
        ),
        EventData::ChildRunSettled(c) => format!(
            "settled   {} {} {}{} ${:.4} {} tok",
            c.link,
            c.child_run_id,
            c.status.as_str(),
            c.aborted_reason.as_ref().map_or(String::new(), |r| format!(" ({r})")),
            c.tree_totals.cost_usd,
            c.tree_totals.tokens
        ),
        EventData::ScratchpadWritten(w) if w.value.is_null() => {
            format!("note      {level}: scratchpad.{} removed", w.key)
        }
        EventData::ScratchpadWritten(w) => {
            format!(
                "note      {level}: scratchpad.{} = {}",
                w.key,
                preview(&w.value.to_string(), 60)
            )
        }
        EventData::ChildRunUnsettled(c) => format!(
            "unsettled {} {} still {} after {} ms: the run ends without its result",
            c.link, c.child_run_id, c.status, c.waited_ms
        ),
        EventData::WavePlanned(p) => format!(
            "wave      {level}: {} assignments planned (worker {}, max_parallel {}, timeout {} ms, {})",
            p.assignments.len(),
            p.worker.as_deref().unwrap_or("outside"),
            p.max_parallel.map_or_else(|| "default".to_owned(), |n| n.to_string()),
            p.timeout_ms,
            p.dispatch
        ),
        EventData::WaveDispatched(d) => format!(
            "dispatch  {level}: {} → {}{}",
            d.assignment_id,
            d.worker_run,
            d.by.as_ref().map_or(String::new(), |b| format!(" by {b}"))
        ),
        EventData::WaveRecorded(r) => format!(
            "record    {level}: {} {}{} — {}",
            r.assignment_id,
            r.outcome.as_str(),
            r.reason.as_ref().map_or(String::new(), |why| format!(" ({why})")),
            preview(&r.summary, 80)
        ),
        EventData::WaveDecided(d) => {
            format!(
                "decide    {level}: {}{} — {}{}",
                d.decision.as_str(),
                if d.closes { " (ends the wave)" } else { "" },
                d.counts,
                if d.dispatched.is_empty() {
                    String::new()
                } else {
                    format!("; dispatches {}", d.dispatched.join(", "))
                }
            )
        }
        EventData::PromptSent(_)
        | EventData::VerifierStarted(_)
        | EventData::BudgetConsumed(_)
        | EventData::ToolResult(_)
        | EventData::ToolCallFinished(_)
        | EventData::ToolsListed(_) => {
            return None;
        }
    };
    Some(format!("#{:<4} {}", e.seq, escape::one_line(&text)))
}

/// Where `run --stream` sends the text of model answers as it arrives: a line per piece,
/// `      ⋯ LEVEL TEXT`, its control characters escaped like every line's (written from the
/// task reading the answer; a reader that went away stops the lines, not the run).
pub(crate) fn live_sink() -> baton_engine::cancel::LiveSink {
    baton_engine::cancel::LiveSink(std::sync::Arc::new(|t: baton_engine::cancel::LiveText| {
        let _ = crate::out::outln!(
            "      ⋯ {} {}",
            escape::one_line(&t.level_id),
            escape::one_line(&t.text)
        );
    }))
}

fn preview(text: &str, max: usize) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let cut: String = one_line.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// A timeline line as shown on a terminal: verdicts and outcomes in colour.
pub(crate) fn styled(line: &str) -> String {
    use std::io::IsTerminal as _;
    if !std::io::stdout().is_terminal() || std::env::var_os("NO_COLOR").is_some() {
        return line.to_owned();
    }
    const GREEN: &str = "\x1b[32m";
    const RED: &str = "\x1b[31m";
    const YELLOW: &str = "\x1b[33m";
    const DIM: &str = "\x1b[2m";
    const RESET: &str = "\x1b[0m";
    let mut out = line
        .replace(" PASS ", &format!(" {GREEN}PASS{RESET} "))
        .replace(" FAIL ", &format!(" {RED}FAIL{RESET} "))
        .replace("FAILED", &format!("{RED}FAILED{RESET}"))
        .replace("finished  completed", &format!("finished  {GREEN}completed{RESET}"))
        .replace("finished  failed", &format!("finished  {RED}failed{RESET}"))
        .replace("finished  aborted", &format!("finished  {RED}aborted{RESET}"))
        .replace("finished  cancelled", &format!("finished  {YELLOW}cancelled{RESET}"));
    for word in ["approval  ", "question  ", "budget    ", "warning   "] {
        out = out.replace(word, &format!("{YELLOW}{word}{RESET}"));
    }
    if let Some(rest) = out.strip_prefix('#') {
        let cut = rest.find(' ').unwrap_or(0);
        out = format!("{DIM}#{}{RESET}{}", &rest[..cut], &rest[cut..]);
    }
    out
}

/// An event as one JSON line: seq, at, kind, level_id, attempt, data.
pub(crate) fn json_line(e: &Event) -> String {
    serde_json::json!({
        "seq": e.seq,
        "at": e.at,
        "kind": e.data.kind(),
        "level_id": e.level_id,
        "attempt": e.attempt,
        "data": e.data.payload(),
    })
    .to_string()
}

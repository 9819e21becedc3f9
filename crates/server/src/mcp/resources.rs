//! MCP resources and prompts: each run's timeline (`baton://runs/{run_id}/timeline`, Markdown,
//! readable and subscribable — `resources/subscribe` for hosts on the 2025 protocol,
//! `subscriptions/listen` on 2026-07-28), the guide (`baton://guide`, when to use a
//! scenario, a wave, manual dispatch), and the prompts `baton` (the orchestration summary)
//! and `baton:waves` (recent waves).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_engine::Status;
use rmcp::ErrorData;
use rmcp::model::{
    CacheScope, GetPromptResult, ListResourceTemplatesResult, ListResourcesResult, Prompt,
    PromptMessage, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
    Role as MessageRole, SubscriptionFilter,
};
use rmcp::service::{Peer, RoleServer, SubscriptionContext};
use serde_json::Value;

use super::calls::caller_runs;
use super::reply::STATIC_TTL_MS;
use super::tools::level_of;
use crate::app::App;
use crate::auth::Caller;
use crate::problem::Problem;
use crate::runs::{self, RunView};

/// The guide's address and text.
pub(crate) const GUIDE_URI: &str = "baton://guide";
const GUIDE: &str = include_str!("guide.md");
/// Run timelines' address: `baton://runs/{run_id}/timeline`.
const RUNS_PREFIX: &str = "baton://runs/";
const TIMELINE_SUFFIX: &str = "/timeline";
/// The runs `resources/list` names, newest first.
const LISTED_RUNS: usize = 50;
/// The events a timeline shows: the last ones of a longer log.
const TIMELINE_EVENTS_MAX: usize = 400;
/// The longest line an event gets in a timeline, in characters.
const EVENT_CHARS_MAX: usize = 240;
/// Subscriptions one session may hold.
const SUBSCRIPTIONS_MAX: usize = 64;
/// How long a watcher waits for the store before it looks again.
const WATCH_EACH: Duration = Duration::from_secs(30);

fn timeline_uri(run_id: &str) -> String {
    format!("{RUNS_PREFIX}{run_id}{TIMELINE_SUFFIX}")
}

/// The run a timeline's address names.
fn run_of(uri: &str) -> Option<&str> {
    let id = uri.strip_prefix(RUNS_PREFIX)?.strip_suffix(TIMELINE_SUFFIX)?;
    (!id.is_empty() && id.len() <= 128 && !id.contains('/')).then_some(id)
}

fn not_found(uri: &str) -> ErrorData {
    ErrorData::resource_not_found(
        format!(
            "no resource {uri}; Baton serves {GUIDE_URI} and {RUNS_PREFIX}{{run_id}}{TIMELINE_SUFFIX} for the caller's runs (resources/list names the newest)"
        ),
        None,
    )
}

fn internal(p: &Problem) -> ErrorData {
    ErrorData::internal_error(p.detail.clone(), None)
}

/// The guide and the caller's newest runs' timelines.
pub(crate) async fn list(app: &App, caller: &Caller) -> Result<ListResourcesResult, ErrorData> {
    let runs = caller_runs(app, caller, LISTED_RUNS).await.map_err(|p| internal(&p))?;
    let mut resources = vec![
        Resource::new(GUIDE_URI, "Baton guide")
            .with_description("When to use a scenario, a wave, or manual dispatch and record")
            .with_mime_type("text/markdown"),
    ];
    for r in runs {
        resources.push(
            Resource::new(timeline_uri(&r.run_id), format!("run {} ({})", r.run_id, r.scenario_id))
                .with_description(format!("The timeline of run {}: {}", r.run_id, r.status))
                .with_mime_type("text/markdown"),
        );
    }
    Ok(ListResourcesResult::with_all_items(resources)
        .with_ttl_ms(0)
        .with_cache_scope(CacheScope::Private))
}

pub(crate) fn templates() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![
        ResourceTemplate::new(format!("{RUNS_PREFIX}{{run_id}}{TIMELINE_SUFFIX}"), "run timeline")
            .with_description(
                "A run's status, totals, what it waits on, and its events, oldest first; subscribe to hear when it grows",
            )
            .with_mime_type("text/markdown"),
    ])
    .with_ttl_ms(STATIC_TTL_MS)
    .with_cache_scope(CacheScope::Public)
}

/// Reads the guide or a run's timeline.
pub(crate) async fn read(
    app: &App,
    caller: &Caller,
    uri: &str,
) -> Result<ReadResourceResult, ErrorData> {
    if uri == GUIDE_URI {
        return Ok(ReadResourceResult::new(vec![
            ResourceContents::text(GUIDE, uri).with_mime_type("text/markdown"),
        ])
        .with_ttl_ms(STATIC_TTL_MS)
        .with_cache_scope(CacheScope::Public));
    }
    let run_id = run_of(uri).ok_or_else(|| not_found(uri))?;
    let text = timeline(app, caller, run_id)
        .await
        .map_err(|p| if p.status == 404 { not_found(uri) } else { internal(&p) })?;
    Ok(ReadResourceResult::new(vec![
        ResourceContents::text(text, uri).with_mime_type("text/markdown"),
    ])
    .with_ttl_ms(0)
    .with_cache_scope(CacheScope::Private))
}

/// A value as one short line: JSON, cut to [`EVENT_CHARS_MAX`] characters.
fn short(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() <= EVENT_CHARS_MAX {
        return text;
    }
    let cut: String = text.chars().take(EVENT_CHARS_MAX).collect();
    format!("{cut}…")
}

/// A run's timeline as Markdown: the run, then one line per event.
async fn timeline(app: &App, caller: &Caller, run_id: &str) -> Result<String, Problem> {
    let view = runs::run_view(app, caller, run_id).await?;
    let events = app.store.load(run_id, 0).await?;
    let mut out = String::new();
    let _ = writeln!(out, "# Run {} — {} ({})\n", view.run_id, view.scenario_id, view.status);
    let _ = writeln!(
        out,
        "cost ${:.4}, {} tokens, {} ms; last event #{}",
        view.cost_usd, view.tokens, view.duration_ms, view.last_seq
    );
    if let Some(level) = &view.level {
        let _ = writeln!(out, "level running: `{level}`");
    }
    for w in &view.waiting_on {
        let _ = writeln!(
            out,
            "waits for {} at `{}`{}",
            w.wants,
            w.level_id,
            w.request_id.as_deref().map(|r| format!(" (request {r})")).unwrap_or_default()
        );
    }
    if let Some(reason) = &view.reason {
        let _ = writeln!(out, "reason: {}", short(&Value::String(reason.clone())));
    }
    let skipped = events.len().saturating_sub(TIMELINE_EVENTS_MAX);
    let _ = writeln!(out, "\n## Events\n");
    if skipped > 0 {
        let _ =
            writeln!(out, "({skipped} earlier events left out; run_events pages through all)\n");
    }
    for e in events.iter().skip(skipped) {
        let mut data = serde_json::to_value(&e.data).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut data {
            map.remove("kind");
        }
        let level = level_of(e);
        let _ = writeln!(
            out,
            "- #{} {} {}{} {}",
            e.seq,
            e.at.format("%H:%M:%S%.3f"),
            e.data.kind(),
            level,
            short(&data)
        );
    }
    if let Some(output) = &view.output {
        let _ = writeln!(out, "\n## Output\n\n{output}");
    }
    Ok(out)
}

/// Watches a run's log and calls `updated` whenever it grows, until the run has ended and
/// its last event was told, or `updated` says the listener is gone.
async fn watch<F, Fut>(app: Arc<App>, run_id: String, mut updated: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut after = match app.store.run(&run_id).await {
        Ok(Some(r)) => r.last_seq,
        _ => return,
    };
    loop {
        tokio::select! {
            _ = app.store.wait_for_events(&run_id, after, WATCH_EACH) => {}
            () = app.stop.cancelled() => return,
        }
        let Ok(Some(r)) = app.store.run(&run_id).await else { return };
        if r.last_seq > after {
            after = r.last_seq;
            if !updated().await {
                return;
            }
        }
        if Status::from_name(&r.status).is_some_and(Status::is_final) && r.last_seq <= after {
            return;
        }
    }
}

/// A session's legacy subscriptions (`resources/subscribe`).
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    watching: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        let watching = self.watching.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, task) in watching.drain() {
            task.abort();
        }
    }
}

impl Subscriptions {
    pub(crate) async fn subscribe(
        &self,
        app: &Arc<App>,
        caller: &Caller,
        uri: &str,
        peer: Peer<RoleServer>,
    ) -> Result<(), ErrorData> {
        if uri == GUIDE_URI {
            // The guide never changes while the server runs.
            return Ok(());
        }
        let run_id = run_of(uri).ok_or_else(|| not_found(uri))?;
        app.visible_run(caller, run_id).await.map_err(|_| not_found(uri))?;
        let mut watching = self.watching.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        watching.retain(|_, task| !task.is_finished());
        if watching.contains_key(uri) {
            return Ok(());
        }
        if watching.len() >= SUBSCRIPTIONS_MAX {
            return Err(ErrorData::invalid_request(
                format!(
                    "this session holds {SUBSCRIPTIONS_MAX} subscriptions already; unsubscribe from one first"
                ),
                None,
            ));
        }
        let uri_owned = uri.to_owned();
        let task = tokio::spawn(watch(Arc::clone(app), run_id.to_owned(), move || {
            let (peer, uri) = (peer.clone(), uri_owned.clone());
            async move {
                let param = rmcp::model::ResourceUpdatedNotificationParam::new(uri);
                peer.notify_resource_updated(param).await.is_ok()
            }
        }));
        watching.insert(uri.to_owned(), task);
        Ok(())
    }

    pub(crate) fn unsubscribe(&self, uri: &str) {
        let mut watching = self.watching.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(task) = watching.remove(uri) {
            task.abort();
        }
    }
}

/// What of a `subscriptions/listen` filter is served: run timelines (whether the caller may
/// see each is checked when listening; one it may not is never told of).
pub(crate) fn acceptable(requested: &SubscriptionFilter) -> SubscriptionFilter {
    let mut accepted = SubscriptionFilter::new();
    accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
        uris.iter().filter(|u| run_of(u).is_some()).take(SUBSCRIPTIONS_MAX).cloned().collect()
    });
    accepted
}

/// Serves one `subscriptions/listen` until the host cancels it. A timeline the caller
/// cannot read ends the listen with the answer a missing run gets — `resource_not_found`,
/// the same words for another tenant's run as for none (the SDK has acknowledged the
/// filter before this runs, and the acknowledgment cannot wait on the store).
pub(crate) async fn listen(
    app: &Arc<App>,
    caller: &Caller,
    context: SubscriptionContext,
) -> Result<(), ErrorData> {
    let uris = context.accepted().resource_subscriptions.clone().unwrap_or_default();
    let mut runs = Vec::with_capacity(uris.len());
    for uri in uris {
        let Some(run_id) = run_of(&uri).map(str::to_owned) else { continue };
        if app.visible_run(caller, &run_id).await.is_err() {
            return Err(not_found(&uri));
        }
        runs.push((uri, run_id));
    }
    let mut tasks = Vec::new();
    for (uri, run_id) in runs {
        let sink = context.sink().clone();
        tasks.push(tokio::spawn(watch(Arc::clone(app), run_id, move || {
            let (sink, uri) = (sink.clone(), uri.clone());
            async move { sink.notify_resource_updated(uri).await.is_ok() }
        })));
    }
    context.cancelled().await;
    for t in tasks {
        t.abort();
    }
    Ok(())
}

/// The prompts.
pub(crate) fn prompts() -> Vec<Prompt> {
    vec![
        Prompt::new(
            "baton",
            Some(
                "Baton's orchestration summary: runs waiting for a person, runs under way, recent ends, waves",
            ),
            None,
        ),
        Prompt::new("baton:waves", Some("Recent waves, each with its assignments' outcomes"), None),
    ]
}

/// A prompt's messages, made from the caller's runs now.
pub(crate) async fn prompt(
    app: &Arc<App>,
    caller: &Caller,
    name: &str,
) -> Result<GetPromptResult, ErrorData> {
    let text = match name {
        "baton" => summary_text(app, caller).await,
        "baton:waves" => waves_text(app, caller).await,
        other => {
            return Err(ErrorData::invalid_params(
                format!("no prompt `{other}`; Baton's prompts are `baton` and `baton:waves`"),
                None,
            ));
        }
    }
    .map_err(|p| internal(&p))?;
    Ok(GetPromptResult::new(vec![PromptMessage::new_text(MessageRole::User, text)])
        .with_description(format!("Baton {name} as of {}", chrono::Utc::now().to_rfc3339())))
}

async fn recent(app: &App, caller: &Caller, limit: usize) -> Result<Vec<RunView>, Problem> {
    let mut views = Vec::new();
    for r in caller_runs(app, caller, limit).await? {
        views.push(runs::run_view(app, caller, &r.run_id).await?);
    }
    Ok(views)
}

/// One run of a summary: id, scenario, status, `more`, cost.
fn run_line(out: &mut String, r: &RunView, more: &str) {
    let _ = writeln!(
        out,
        "- run {} ({}) {}{more}, ${:.4}",
        r.run_id, r.scenario_id, r.status, r.cost_usd
    );
}

async fn summary_text(app: &Arc<App>, caller: &Caller) -> Result<String, Problem> {
    let runs = recent(app, caller, LISTED_RUNS).await?;
    let mut out = String::from(
        "Here is Baton's orchestration state. Act on what needs someone first (run_approve, run_reject, run_answer), then follow what is under way (run_get, wave_get).\n",
    );
    let waiting: Vec<&RunView> =
        runs.iter().filter(|r| r.waiting_on.iter().any(|w| w.wants != "child run")).collect();
    let _ = writeln!(out, "\n## Waiting for a person ({})", waiting.len());
    for r in &waiting {
        for w in r.waiting_on.iter().filter(|w| w.wants != "child run") {
            let _ = writeln!(
                out,
                "- run {} ({}) level `{}` wants {}{}: {}",
                r.run_id,
                r.scenario_id,
                w.level_id,
                w.wants,
                w.request_id.as_deref().map(|id| format!(" (request {id})")).unwrap_or_default(),
                short(&w.question)
            );
        }
    }
    let under_way: Vec<&RunView> = runs
        .iter()
        .filter(|r| !Status::from_name(&r.status).is_some_and(Status::is_final))
        .filter(|r| r.waiting_on.iter().all(|w| w.wants == "child run"))
        .collect();
    let _ = writeln!(out, "\n## Under way ({})", under_way.len());
    for r in &under_way {
        let at = r.level.as_deref().map(|l| format!(" at `{l}`")).unwrap_or_default();
        run_line(&mut out, r, &at);
    }
    let ended: Vec<&RunView> = runs
        .iter()
        .filter(|r| Status::from_name(&r.status).is_some_and(Status::is_final))
        .take(10)
        .collect();
    let _ = writeln!(out, "\n## Recently ended ({} shown)", ended.len());
    for r in &ended {
        let verdict = r.verdict.as_deref().map(|v| format!(", verdict {v}")).unwrap_or_default();
        run_line(&mut out, r, &verdict);
    }
    let records = caller_runs(app, caller, LISTED_RUNS).await?;
    let waves = app.deciding()?.wave_views(&records).await?;
    let s = baton_engine::wave_actions::summarize(&waves);
    let _ = writeln!(
        out,
        "\n## Waves\n{} waves ({} under way), assignments {}, ${:.4}",
        s["waves"],
        s["under_way"],
        short(&s["assignments"]),
        s["cost_usd"].as_f64().unwrap_or(0.0)
    );
    Ok(out)
}

async fn waves_text(app: &Arc<App>, caller: &Caller) -> Result<String, Problem> {
    let records = caller_runs(app, caller, LISTED_RUNS).await?;
    let waves = app.deciding()?.wave_views(&records).await?;
    let mut out = format!(
        "Here are Baton's recent waves ({}), newest first. `current` names the newest under way; wave_get shows one whole.\n",
        waves.len()
    );
    for v in waves.iter().take(20) {
        let c = baton_engine::wave_actions::counts_of(v);
        let _ = writeln!(
            out,
            "\n## Wave {} ({}, decision {}{})\n{} assignments: {c}",
            v["run_id"].as_str().unwrap_or_default(),
            v["run_status"].as_str().unwrap_or_default(),
            v["decision"].as_str().unwrap_or_default(),
            if v["ended"] == Value::Bool(true) { ", ended" } else { "" },
            c.assignments,
        );
        for a in v["assignments"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "- {} (task {}) {}: {}{}",
                a["id"].as_str().unwrap_or_default(),
                a["task_id"].as_str().unwrap_or_default(),
                a["stage"].as_str().unwrap_or_default(),
                a["outcome"].as_str().unwrap_or("-"),
                a["summary"]
                    .as_str()
                    .map(|s| format!(" — {}", short(&Value::String(s.to_owned()))))
                    .unwrap_or_default()
            );
        }
    }
    Ok(out)
}

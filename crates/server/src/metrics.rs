//! Prometheus metrics (`GET /metrics`, OpenMetrics text, names prefixed `baton_`), read off
//! the events this server appends — the log is the one source of what happened, so the
//! metrics never disagree with it — plus what only the server knows: its queue, its
//! drives, the store's commit latency and its HTTP answers.
//!
//! A batch of events is read before it is appended ([`Metrics::read`], borrowing it) and
//! counted only once the store took it ([`Metrics::count`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use baton_engine::event::{Event, EventData};
use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A queue's name: a closed set (queues are declared, at most `QUEUES_MAX`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScenarioLabel {
    scenario: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishedLabels {
    scenario: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    provider: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    provider: String,
    model: String,
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerifierLabels {
    verifier: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TriggerLabel {
    trigger: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    route: String,
    status: String,
}

fn seconds_buckets() -> Histogram {
    // 1 ms to about 9 h.
    Histogram::new(exponential_buckets(0.001, 2.5, 18))
}

fn latency_buckets() -> Histogram {
    // 50 µs to about 3 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
}

/// OpenMetrics text in Prometheus' classic text format: a counter's samples keep their
/// `_total` name and its `HELP` and `TYPE` lines take it too; `UNIT` lines and the closing
/// `# EOF` go (the classic format has neither). Histograms and gauges read the same in both.
fn classic(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let named = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(named.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Every metric of the server.
pub(crate) struct Metrics {
    registry: Registry,
    runs_started: Family<ScenarioLabel, Counter>,
    runs_finished: Family<FinishedLabels, Counter>,
    level_seconds: Family<KindLabel, Histogram, fn() -> Histogram>,
    model_calls: Family<ModelLabels, Counter>,
    model_failures: Family<ModelLabels, Counter>,
    model_tokens: Family<TokenLabels, Counter>,
    model_cost: Family<ModelLabels, Counter<f64, AtomicU64>>,
    retries: Family<ModelLabels, Counter>,
    failovers: Family<ModelLabels, Counter>,
    verifiers: Family<VerifierLabels, Counter>,
    approval_idle: Histogram,
    stops: Family<TriggerLabel, Counter>,
    slot_waiting: Gauge,
    queue_depth: Family<QueueLabel, Gauge>,
    queue_driven: Family<QueueLabel, Gauge>,
    drives: Gauge,
    commit_seconds: Histogram,
    /// How long a claimed run had waited, since it was last written, for a worker.
    claim_wait_seconds: Histogram,
    http: Family<HttpLabels, Counter>,
    connections: Gauge,
    connections_closed: Family<ReasonLabel, Counter>,
    /// What later events need from earlier ones of the same run: a level's kind, when an
    /// approval was asked, the run's scenario.
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    level_kinds: HashMap<(String, String), String>,
    asked: HashMap<(String, String), DateTime<Utc>>,
    scenarios: HashMap<String, String>,
}

/// One fact a batch holds, counted once the batch is stored.
#[derive(Debug)]
pub(crate) enum Seen {
    Started(String),
    Finished { run_id: String, status: String },
    Level { kind: String, seconds: f64 },
    Model { provider: String, model: String, input: u64, output: u64, cost: f64 },
    ModelFailed { provider: String, model: String },
    Retry { provider: String, model: String },
    Failover { provider: String, model: String },
    Verifier { name: String, passed: bool },
    ApprovalIdle(f64),
    Stop(String),
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("baton");
        let m = Metrics {
            runs_started: Family::default(),
            runs_finished: Family::default(),
            level_seconds: Family::new_with_constructor(seconds_buckets),
            model_calls: Family::default(),
            model_failures: Family::default(),
            model_tokens: Family::default(),
            model_cost: Family::default(),
            retries: Family::default(),
            failovers: Family::default(),
            verifiers: Family::default(),
            approval_idle: seconds_buckets(),
            stops: Family::default(),
            slot_waiting: Gauge::default(),
            queue_depth: Family::default(),
            queue_driven: Family::default(),
            drives: Gauge::default(),
            commit_seconds: latency_buckets(),
            // 10 ms to about 3 hours.
            claim_wait_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 21)),
            http: Family::default(),
            connections: Gauge::default(),
            connections_closed: Family::default(),
            open: Mutex::default(),
            registry: Registry::default(),
        };
        registry.register("runs_started", "Runs started, by scenario", m.runs_started.clone());
        registry.register(
            "runs_finished",
            "Runs ended, by scenario and final status",
            m.runs_finished.clone(),
        );
        registry.register_with_unit(
            "level_duration",
            "How long each level attempt took, by level kind",
            prometheus_client::registry::Unit::Seconds,
            m.level_seconds.clone(),
        );
        registry.register(
            "model_calls",
            "Model answers, by provider and model",
            m.model_calls.clone(),
        );
        registry.register(
            "model_call_failures",
            "Model calls that failed for good, by provider and model",
            m.model_failures.clone(),
        );
        registry.register(
            "model_tokens",
            "Tokens of model answers, by provider, model and direction",
            m.model_tokens.clone(),
        );
        registry.register(
            "model_cost_usd",
            "What model answers cost in US dollars, by provider and model",
            m.model_cost.clone(),
        );
        registry.register(
            "provider_retries",
            "Model calls retried, by provider and model",
            m.retries.clone(),
        );
        registry.register(
            "provider_failovers",
            "Model calls that went to another provider, by the one that failed",
            m.failovers.clone(),
        );
        registry.register(
            "verifier_outcomes",
            "Verifier results, by verifier and outcome",
            m.verifiers.clone(),
        );
        registry.register_with_unit(
            "approval_idle",
            "How long approvals waited for a person",
            prometheus_client::registry::Unit::Seconds,
            m.approval_idle.clone(),
        );
        registry.register(
            "run_stops",
            "Cancels, timeouts, budget stops and interruptions, by trigger",
            m.stops.clone(),
        );
        registry.register(
            "slot_waiting",
            "Jobs in this process waiting for a free drive slot",
            m.slot_waiting.clone(),
        );
        registry.register(
            "queue_depth",
            "Runs waiting for a driver in each queue, across the database",
            m.queue_depth.clone(),
        );
        registry.register(
            "queue_driven",
            "Runs of each queue leased by a worker now, across the database",
            m.queue_driven.clone(),
        );
        registry.register("drives_active", "Jobs being driven or waiting to be", m.drives.clone());
        registry.register_with_unit(
            "store_commit",
            "How long the store took to append a batch of events",
            prometheus_client::registry::Unit::Seconds,
            m.commit_seconds.clone(),
        );
        registry.register_with_unit(
            "claim_wait",
            "How long each run a worker claimed had waited for it, since its last write",
            prometheus_client::registry::Unit::Seconds,
            m.claim_wait_seconds.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP answers, by method, route and status",
            m.http.clone(),
        );
        registry.register("http_connections", "HTTP connections open", m.connections.clone());
        registry.register(
            "http_connections_closed",
            "HTTP connections the server closed or refused, by reason (shed, header_timeout, body_timeout, idle_timeout, write_timeout, full, peer_full)",
            m.connections_closed.clone(),
        );
        Metrics { registry, ..m }
    }

    /// What a batch of a run's events will count once stored.
    pub(crate) fn read(&self, run_id: &str, events: &[Event]) -> Vec<Seen> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut seen = Vec::new();
        for e in events {
            let level = || (run_id.to_owned(), e.level_id.clone().unwrap_or_default());
            match &e.data {
                EventData::ScenarioStarted(s) => {
                    open.scenarios.insert(run_id.to_owned(), s.scenario_id.clone());
                    seen.push(Seen::Started(s.scenario_id.clone()));
                }
                EventData::ScenarioFinished(f) => {
                    let status = serde_json::to_value(f.status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    seen.push(Seen::Finished { run_id: run_id.to_owned(), status });
                }
                EventData::LevelStarted(s) => {
                    open.level_kinds.insert(level(), s.kind.clone());
                }
                EventData::LevelFinished(f) => {
                    let kind =
                        open.level_kinds.remove(&level()).unwrap_or_else(|| "unknown".to_owned());
                    seen.push(Seen::Level { kind, seconds: f.duration_ms as f64 / 1000.0 });
                }
                EventData::ModelResponse(r) => seen.push(Seen::Model {
                    provider: r.provider.clone(),
                    model: r.model.clone(),
                    input: r.usage.input_tokens,
                    output: r.usage.output_tokens,
                    cost: r.cost_usd,
                }),
                EventData::ModelCallFailed(f) => seen
                    .push(Seen::ModelFailed { provider: f.provider.clone(), model: String::new() }),
                EventData::ProviderRetry(r) => {
                    seen.push(Seen::Retry { provider: r.provider.clone(), model: r.model.clone() });
                }
                EventData::ProviderFailover(f) => {
                    seen.push(Seen::Failover {
                        provider: f.provider.clone(),
                        model: f.model.clone(),
                    });
                }
                // A verifier left out after an earlier one failed neither passed nor failed.
                EventData::VerifierFinished(v) if !v.not_run() => {
                    seen.push(Seen::Verifier { name: v.name.clone(), passed: v.passed });
                }
                EventData::ApprovalRequested(a) => {
                    open.asked.insert((run_id.to_owned(), a.request_id.clone()), e.at);
                }
                EventData::ApprovalDecided(d) => {
                    if let Some(asked) =
                        open.asked.remove(&(run_id.to_owned(), d.request_id.clone()))
                    {
                        let idle = (e.at - asked).to_std().unwrap_or_default();
                        seen.push(Seen::ApprovalIdle(idle.as_secs_f64()));
                    }
                }
                EventData::CancelRequested(c) => seen.push(Seen::Stop(
                    if c.by.is_some() { "cancel_by_person" } else { "cancel" }.to_owned(),
                )),
                EventData::LevelTimedOut(_) => seen.push(Seen::Stop("level_timeout".to_owned())),
                EventData::BudgetExceeded(_) => seen.push(Seen::Stop("budget".to_owned())),
                EventData::RunInterrupted(i) => {
                    seen.push(Seen::Stop(format!("interrupted_{}", i.cause)));
                }
                _ => {}
            }
        }
        seen
    }

    /// Whether counting `seen` needs the run's scenario from the store: it ends a run this
    /// process did not see start.
    pub(crate) fn wants_scenario(&self, seen: &[Seen], run_id: &str) -> bool {
        seen.iter().any(|s| matches!(s, Seen::Finished { .. }))
            && !self
                .open
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .scenarios
                .contains_key(run_id)
    }

    /// Counts what a stored batch held; `scenario` names the run's scenario when this
    /// process did not see it start.
    pub(crate) fn count(&self, seen: Vec<Seen>, scenario: Option<&str>) {
        for s in seen {
            match s {
                Seen::Started(scenario) => {
                    self.runs_started.get_or_create(&ScenarioLabel { scenario }).inc();
                }
                Seen::Finished { run_id, status } => {
                    let known = self
                        .open
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .scenarios
                        .remove(&run_id);
                    let scenario =
                        known.or_else(|| scenario.map(str::to_owned)).unwrap_or_default();
                    self.runs_finished.get_or_create(&FinishedLabels { scenario, status }).inc();
                }
                Seen::Level { kind, seconds } => {
                    self.level_seconds.get_or_create(&KindLabel { kind }).observe(seconds);
                }
                Seen::Model { provider, model, input, output, cost } => {
                    let labels = ModelLabels { provider: provider.clone(), model: model.clone() };
                    self.model_calls.get_or_create(&labels).inc();
                    self.model_cost.get_or_create(&labels).inc_by(cost);
                    for (direction, n) in [("input", input), ("output", output)] {
                        let t = TokenLabels {
                            provider: provider.clone(),
                            model: model.clone(),
                            direction: direction.to_owned(),
                        };
                        self.model_tokens.get_or_create(&t).inc_by(n);
                    }
                }
                Seen::ModelFailed { provider, model } => {
                    self.model_failures.get_or_create(&ModelLabels { provider, model }).inc();
                }
                Seen::Retry { provider, model } => {
                    self.retries.get_or_create(&ModelLabels { provider, model }).inc();
                }
                Seen::Failover { provider, model } => {
                    self.failovers.get_or_create(&ModelLabels { provider, model }).inc();
                }
                Seen::Verifier { name, passed } => {
                    let outcome = if passed { "passed" } else { "failed" }.to_owned();
                    self.verifiers.get_or_create(&VerifierLabels { verifier: name, outcome }).inc();
                }
                Seen::ApprovalIdle(s) => self.approval_idle.observe(s),
                Seen::Stop(trigger) => {
                    self.stops.get_or_create(&TriggerLabel { trigger }).inc();
                }
            }
        }
    }

    /// A worker claimed a run that had waited `waited` since its last write.
    pub(crate) fn claimed(&self, waited: Duration) {
        self.claim_wait_seconds.observe(waited.as_secs_f64());
    }

    /// How long an append took.
    pub(crate) fn committed(&self, took: Duration) {
        self.commit_seconds.observe(took.as_secs_f64());
    }

    /// One HTTP answer.
    pub(crate) fn answered(&self, method: &'static str, route: &str, status: u16) {
        let labels = HttpLabels {
            method: method.to_owned(),
            route: route.to_owned(),
            status: status.to_string(),
        };
        self.http.get_or_create(&labels).inc();
    }

    /// How many HTTP connections are open.
    pub(crate) fn connections_open(&self, n: usize) {
        self.connections.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One connection the server closed or refused, and why (one of a closed set).
    pub(crate) fn connection_closed(&self, reason: &'static str) {
        self.connections_closed.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// The metrics in the format the scraper asks for: OpenMetrics when its `Accept` names
    /// `application/openmetrics-text`, else Prometheus' classic text format (what
    /// `promtool check metrics` and scrapers without OpenMetrics read). Returns the body and
    /// its content type.
    pub(crate) fn render_for(
        &self,
        accept: &str,
        queues: Option<&[baton_app::queues::Load]>,
        slot_waiting: usize,
        drives: usize,
    ) -> (String, &'static str) {
        if let Some(queues) = queues {
            self.queue_depth.clear();
            self.queue_driven.clear();
            for q in queues {
                let label = QueueLabel { queue: q.queue.name.clone() };
                let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                self.queue_depth.get_or_create(&label).set(n(q.waiting));
                self.queue_driven.get_or_create(&label).set(n(q.leased));
            }
        }
        let open = self.open_metrics(slot_waiting, drives);
        if accept.to_ascii_lowercase().contains("application/openmetrics-text") {
            (open, "application/openmetrics-text; version=1.0.0; charset=utf-8")
        } else {
            (classic(&open), "text/plain; version=0.0.4; charset=utf-8")
        }
    }

    /// The metrics as OpenMetrics text, with the workers' gauges as they are now.
    fn open_metrics(&self, slot_waiting: usize, drives: usize) -> String {
        self.slot_waiting.set(i64::try_from(slot_waiting).unwrap_or(i64::MAX));
        self.drives.set(i64::try_from(drives).unwrap_or(i64::MAX));
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

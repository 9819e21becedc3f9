//! The application's state, `App`: what the handlers, the event streams, MCP and the
//! workers share — settings, the (notifying) store, tokens, the scenarios and each tenant's
//! merged registry, the workers' state, limits, metrics, the stop token and the live text
//! of model answers — with what they ask of it (a run's events and state, a tenant's
//! registry, an engine for decisions, a run the caller may see), and the loop that refreshes
//! the scenarios.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use baton_app::{Answers, Baton, Instance};
use baton_engine::cancel::CancelToken;
use baton_engine::store::{EventStore, RunRecord};
use baton_engine::{Engine, RunState};
use baton_scenario::registry::Override;
use baton_scenario::{Registry, RegistryHandle};

use crate::auth::{Caller, Hosts, Tokens};
use crate::limits::{Rate, Streams};
use crate::metrics::Metrics;
use crate::notify::Notifying;
use crate::peers::Client;
use crate::problem::Problem;
use crate::settings::Settings;
use crate::traces::Tracer;
use crate::worker_pool::Workers;

/// Tenants whose merged registries are kept at once.
const MERGED_TENANTS_MAX: usize = 1_024;

/// A tenant's merged registry: the base it was merged over, the overrides' versions, the
/// result.
type MergedRegistry = (Arc<Registry>, Vec<(String, chrono::DateTime<chrono::Utc>)>, Arc<Registry>);

/// Everything the handlers and workers share.
pub(crate) struct App {
    pub(crate) settings: Settings,
    pub(crate) store: Arc<dyn EventStore>,
    /// The same store, for what only the notifying decorator knows (the runs' recent tails).
    pub(crate) notifying: Arc<Notifying>,
    pub(crate) tokens: Tokens,
    /// Webhooks and their outbox (the same store).
    pub(crate) webhooks: Arc<dyn baton_app::WebhookStore>,
    /// Queues and limits (the same store).
    pub(crate) queues: Arc<dyn baton_app::QueueStore>,
    /// How webhooks are sent and which receivers are allowed, as the instance opened.
    pub(crate) webhook_settings: baton_app::webhooks::Settings,
    pub(crate) registry: Arc<RegistryHandle>,
    pub(crate) scenarios_dir: PathBuf,
    pub(crate) baton: Arc<Baton>,
    pub(crate) workers: Workers,
    pub(crate) hosts: Hosts,
    /// Run starts per tenant.
    pub(crate) starts: Rate,
    /// Failed authentications per peer.
    pub(crate) auth_failures: Rate,
    pub(crate) streams: Streams,
    pub(crate) stop: CancelToken,
    /// Lets every drive go between two steps and this process claim no more runs (a
    /// worker draining); `stop` then cuts what is left.
    pub(crate) drain: CancelToken,
    pub(crate) metrics: Arc<Metrics>,
    /// Tenants' merged registries, with the directory's registry and the overrides'
    /// versions they were merged from.
    merged: std::sync::Mutex<HashMap<String, MergedRegistry>>,
    /// The text of model answers as it streams in, for the event streams open now (never
    /// stored: the whole answer is in the log).
    pub(crate) live: tokio::sync::broadcast::Sender<Arc<baton_engine::cancel::LiveText>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl App {
    pub(crate) fn new(
        settings: Settings,
        parts: Instance,
        bound: std::net::SocketAddr,
        stop: CancelToken,
        drain: CancelToken,
        tracer: Option<Arc<Tracer>>,
    ) -> Arc<Self> {
        let metrics = Arc::new(Metrics::new());
        let notifying = Arc::new(Notifying::new(parts.store, Arc::clone(&metrics), tracer));
        Arc::new(App {
            hosts: Hosts::new(bound, &settings.hosts),
            starts: Rate::new(settings.starts_per_minute),
            auth_failures: Rate::new(settings.auth_failures_per_minute),
            streams: Streams::new(settings.streams_per_token, settings.streams_max),
            workers: Workers::new(settings.name, settings.workers),
            store: Arc::clone(&notifying) as Arc<dyn EventStore>,
            notifying,
            metrics,
            webhooks: Arc::clone(&parts.webhooks),
            queues: Arc::clone(&parts.queues),
            webhook_settings: parts.webhook_settings.clone(),
            tokens: Tokens::new(
                parts.tokens,
                crate::auth::SessionRules {
                    cookie: if settings.secure_cookies {
                        crate::auth::SECURE_SESSION_COOKIE
                    } else {
                        crate::auth::SESSION_COOKIE
                    },
                    secure: settings.secure_cookies,
                    max_age: settings.session_max_age,
                    idle: settings.session_idle,
                    per_token: settings.sessions_per_token,
                },
            ),
            registry: Arc::new(parts.registry),
            scenarios_dir: parts.scenarios_dir,
            baton: parts.baton,
            settings,
            stop,
            drain,
            live: tokio::sync::broadcast::channel(4096).0,
            merged: std::sync::Mutex::default(),
        })
    }

    /// Where this process's engines send the text of model answers as it streams in: its
    /// own event streams, and — for a worker, whose runs other processes' streams follow —
    /// the store, which shares it with them where it can (PostgreSQL).
    pub(crate) fn live_sink(&self) -> baton_engine::cancel::LiveSink {
        let live = self.live.clone();
        let shared = self.settings.share_live.then(|| Arc::clone(&self.store));
        baton_engine::cancel::LiveSink(Arc::new(move |t| {
            if let Some(store) = &shared {
                store.share_live(&t);
            }
            // Nobody listening is no error.
            let _ = live.send(Arc::new(t));
        }))
    }

    /// A run's events after `after` for a stream: what this process just appended when it
    /// holds them, else the store's (checked as they are loaded).
    pub(crate) async fn events_after(
        &self,
        run_id: &str,
        after: u64,
    ) -> Result<Vec<baton_engine::event::Event>, baton_engine::store::Error> {
        match self.notifying.recent(run_id, after) {
            Some(events) => Ok(events),
            None => self.store.load(run_id, after).await,
        }
    }

    /// A run's state, folded from its log (checked as it is loaded).
    pub(crate) async fn state(&self, run_id: &str) -> Result<RunState, baton_engine::exec::Error> {
        Ok(baton_engine::fold(&self.store.load(run_id, 0).await?))
    }

    /// The scenarios a tenant's runs see: the directory's, with its overrides merged in —
    /// merged once per version of the directory and of the tenant's overrides, not per
    /// request.
    pub(crate) async fn registry_for(
        &self,
        tenant: Option<&str>,
    ) -> Result<Arc<Registry>, Problem> {
        let base = self.registry.current();
        let Some(tenant) = tenant else { return Ok(base) };
        let stored = self.store.tenant_overrides(Some(tenant)).await?;
        if stored.is_empty() {
            return Ok(base);
        }
        let version: Vec<(String, chrono::DateTime<chrono::Utc>)> =
            stored.iter().map(|o| (o.scenario_id.clone(), o.updated_at)).collect();
        {
            let merged = self.merged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((b, v, registry)) = merged.get(tenant)
                && Arc::ptr_eq(b, &base)
                && *v == version
            {
                return Ok(Arc::clone(registry));
            }
        }
        let overrides: Vec<Override> = stored
            .into_iter()
            .map(|o| Override {
                name: format!("tenant {} override of {} (stored)", o.tenant, o.scenario_id),
                scenario_id: o.scenario_id,
                yaml: o.yaml,
            })
            .collect();
        match base.with_overrides(tenant, &overrides) {
            Ok(loaded) => {
                let registry = Arc::new(loaded.registry);
                let mut merged =
                    self.merged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if merged.len() >= MERGED_TENANTS_MAX {
                    merged.clear();
                }
                merged.insert(tenant.to_owned(), (base, version, Arc::clone(&registry)));
                Ok(registry)
            }
            Err(e) => Err(Problem::conflict(format!(
                "tenant `{tenant}`'s overrides do not load over the current scenarios ({}); fix them with `baton tenant set {tenant} SCENARIO FILE` or remove one with `baton tenant rm`",
                e.diagnostics.render().trim()
            ))),
        }
    }

    /// The caller a request's token or session cookie names. Failed attempts are counted
    /// per peer: past `auth_failures_per_minute` of them a peer gets 429 without a look at
    /// what it sent.
    pub(crate) async fn caller(
        &self,
        headers: &axum::http::HeaderMap,
        client: Option<Client>,
    ) -> Result<Caller, Problem> {
        let peer = client.map(|c| c.key.to_string());
        if let Some(p) = &peer
            && let Err(wait) = self.auth_failures.left(p)
        {
            return Err(Problem::too_many(
                format!(
                    "{p} failed to authenticate {} times in a minute, the most one peer may; try again in {wait} s",
                    self.auth_failures.per_minute()
                ),
                wait,
            ));
        }
        let found = self.tokens.caller(headers).await;
        if found.as_ref().is_err_and(|p| p.status == 401)
            && let Some(p) = &peer
        {
            let _ = self.auth_failures.take(p);
        }
        found
    }

    /// Says `warning` on the server's log (stderr).
    #[allow(clippy::print_stderr)]
    pub(crate) fn warn(&self, warning: &str) {
        eprintln!("{}: warning: {warning}", self.settings.name);
    }

    /// An engine for decisions and cancels (no model is called).
    pub(crate) fn deciding(&self) -> Result<Engine, Problem> {
        self.baton
            .engine(Arc::clone(&self.store), Answers::Nothing, &self.registry.current())
            .map_err(Problem::internal)
    }

    /// A run the caller may see, or 404 as if it did not exist.
    pub(crate) async fn visible_run(
        &self,
        caller: &Caller,
        run_id: &str,
    ) -> Result<RunRecord, Problem> {
        match self.store.run(run_id).await? {
            Some(r) if caller.sees(r.tenant.as_deref()) => Ok(r),
            _ => Err(Problem::not_found(format!("no run {run_id}"))),
        }
    }
}

/// Looks at the scenarios directory for changes every `refresh_every`, keeping the last
/// registry that loaded when a change does not.
#[allow(clippy::print_stderr)]
pub(crate) async fn refresh_registry(app: Arc<App>) {
    loop {
        tokio::time::sleep(app.settings.refresh_every).await;
        let handle = Arc::clone(&app.registry);
        let refreshed = tokio::task::spawn_blocking(move || handle.refresh_if_changed()).await;
        if let Ok(Some(Err(e))) = refreshed {
            eprintln!(
                "{}: the scenarios changed and do not load; the last ones that did stay in use:\n{}",
                app.settings.name,
                e.diagnostics.render()
            );
        }
    }
}

/// Hands the pieces of answers other processes share (their workers' drives) to this
/// server's event streams, as its own drives' pieces are; returns at once where the store
/// carries none.
pub(crate) async fn relay_live_from_others(app: Arc<App>) {
    let Some(mut heard) = app.store.live_from_others().await else { return };
    loop {
        match heard.recv().await {
            Ok(piece) => {
                let _ = app.live.send(Arc::new(piece));
            }
            // A follower that fell behind skips to the newest: live text is best effort.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Ends the streams of revoked tokens and of ended browser sessions: once a second, while
/// any stream is open, the tokens and sessions holding streams are looked up, and each
/// revoked token's and ended session's streams are ended.
pub(crate) async fn end_revoked_streams(app: Arc<App>) {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let holding = app.streams.tokens();
        if holding.is_empty() {
            continue;
        }
        match app.tokens.revoked_among(&holding).await {
            Ok(revoked) => {
                for token in revoked {
                    app.streams.end(&token, None);
                }
            }
            Err(e) => app.warn(&format!("cannot look up revoked tokens: {e}")),
        }
        for (token, session) in app.streams.sessions() {
            if app.tokens.session_ended(&session).await {
                app.streams.end(&token, Some(&session));
            }
        }
    }
}

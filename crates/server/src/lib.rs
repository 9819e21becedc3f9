//! `baton serve`: Baton as a service, in the same binary.
//!
//! One process holds the HTTP API (JSON, problem+json errors, an OpenAPI 3.1 document
//! generated from the handlers and types), live event streams (Server-Sent Events resumable
//! with `Last-Event-ID`), bearer-token auth scoped to a tenant, limits, and the embedded
//! workers that drive runs: every run the API starts, every run whose approval or answer
//! arrived, every run left interrupted when the server last stopped, and every approval
//! whose deadline passed.
//!
//! The server talks to the kernel through [`baton_engine::Engine`] and to the database
//! through the store's traits; engines, jobs and their rules come from the application
//! layer's instance ([`baton_app::Instance`]), which it is handed.
//!
//! Modules, from the bottom up (the layers of ARCHITECTURE.md): `problem` (errors),
//! `settings` (how it runs), `event_wire` (what the streams send), `metrics` (Prometheus),
//! `traces` (OpenTelemetry spans over OTLP); `auth` (tokens, the caller, Host and Origin),
//! `body` (request bodies within the size limit), `limits` (rates and connection counts),
//! `notify` (a store decorator that wakes event streams when this process appends and counts
//! what it appends), `worker_pool` (the workers' slots and jobs); `app` (the state everything
//! shares); `workers` (driving); the handlers — `runs`, `scenarios`, `events` (SSE),
//! `tree_events` (a job's tree as one stream), `waves`, `overrides`, `fork_and_replay`,
//! `session`, `ui` (the web UI's files, built into the binary); `mcp` (the MCP server:
//! tools, resources, prompts, on stdio and at `/mcp`); `api` (the router) and `openapi` (the
//! document).

mod api;
mod app;
pub mod auth;
mod body;
mod connections;
mod event_wire;
mod events;
mod feed;
mod fork_and_replay;
mod limits;
mod mcp;
mod metrics;
mod notify;
mod openapi;
mod overrides;
mod peers;
mod problem;
mod runs;
mod scenarios;
mod session;
mod settings;
mod traces;
mod tree_events;
mod ui;
mod waves;
mod webhooks;
mod worker_pool;
mod workers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_app::Instance;
use baton_engine::cancel::CancelToken;

pub use openapi::document as openapi_document;
pub use peers::Cidr;
pub use problem::Problem;
pub use settings::{ConnectionLimits, Draining, Settings, WorkerSettings};

/// Serves until `stop` is cancelled: then stops accepting, stops every drive (their runs
/// are recorded interrupted, to be continued by the next server or `baton resume`) and
/// returns once they have stopped. Draining first (see [`Draining`]), it goes on answering
/// — `/readyz` 503, new runs refused — while its drives give their runs back between two
/// steps, and stops once none is left or the grace period is over.
pub async fn serve(
    settings: Settings,
    parts: Instance,
    stop: CancelToken,
    draining: Draining,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    if settings.no_auth && !settings.listen.ip().is_loopback() {
        return Err(format!(
            "--no-auth serves anyone who can reach {}; it is allowed only on a loopback address (127.0.0.1, ::1)",
            settings.listen
        ));
    }
    let mut settings = settings;
    settings.connections.max = connections::fit_open_files(settings.connections.max);
    let listener = listen(settings.listen)?;
    let bound = listener.local_addr().map_err(|e| format!("cannot read the bound address: {e}"))?;
    let (tracer, exporter) = match &settings.otlp_endpoint {
        Some(endpoint) => {
            let (tracer, export) = traces::Tracer::new(endpoint, stop.clone())?;
            (Some(Arc::new(tracer)), Some(tokio::spawn(export)))
        }
        None => (None, None),
    };
    let app = app::App::new(settings, parts, bound, stop.clone(), draining.drain, tracer);
    app.workers.recover(&app, false).await;
    let drained = tokio::spawn(stop_once_drained(Arc::clone(&app), draining.grace));
    let undriven = tokio::spawn(workers::take_up_undriven(Arc::clone(&app)));
    let refresh = tokio::spawn(app::refresh_registry(Arc::clone(&app)));
    let revoked = tokio::spawn(app::end_revoked_streams(Arc::clone(&app)));
    let relayed = tokio::spawn(app::relay_live_from_others(Arc::clone(&app)));
    let router = api::router(Arc::clone(&app));
    ready(bound);
    let limits = app.settings.connections.clone();
    connections::serve(listener, router, limits, Arc::clone(&app.metrics), stop.clone()).await;
    refresh.abort();
    revoked.abort();
    relayed.abort();
    drained.abort();
    undriven.abort();
    app.workers.drain().await;
    // The spans of the last drives are posted before the server returns.
    if let Some(exporter) = exporter {
        let _ = tokio::time::timeout(Duration::from_secs(15), exporter).await;
    }
    Ok(())
}

/// Once the server drains: waits until no drive is left (each gave its run back between
/// two steps, or ended) or `grace` passed, then stops the server, which cuts what is left.
async fn stop_once_drained(app: Arc<app::App>, grace: Duration) {
    tokio::select! {
        () = app.drain.cancelled() => {}
        () = app.stop.cancelled() => return,
    }
    let left = app.workers.idle_by(tokio::time::Instant::now() + grace).await;
    if left > 0 {
        app.warn(&format!(
            "{left} drive(s) still ran after the drain's {} s; they are cut",
            grace.as_secs()
        ));
    }
    app.stop.cancel();
}

/// A listening socket on `addr`, with room for a burst of connections to wait for accept.
fn listen(addr: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    let cannot = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(cannot)?;
    socket.set_reuseaddr(true).map_err(cannot)?;
    socket.bind(addr).map_err(cannot)?;
    socket.listen(4096).map_err(cannot)
}

/// `baton worker`: no listener — takes up the jobs the last process left interrupted or
/// waiting, and claims runs nobody drives from the store one per free slot (see
/// [`workers`]; a `running` run left by a dead process is claimed, never taken up unleased) until `stop` is cancelled or it was idle
/// for `idle_exit`; then stops its drives (their runs are recorded interrupted, for the
/// next worker) and returns once they have stopped.
pub async fn work(
    settings: Settings,
    parts: Instance,
    worker: WorkerSettings,
    stop: CancelToken,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    let listener = worker.listen.map(listen).transpose()?;
    let bound = match &listener {
        Some(l) => l.local_addr().map_err(|e| format!("cannot read the bound address: {e}"))?,
        None => SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let settings =
        Settings { driver_name: Some(worker.name.clone()), share_live: true, ..settings };
    let app = app::App::new(settings, parts, bound, stop.clone(), worker.drain.clone(), None);
    // Its endpoints answer until it returns (`/readyz` 503 once it drains); it says where
    // once it has taken up what the last worker left.
    let endpoints = listener.map(|listener| {
        let (router, limits) =
            (api::worker_router(Arc::clone(&app)), app.settings.connections.clone());
        let metrics = Arc::clone(&app.metrics);
        tokio::spawn(connections::serve(listener, router, limits, metrics, stop.clone()))
    });
    app.workers.recover(&app, true).await;
    if endpoints.is_some() {
        ready(bound);
    }
    let refresh = tokio::spawn(app::refresh_registry(Arc::clone(&app)));
    let what = app.baton.claimable(worker.queues);
    workers::claim_runs(Arc::clone(&app), worker.name, worker.lease, worker.idle_exit, what).await;
    refresh.abort();
    if app.drain.is_cancelled() && !stop.is_cancelled() {
        // Draining: the steps in flight finish and their drives give their runs back,
        // within the grace period (or until the stop is asked for again).
        let grace = tokio::time::Instant::now() + worker.grace;
        tokio::select! {
            () = app.workers.settled_by(grace) => {}
            () = stop.cancelled() => {}
        }
    }
    stop.cancel();
    app.workers.drain().await;
    if let Some(endpoints) = endpoints {
        let _ = endpoints.await;
    }
    Ok(())
}

/// Serves MCP on stdin and stdout (`baton mcp`) for `caller`, driving the runs it starts
/// and every run the last process left, until the host closes stdin or `stop` is cancelled;
/// then stops the drives (their runs are recorded interrupted, to be taken up by the next
/// start) and returns once they have stopped.
pub async fn serve_mcp_stdio(
    settings: Settings,
    parts: Instance,
    caller: auth::Caller,
    stop: CancelToken,
) -> Result<(), String> {
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let app = app::App::new(settings, parts, local, stop.clone(), CancelToken::new(), None);
    app.workers.recover(&app, false).await;
    let refresh = tokio::spawn(app::refresh_registry(Arc::clone(&app)));
    let served = mcp::serve_stdio(Arc::clone(&app), caller, stop).await;
    refresh.abort();
    app.workers.drain().await;
    served
}

//! `baton serve` (the server of `baton-server`, wired like the CLI wires its runs) and
//! `baton token create|list|revoke`.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use baton_app::{Instance, Role};
use baton_engine::cancel::CancelToken;
use baton_server::Settings;

use crate::escape;
use crate::out::outln;
use baton_app::place::Place;

/// The instance the server (or `baton mcp`, or `baton worker`) serves: runs it starts
/// answer from `script` (a scripted model) when one is given, else from the configured
/// providers. `who` names the command in its warnings.
async fn parts(place: &Place, script: Option<&Path>, who: &str) -> anyhow::Result<Instance> {
    let instance = baton_app::Baton::open(place, script).await?;
    if !instance.warnings.is_empty() {
        eprint!("{}", instance.warnings);
    }
    if let Some(why) = &instance.start_refusal {
        eprintln!("{who}: warning: runs cannot be started until this is fixed: {why}");
    }
    Ok(instance)
}

/// `baton serve` with `settings`; runs started through the API answer from `script` (a
/// scripted model) when one is given, else from the configured providers. A first signal
/// drains it for at most `drain_grace_s`.
pub(crate) async fn serve(
    place: &Place,
    settings: Settings,
    script: Option<PathBuf>,
    drain_grace_s: u64,
) -> anyhow::Result<ExitCode> {
    let args = &settings;
    if args.no_auth && !args.listen.ip().is_loopback() {
        bail!(
            "--no-auth serves anyone who can reach {}; it is allowed only with a loopback --listen (127.0.0.1:PORT, [::1]:PORT)",
            args.listen
        );
    }
    baton_app::serving::check_workers(args.workers)?;
    let (drain, stop) = (CancelToken::new(), CancelToken::new());
    drain_on_signals("baton serve", &drain, &stop, drain_grace_s);
    let parts = parts(place, script.as_deref(), "baton serve").await?;
    send_webhooks(&parts, "baton serve", &stop);
    let no_auth = settings.no_auth;
    let draining =
        baton_server::Draining { drain, grace: std::time::Duration::from_secs(drain_grace_s) };
    baton_server::serve(settings, parts, stop, draining, |bound| {
        if no_auth {
            eprintln!(
                "baton serve: WARNING: --no-auth: every request is served without a token, as an admin; anyone who can reach {bound} can start and decide runs"
            );
        }
        // Tests and scripts read the address from here (with --listen 127.0.0.1:0).
        let _ = outln!("listening on http://{bound}");
        let _ = crate::out::flush();
    })
    .await
    .map_err(anyhow::Error::msg)?;
    eprintln!(
        "baton serve: stopped; runs given back between two steps go on with the next driver, and runs cut are recorded interrupted and taken up at the next start"
    );
    Ok(ExitCode::SUCCESS)
}

/// `baton mcp`: MCP on stdin and stdout for the local user — an admin of `tenant`'s runs
/// (none: runs of no tenant) whose decisions are recorded as `name`. Nothing but the
/// protocol goes to stdout; notes go to stderr.
pub(crate) async fn mcp(
    place: &Place,
    tenant: Option<String>,
    name: Option<String>,
    settings: Settings,
    script: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    baton_app::serving::check_workers(settings.workers)?;
    if settings.body_bytes_max < 1024 {
        bail!("--message-max-bytes must be at least 1024, not {}", settings.body_bytes_max);
    }
    if let Some(t) = &tenant {
        baton_app::scenarios::check_tenant(t)?;
    }
    let name = name.unwrap_or_else(|| "mcp".to_owned());
    if name.trim().is_empty() || name.chars().count() > baton_server::auth::NAME_CHARS_MAX {
        bail!("--as must be 1 to {} characters and not blank", baton_server::auth::NAME_CHARS_MAX);
    }
    let parts = parts(place, script.as_deref(), "baton mcp").await?;
    let caller = baton_server::auth::Caller {
        tenant,
        role: Role::Admin,
        token_id: "local".to_owned(),
        name,
        session: None,
    };
    let stop = stopped_by_signals(
        "baton mcp: stopping — running steps are cut and their runs recorded interrupted (again to exit at once)",
        "baton mcp: exiting at once; every run stays resumable",
    );
    baton_server::serve_mcp_stdio(settings, parts, caller, stop)
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(ExitCode::SUCCESS)
}

/// What `baton worker` was given.
#[derive(Debug)]
pub(crate) struct WorkerArgs {
    pub concurrency: usize,
    pub lease_s: u64,
    pub name: Option<String>,
    pub script: Option<PathBuf>,
    pub idle_exit_s: Option<u64>,
    pub drain_grace_s: u64,
    pub listen: Option<std::net::SocketAddr>,
    /// The queues it takes runs from (none: every queue).
    pub queues: Vec<String>,
}

/// `baton worker`: claims and drives runs nobody drives until stopped (or idle).
pub(crate) async fn worker(
    place: &Place,
    args: WorkerArgs,
    settings: Settings,
) -> anyhow::Result<ExitCode> {
    let name = baton_app::serving::worker_name(args.concurrency, args.lease_s, args.name)?;
    if place.postgres.is_none() {
        eprintln!(
            "baton worker: note: {} is SQLite — workers share it only on this machine; use a PostgreSQL --db to spread runs over machines",
            place.db.display()
        );
    }
    // A stalled worker's runs are taken over once its lease runs out: its holds on the
    // runs it drives last as long.
    let place =
        &Place { hold_for: Some(std::time::Duration::from_secs(args.lease_s)), ..place.clone() };
    let (drain, stop) = (CancelToken::new(), CancelToken::new());
    drain_on_signals("baton worker", &drain, &stop, args.drain_grace_s);
    let parts = parts(place, args.script.as_deref(), "baton worker").await?;
    baton_app::queues::worker_queues(parts.queues.as_ref(), &args.queues).await?;
    eprintln!(
        "baton worker: {name} drives up to {} job(s) from {}",
        args.concurrency,
        place.db_shown()
    );
    send_webhooks(&parts, &format!("baton worker {name}"), &stop);
    let worker = baton_server::WorkerSettings {
        name,
        lease: std::time::Duration::from_secs(args.lease_s),
        idle_exit: args.idle_exit_s.map(std::time::Duration::from_secs),
        drain,
        grace: std::time::Duration::from_secs(args.drain_grace_s),
        listen: args.listen,
        queues: args.queues,
    };
    baton_server::work(settings, parts, worker, stop, |bound| {
        // Tests and scripts read the address from here (with --listen 127.0.0.1:0).
        let _ = outln!("listening on http://{bound}");
        let _ = crate::out::flush();
    })
    .await
    .map_err(anyhow::Error::msg)?;
    eprintln!("baton worker: stopped");
    Ok(ExitCode::SUCCESS)
}

/// Sends the outbox's webhooks from this process until `stop` (`who` and this process name
/// the leases it takes).
fn send_webhooks(parts: &Instance, who: &str, stop: &CancelToken) {
    let owner = format!("{who} {}", baton_app::place::this_process());
    tokio::spawn(baton_app::webhooks::run_sender(
        std::sync::Arc::clone(&parts.webhooks),
        parts.webhook_settings.clone(),
        owner,
        stop.clone(),
    ));
}

/// The signals of a worker or a server (`who`): the first interrupt or terminate drains it
/// (no new runs; the steps in flight finish, at most `grace_s`, and their runs are given
/// back between two steps, for other drivers); a second stops it as a signal stops a drive
/// (running steps cut, their runs recorded interrupted); a third exits at once. Listens
/// from this call on, so a signal that comes while the process is still starting drains
/// it too.
fn drain_on_signals(who: &'static str, drain: &CancelToken, stop: &CancelToken, grace_s: u64) {
    let Some(mut signals) = crate::drive::Signals::listen() else { return };
    let (drain, stop) = (drain.clone(), stop.clone());
    tokio::spawn(async move {
        signals.next().await;
        eprintln!(
            "{who}: draining — no new runs; the steps in flight finish (within {grace_s} s) and their runs are given back to other drivers (again to cut them now)"
        );
        drain.cancel();
        signals.next().await;
        crate::drive::stop_on_signals_after_one(
            stop,
            &format!("{who}: stopping — running steps are cut and their runs recorded interrupted, for the next driver (again to exit at once)"),
            &format!("{who}: exiting at once; every run stays resumable"),
            signals,
        )
        .await;
    });
}

/// A stop token cancelled by the first interrupt or terminate signal from this call on
/// (`stopping` said on stderr); a second exits at once (`exiting`).
fn stopped_by_signals(stopping: &'static str, exiting: &'static str) -> CancelToken {
    let stop = CancelToken::new();
    crate::drive::spawn_stop_on_signals(stop.clone(), stopping, exiting);
    stop
}

/// `baton token create`: prints the token once, and its id.
pub(crate) async fn create_token(
    place: &Place,
    tenant: Option<&str>,
    role: &str,
    name: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let Some(role) = Role::parse(role) else {
        bail!("--role {} is none of viewer, operator, admin, metrics", escape::one_line(role));
    };
    let tenant = match (role, tenant) {
        (Role::Metrics, None) => "",
        (Role::Metrics, Some(_)) => bail!(
            "a metrics token reads the whole server's metrics and belongs to no tenant: leave out --tenant"
        ),
        (_, None) => {
            bail!("--tenant is needed: a {} token acts on one tenant's runs", role.as_str())
        }
        (_, Some(t)) => {
            baton_app::scenarios::check_tenant(t)?;
            t
        }
    };
    let name = name.unwrap_or(if tenant.is_empty() { "metrics" } else { tenant });
    if name.trim().is_empty() || name.chars().count() > baton_server::auth::NAME_CHARS_MAX {
        bail!(
            "--name must be 1 to {} characters and not blank",
            baton_server::auth::NAME_CHARS_MAX
        );
    }
    let store = baton_app::place::open_any(place).await?;
    let (token, record) = baton_server::auth::new_token(tenant, role, name, chrono::Utc::now());
    store.put_token(&record).await?;
    let whose =
        if tenant.is_empty() { "the server".to_owned() } else { format!("tenant {tenant}") };
    eprintln!(
        "token {} for {whose}, role {}, named {}; it is shown once — keep it",
        record.id,
        role.as_str(),
        escape::one_line(name)
    );
    outln!("{token}")?;
    Ok(ExitCode::SUCCESS)
}

/// `baton token list`.
pub(crate) async fn list_tokens(
    place: &Place,
    tenant: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = baton_app::place::open_existing_any(place).await?;
    let list = store.tokens(tenant).await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&list)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if list.is_empty() {
        outln!("no tokens")?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{:<17} {:<20} {:<9} {:<20} {:<20} revoked", "id", "tenant", "role", "name", "created")?;
    for t in list {
        let line = format!(
            "{:<17} {:<20} {:<9} {:<20} {:<20} {}",
            t.id,
            t.tenant,
            t.role.as_str(),
            t.name,
            t.created_at.format("%Y-%m-%d %H:%M:%S"),
            t.revoked_at.map_or(String::new(), |at| at.format("%Y-%m-%d %H:%M:%S").to_string())
        );
        outln!("{}", escape::one_line(&line))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `baton token revoke`.
pub(crate) async fn revoke_token(place: &Place, id: &str) -> anyhow::Result<ExitCode> {
    let store = baton_app::place::open_existing_any(place).await?;
    if !store.revoke_token(id, chrono::Utc::now()).await? {
        bail!(
            "no token {} that is not revoked already in {}; `baton token list` shows them",
            escape::one_line(id),
            place.db_shown()
        );
    }
    outln!(
        "revoked token {id}; a server refuses it within {} s",
        baton_server::auth::TOKEN_CACHE_FOR.as_secs()
    )?;
    Ok(ExitCode::SUCCESS)
}

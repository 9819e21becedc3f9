//! Starting a job, the one way every surface does it: the request checked, its scenario
//! selected under one pin policy, and every scenario it can reach before a route is chosen
//! checked against the jail — before anything is created or any model is called.
//!
//! The pin policy: a scenario the caller names explicitly (`baton run SCENARIO`,
//! `--scenario`, `"scenario"` of `POST /runs` and MCP `run_start`) must exist — a typo is
//! refused with the closest names, never run as the paid default. A pin that comes from
//! the job's metadata (`scenario_id`, as the reference's payloads carry it) or an intent
//! route nobody serves is data from elsewhere: the job runs the default, and the warning
//! is recorded on its `scenario_selected`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use baton_engine::Engine;
use baton_engine::event::ScenarioSelected;
use baton_engine::exec::Error as ExecError;
use baton_engine::job::{JobRequest, Selection, Start};
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::store::{Error as StoreError, EventStore, KeyClaim};
use baton_scenario::{Registry, Scenario};
use serde_json::{Map, Value};

use crate::engines::{
    JobSettings, WaveDrive, engine, job_settings, redactor, reloading_jobs, workspace_setup,
};
use crate::error::Error;
use crate::jail::jail;
use crate::models::choose_model;
use crate::place::{Place, open_existing_store, open_store};
use crate::scenarios::registry;

/// The longest idempotency key, in bytes.
pub const KEY_CHARS_MAX: usize = 256;

/// What a job asks for, as every surface takes it.
#[derive(Clone, Debug, Default)]
pub struct JobStart {
    /// What the caller named explicitly: a pin, an intent route, a kind.
    pub job: JobRequest,
    pub input: String,
    /// The job's metadata; `scenario_id`, `intent_route` and `kind` in it select too when
    /// the caller named none of them explicitly.
    pub metadata: Map<String, Value>,
    /// The job's cost cap, all its runs together.
    pub max_cost_usd: Option<f64>,
    pub idempotency_key: Option<String>,
    /// The tenant the job runs for (its overrides are merged into the registry given).
    pub tenant: Option<String>,
}

/// A job ready to be created: its scenario, how it was chosen, what its first run starts
/// from (all but the model source, which the surface's model gives) and what to say.
#[derive(Debug)]
pub struct Planned {
    pub scenario: Arc<Scenario>,
    pub selected: Option<ScenarioSelected>,
    pub start: Start,
    /// Said before the job starts: how it fell back, that the jail is off.
    pub warnings: Vec<String>,
    /// Most idempotency keys the job's tenant may hold (the settings it was planned under).
    pub keys_max: u64,
}

/// Checks the request's own values.
pub fn check(request: &JobStart) -> Result<(), Error> {
    for (field, value) in [
        ("scenario", &request.job.pin),
        ("intent", &request.job.intent),
        ("kind", &request.job.kind),
    ] {
        if value.as_deref().is_some_and(str::is_empty) {
            return Err(Error::invalid(format!("{field} is empty; give a value or leave it out")));
        }
    }
    if let Some(pin) = &request.job.pin
        && (pin.contains(['/', '\\']) || pin.contains(".."))
    {
        return Err(Error::invalid(format!(
            "scenario {pin:?} is a path; name a scenario by its id (the `id:` its file declares)"
        )));
    }
    let input_max = baton_engine::limits::INPUT_BYTES_MAX;
    if request.input.len() as u64 > input_max {
        return Err(Error::invalid(format!(
            "the input is larger than {}, the most a job takes; make it smaller",
            baton_scenario::capped::size(input_max)
        )));
    }
    if let Some(usd) = request.max_cost_usd
        && (!usd.is_finite() || usd <= 0.0)
    {
        return Err(Error::invalid(format!(
            "max_cost_usd must be a positive amount of US dollars, not {usd}"
        )));
    }
    if let Some(key) = &request.idempotency_key
        && (key.is_empty() || key.chars().count() > KEY_CHARS_MAX)
    {
        return Err(Error::invalid(format!(
            "idempotency_key must be 1 to {KEY_CHARS_MAX} characters"
        )));
    }
    if let Some(tenant) = &request.tenant {
        crate::scenarios::check_tenant(tenant).map_err(|e| Error::invalid(format!("{e:#}")))?;
    }
    Ok(())
}

/// The job's scenario and how it was chosen, under the pin policy of this module.
pub fn select(
    registry: &Registry,
    selection: &Selection,
    request: &JobStart,
) -> Result<(Arc<Scenario>, ScenarioSelected), Error> {
    let explicit = &request.job;
    let named = explicit.pin.is_some() || explicit.intent.is_some() || explicit.kind.is_some();
    let from_meta = |key: &str| {
        request
            .metadata
            .get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let job = if named {
        explicit.clone()
    } else {
        JobRequest {
            pin: from_meta("scenario_id"),
            intent: from_meta("intent_route"),
            kind: from_meta("kind"),
        }
    };
    // Only a pin the caller typed is held to exist.
    let strict = named && explicit.pin.is_some();
    baton_engine::job::select(registry, selection, &job, strict).map_err(|message| {
        // A typed pin that names nothing is the request's error; a default that is not
        // among the scenarios is the configuration's.
        if strict && registry.get(explicit.pin.as_deref().unwrap_or_default()).is_none() {
            Error::new(crate::error::Kind::NotFound, message)
        } else {
            Error::refused(message)
        }
    })
}

/// The claim a job's idempotency key makes, held for `hold` from now: scoped to the job's
/// tenant and bound to a digest of what the job asks for (its selection, input, metadata
/// and cost cap), so that the same key with another request is told apart.
pub fn key_claim(request: &JobStart, hold: chrono::Duration) -> Option<KeyClaim> {
    let key = request.idempotency_key.clone()?;
    let asked = serde_json::json!({
        "scenario": request.job.pin,
        "intent": request.job.intent,
        "kind": request.job.kind,
        "input": request.input,
        "metadata": request.metadata,
        "max_cost_usd": request.max_cost_usd,
    });
    let request = baton_engine::chain::hex(&baton_engine::chain::json_digest(&asked));
    Some(KeyClaim { key, request, expires_at: chrono::Utc::now() + hold })
}

/// The run a job's key names already, when the job (of `tenant`, making `claim`) repeats
/// the request that claimed it; none when no run of its tenant holds the key. The same
/// key with another request is refused, naming the first run.
pub async fn key_holder(
    store: &dyn EventStore,
    tenant: Option<&str>,
    claim: Option<&KeyClaim>,
) -> Result<Option<String>, Error> {
    let Some(claim) = claim else { return Ok(None) };
    let holder = store.run_by_key(tenant, &claim.key).await.map_err(|e| {
        Error::new(crate::error::Kind::Internal, format!("looking up an idempotency key: {e}"))
    })?;
    let Some(holder) = holder else { return Ok(None) };
    match &holder.idempotency {
        Some(held) if !held.matches(&claim.request) => Err(Error::new(
            crate::error::Kind::KeyReused,
            format!(
                "idempotency key {:?} names run {}, started with another request; send that request again to get its run, or use a new key for a new job",
                claim.key, holder.run_id
            ),
        )),
        _ => Ok(Some(holder.run_id)),
    }
}

/// Where a job's key stands before the job is created: the run it names already (the same
/// request again, [`key_holder`]), else room for it as a new key of `tenant`'s, refused
/// while the tenant's jobs hold `keys_max` keys unexpired. The count is read before the job
/// is created, so starts racing at the cap may pass it by their number, never more: a
/// bound on what a tenant can hold, not an exact quota.
pub async fn key_standing(
    store: &dyn EventStore,
    tenant: Option<&str>,
    claim: Option<&KeyClaim>,
    keys_max: u64,
) -> Result<Option<String>, Error> {
    if let Some(run_id) = key_holder(store, tenant, claim).await? {
        return Ok(Some(run_id));
    }
    key_room(store, tenant, claim, keys_max).await?;
    Ok(None)
}

async fn key_room(
    store: &dyn EventStore,
    tenant: Option<&str>,
    claim: Option<&KeyClaim>,
    keys_max: u64,
) -> Result<(), Error> {
    if claim.is_none() {
        return Ok(());
    }
    let held = store.keys_held(tenant, keys_max).await.map_err(|e| {
        Error::new(crate::error::Kind::Internal, format!("counting idempotency keys: {e}"))
    })?;
    if held >= keys_max {
        return Err(Error::new(
            crate::error::Kind::OverLimit,
            format!(
                "this tenant's jobs hold {keys_max} idempotency keys, the most `[jobs] idempotency_keys_max` allows; start without a key, or again once keys expire"
            ),
        ));
    }
    Ok(())
}

/// Plans a job: checks the request, selects its scenario (or takes `given`, a standalone
/// wave's), and refuses it when it can reach a scenario that starts programs and the jail
/// cannot be set up.
pub fn plan(
    place: &Place,
    registry: &Registry,
    settings: &JobSettings,
    request: JobStart,
    given: Option<Arc<Scenario>>,
) -> Result<Planned, Error> {
    check(&request)?;
    let idempotency = key_claim(&request, settings.key_hold);
    let selection = &settings.selection;
    let mut warnings = Vec::new();
    let (scenario, selected) = match given {
        Some(scenario) => (scenario, None),
        None => {
            let (scenario, selected) = select(registry, selection, &request)?;
            warnings.extend(selected.warning.clone());
            (scenario, Some(selected))
        }
    };
    warnings.extend(crate::jail::check_jail(place, registry, &scenario)?);
    let start = Start {
        input: request.input,
        metadata: request.metadata,
        model_source: None,
        selected: selected.clone(),
        tree_max_cost_usd: request.max_cost_usd,
        idempotency,
        tenant: request.tenant,
        ..Start::default()
    };
    Ok(Planned { scenario, selected, start, warnings, keys_max: settings.keys_max })
}

/// What a job is started with at a terminal, beside its [`JobStart`]: the model it answers
/// from, where its files go, and the guards it starts under.
#[derive(Debug, Default)]
pub struct Setup {
    /// Refuse to start when the scenario's forecast p90 cost is over this.
    pub max_forecast_usd: Option<f64>,
    pub settle_timeout_s: Option<f64>,
    /// A scripted model's script.
    pub script: Option<PathBuf>,
    /// Replay model answers from this cassette instead of calling any model.
    pub cassette: Option<PathBuf>,
    /// Record every model answer into this cassette.
    pub record: Option<PathBuf>,
    /// The workspace directory, instead of a new one under the data directory.
    pub workspace: Option<PathBuf>,
    /// Name the completed run's result with this branch of the workspace repository.
    pub branch: Option<String>,
    /// Run this scenario instead of selecting one (a standalone wave's).
    pub given: Option<Arc<Scenario>>,
}

/// A job planned over the scenarios directory (with its tenant's overrides), checked
/// before anything is created: a bad argument never leaves a run.
pub async fn plan_job(
    place: &Place,
    request: JobStart,
    setup: &mut Setup,
) -> anyhow::Result<(Planned, Arc<Registry>)> {
    if let Some(branch) = &setup.branch {
        check_branch_name(branch).map_err(|why| {
            Error::invalid(format!(
                "--branch {branch:?} is not a valid branch name: {why}; use letters, digits, '-', '_' and '/' (see git check-ref-format)"
            ))
        })?;
    }
    if let Some(path) = &setup.record {
        check_writable_file(path).map_err(|why| {
            Error::invalid(format!("cannot record the cassette to {}: {why}", path.display()))
        })?;
    }
    check(&request)?;
    // A tenant's overrides are in the database; with no database yet it has none. Nothing
    // is created before every argument and file has been checked.
    let registry = match &request.tenant {
        Some(tenant) if place.db_exists() => {
            let store = open_existing_store(place).await?;
            crate::scenarios::merged(store.as_ref(), registry(place)?, tenant).await?
        }
        _ => registry(place)?,
    };
    let registry = Arc::new(registry);
    let settings = job_settings(place)?;
    let planned = plan(place, &registry, &settings, request, setup.given.take())?;
    Ok((planned, registry))
}

/// A planned job ready to be created, or the run its idempotency key already names.
#[derive(Debug)]
pub enum Ready {
    /// The engine to create it with, and what its first run starts from.
    New { engine: Box<Engine>, first: Box<Start> },
    /// The key was taken: the run it names, in the store that holds it.
    Taken { store: Arc<dyn EventStore>, run_id: String },
}

/// Readies a planned job: the setup checked against its scenario (a branch needs a
/// workspace, a workspace a scenario that reads files), the forecast guard, the model, the
/// store (created when absent) and the engine.
pub async fn ready(
    place: &Place,
    planned: Planned,
    registry: &Arc<Registry>,
    setup: Setup,
) -> anyhow::Result<Ready> {
    let scenario = &planned.scenario;
    if setup.branch.is_some() && !baton_engine::exec::owns_workspace(scenario) {
        return Err(Error::invalid(format!(
            "--branch names the result in the run's workspace, and scenario `{}` has no tool_loop level (no workspace); leave --branch out",
            scenario.id
        ))
        .into());
    }
    if let Some(dir) = &setup.workspace
        && !baton_engine::exec::needs_workspace(scenario)
    {
        return Err(Error::invalid(format!(
            "--workspace {}: scenario `{}` reads no files (no tool_loop level, no verifier that runs in a workspace), so the directory would not be used; drop --workspace",
            dir.display(),
            scenario.id
        ))
        .into());
    }
    if let Some(max) = setup.max_forecast_usd {
        crate::forecast::guard(place, scenario, max).await?;
    }
    let chosen = choose_model(
        setup.script.as_deref(),
        place.config.as_deref(),
        setup.cassette.as_deref(),
        setup.record.as_deref(),
        scenario,
    );
    let chosen = match chosen {
        // A standalone wave calls no model until `baton wave run` runs its workers, with
        // the model that command is given.
        Err(_)
            if baton_engine::exec::calls_no_model(scenario)
                && setup.script.is_none()
                && setup.cassette.is_none() =>
        {
            let model = Arc::new(ScriptedModel::default()) as Arc<dyn ModelProvider>;
            crate::models::Chosen { model, source: None, recorder: None }
        }
        other => other?,
    };
    let tools =
        crate::engines::tools_for(place, chosen.source.as_deref(), chosen.recorder.as_deref())?;
    let (model, source) = (chosen.model, chosen.source);
    let store = open_store(place).await?;
    let (tenant, claim) = (planned.start.tenant.as_deref(), planned.start.idempotency.as_ref());
    if let Some(run_id) = key_standing(store.as_ref(), tenant, claim, planned.keys_max).await? {
        return Ok(Ready::Taken { store, run_id });
    }
    let jobs = reloading_jobs(
        place,
        store.as_ref(),
        Arc::clone(registry),
        setup.settle_timeout_s,
        planned.start.tenant.as_deref(),
        WaveDrive::default(),
    )
    .await?;
    let engine = engine(
        store,
        model,
        registry,
        workspace_setup(place, setup.workspace, setup.branch),
        redactor(place),
        &jail(place),
        Some(jobs),
        None,
        Some(tools),
    );
    let first = Start { model_source: source, ..planned.start };
    Ok(Ready::New { engine: Box::new(engine), first: Box::new(first) })
}

/// How a queued job came out.
#[derive(Debug, PartialEq, Eq)]
pub enum Queued {
    /// Its first run is created, durable and `running`, for a worker.
    Created,
    /// Its idempotency key was taken by this run.
    Taken(String),
}

/// Creates a job's first run and leaves it to a worker (`baton run --queue`), waiting in
/// `placement`'s queue (which the store checks exists) with its priority.
pub async fn queue(
    engine: &Engine,
    run_id: &str,
    scenario: &Arc<Scenario>,
    first: Start,
    placement: &baton_engine::store::Placement,
) -> anyhow::Result<Queued> {
    let first = Start { placement: placement.clone(), ..first };
    let keyed = first.idempotency.is_some().then(|| first.clone());
    match (engine.create_job(run_id, scenario, first).await, keyed) {
        (Ok(()), _) => Ok(Queued::Created),
        (Err(e), Some(start)) => {
            Ok(Queued::Taken(taken_meanwhile(e.into(), engine.store.as_ref(), &start).await?))
        }
        (Err(e), None) => Err(e.into()),
    }
}

/// When `e` refused a start because its key was taken meanwhile (another process started a
/// job with it between [`key_holder`]'s look and the start): the run the key names, under
/// the same rules. Any other error is returned as it is.
pub async fn taken_meanwhile(
    e: anyhow::Error,
    store: &dyn EventStore,
    start: &Start,
) -> anyhow::Result<String> {
    let taken = match e.downcast_ref::<ExecError>() {
        Some(ExecError::Store(StoreError::KeyTaken { .. })) => true,
        _ => matches!(e.downcast_ref::<StoreError>(), Some(StoreError::KeyTaken { .. })),
    };
    if !taken {
        return Err(e);
    }
    match key_holder(store, start.tenant.as_deref(), start.idempotency.as_ref()).await? {
        Some(run_id) => Ok(run_id),
        None => Err(e),
    }
}

/// Why `name` cannot be a branch (`refs/heads/NAME`), by the rules of `git
/// check-ref-format --branch`; the workspace checks again with git when it names the
/// result, this check only makes a bad name fail before the run instead of after it.
fn check_branch_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".to_owned());
    }
    if name.starts_with('-') {
        return Err("it starts with '-'".to_owned());
    }
    if name == "@" {
        return Err("it is '@'".to_owned());
    }
    for bad in ["..", "@{", "//"] {
        if name.contains(bad) {
            return Err(format!("it contains {bad:?}"));
        }
    }
    if let Some(c) = name.chars().find(|c| {
        c.is_ascii_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\')
    }) {
        return Err(format!("it contains {c:?}"));
    }
    if name.starts_with('/') || name.ends_with('/') {
        return Err("it starts or ends with '/'".to_owned());
    }
    if name.ends_with('.') {
        return Err("it ends with '.'".to_owned());
    }
    for part in name.split('/') {
        if part.starts_with('.') {
            return Err(format!("its part {part:?} starts with '.'"));
        }
        if part.ends_with(".lock") {
            return Err(format!("its part {part:?} ends with \".lock\""));
        }
    }
    Ok(())
}

/// Why a file cannot be written at `path` (its directory is missing, or takes no new
/// files), found before a run starts rather than at its first model call.
fn check_writable_file(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("it is a directory; name a file".to_owned());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match std::fs::metadata(dir) {
        Err(e) => {
            return Err(format!(
                "its directory {} cannot be used ({e}); create it or choose another path",
                dir.display()
            ));
        }
        Ok(m) if !m.is_dir() => return Err(format!("{} is not a directory", dir.display())),
        Ok(_) => {}
    }
    // The file is written beside itself and renamed: the directory must take new files.
    let probe = dir.join(format!(".baton-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot create files in {}: {e}", dir.display())),
    }
}

/// The most jobs one `--input-lines` file queues.
const INPUT_LINES_MAX: usize = 100_000;

/// A job's input read from a file (`--input-file`), no larger than a job takes.
pub fn input_file(path: &Path) -> Result<String, Error> {
    baton_scenario::capped::read_text(path, baton_engine::limits::INPUT_BYTES_MAX)
        .map_err(|e| Error::invalid(format!("--input-file: {e}")))
}

/// The inputs of `--input-lines`: each non-empty line of the file, at least one.
pub fn input_lines(path: &Path) -> Result<Vec<String>, Error> {
    let bytes_max = 64 * 1024 * 1024;
    let text = baton_scenario::capped::read_text(path, bytes_max)
        .map_err(|e| Error::invalid(format!("--input-lines: {e}")))?;
    let lines: Vec<String> =
        text.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect();
    if lines.is_empty() {
        return Err(Error::invalid(format!(
            "--input-lines {}: no line holds an input; write one job's input per line",
            path.display()
        )));
    }
    if lines.len() > INPUT_LINES_MAX {
        return Err(Error::invalid(format!(
            "--input-lines {}: {} jobs, more than {INPUT_LINES_MAX} at once; split the file",
            path.display(),
            lines.len()
        )));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_follow_git_check_ref_format() {
        for ok in ["main", "feature/x", "v1.2", "a-b_c", "result@home", "ü"] {
            assert_eq!(check_branch_name(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "it is empty"),
            ("bad..name", "it contains \"..\""),
            ("-x", "it starts with '-'"),
            ("@", "it is '@'"),
            ("a@{1}", "it contains \"@{\""),
            ("a//b", "it contains \"//\""),
            ("a b", "it contains ' '"),
            ("a~1", "it contains '~'"),
            ("a^", "it contains '^'"),
            ("a:b", "it contains ':'"),
            ("a?", "it contains '?'"),
            ("a*", "it contains '*'"),
            ("a[b", "it contains '['"),
            ("a\\b", "it contains '\\\\'"),
            ("a\tb", "it contains '\\t'"),
            ("/a", "it starts or ends with '/'"),
            ("a/", "it starts or ends with '/'"),
            ("a.", "it ends with '.'"),
            ("x/.hidden", "its part \".hidden\" starts with '.'"),
            ("a.lock/b", "its part \"a.lock\" ends with \".lock\""),
        ] {
            assert_eq!(check_branch_name(bad), Err(why.to_owned()), "{bad:?}");
        }
    }
}

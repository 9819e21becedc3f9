//! Engines as every surface assembles them: the model, the verifiers (built in and the
//! scanners), the workspaces, the redactor, the jail and the jobs' settings.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::redact::Redactor;
use baton_engine::Engine;
use baton_engine::clock::SystemClock;
use baton_engine::job::{Jobs, Selection};
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::runner::Runtime;
use baton_engine::store::EventStore;
use baton_engine::tools::ToolHost;
use baton_engine::verifier::Verifiers;
use baton_engine::wave_drive::WaveSettings;
use baton_engine::workspace::WorkspaceSetup;
use baton_jail::Jail;
use baton_providers::cassette_file::Recorder;
use baton_providers::config::Config;
use baton_scenario::Registry;
use baton_tools::{HttpSettings, Secret, Tools};
use baton_workspace::LocalWorkspaces;
use serde_json::{Value, json};

use crate::jail::jail;
use crate::place::{Place, config_file};

/// Where runs get their workspaces: `DIR` from `--workspace`, else one directory per run
/// under `workspaces/` beside the database; their snapshots under `--snapshots`, else
/// `snapshots/` beside the database.
pub fn workspace_setup(
    place: &Place,
    dir: Option<PathBuf>,
    branch: Option<String>,
) -> WorkspaceSetup {
    let data = place.db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    let root = absolute(data.join("workspaces"));
    let snapshots = absolute(place.snapshots.clone().unwrap_or_else(|| data.join("snapshots")));
    let dir = dir.map(absolute);
    let mut opener = LocalWorkspaces::new(root, snapshots).jailed(jail(place));
    if let Some(handoff) = &place.handoff {
        opener = opener.handing_off(Arc::clone(handoff));
    }
    WorkspaceSetup { opener: Arc::new(opener), dir, branch }
}

/// An engine for reading, deciding and finishing runs: its model answers nothing (a run
/// resumes with the model it recorded), its workspaces are the run's own, and a run's
/// stored scenario version reads its files (a workspace seed) from the scenarios directory.
pub fn probe_engine(place: &Place, store: &Arc<dyn EventStore>, registry: &Registry) -> Engine {
    let jobs = jobs(place, Arc::new(Registry::default()), None, WaveDrive::default()).ok();
    engine(
        Arc::clone(store),
        Arc::new(ScriptedModel::default()),
        registry,
        workspace_setup(place, None, None),
        redactor(place),
        &jail(place),
        jobs.map(Arc::new),
        None,
        None,
    )
}

/// The variables that hold model providers' keys wherever a configuration names them.
const WELL_KNOWN_KEY_VARIABLES: [&str; 2] = ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"];

/// A redactor for every key this process can read: the values of the variables the
/// provider configuration names (`api_key_env`) and of the well-known key variables,
/// whichever model this run uses (a verifier's program can print the environment it was
/// started from). A configuration that does not load adds nothing here; the command that
/// needs its models reports why.
pub fn redactor(place: &Place) -> Redactor {
    let mut names: Vec<String> = WELL_KNOWN_KEY_VARIABLES.iter().map(|&n| n.to_owned()).collect();
    let file = place.config.clone().unwrap_or_else(|| PathBuf::from("baton.toml"));
    if let Ok(config) = Config::from_file(&file) {
        names.extend(config.providers.iter().filter_map(|p| p.api_key_env.clone()));
        // The secrets HTTP tools send: an answer that echoes one is redacted too.
        names.extend(config.secrets.values().map(|s| s.env.clone()));
    }
    Redactor::new(names.iter().filter_map(|n| std::env::var(n).ok()))
}

/// The user's tools as this instance calls them: programs and MCP servers in its jail,
/// requests where its `[egress]` and `[secrets]` allow.
pub fn live_tools(place: &Place) -> Arc<dyn ToolHost> {
    Arc::new(Tools::new(jail(place), tool_settings(place)))
}

/// The user's tools for a run whose answers come from `source` (as the run records it):
/// the answers of that cassette when it replays one (no tool is called), else the live
/// tools — recorded into `recorder`'s cassette when the run records one.
pub fn tools_for(
    place: &Place,
    source: Option<&str>,
    recorder: Option<&Recorder>,
) -> anyhow::Result<Arc<dyn ToolHost>> {
    if let Some(path) = source.and_then(|s| s.strip_prefix("cassette:")) {
        let cassette =
            baton_providers::cassette_file::load(Path::new(path)).map_err(anyhow::Error::msg)?;
        return Ok(recorded_tools(&cassette));
    }
    let live = live_tools(place);
    Ok(match recorder {
        Some(recorder) => recorder.tools(live, Arc::new(redactor(place))),
        None => live,
    })
}

/// The user's tools answered from a recording (a replay, a fixture's test): nothing is
/// called.
pub fn recorded_tools(cassette: &baton_engine::cassette::Cassette) -> Arc<dyn ToolHost> {
    Arc::new(Arc::new(baton_engine::cassette::RecordedTools::new(cassette)))
}

/// What the user's HTTP tools may reach and send, from the configuration's `[egress]` and
/// `[secrets]` (each secret's value read from its variable now). A configuration that does
/// not load allows no secret and the default egress; the command that needs it reports
/// why.
pub fn tool_settings(place: &Place) -> HttpSettings {
    let file = place.config.clone().unwrap_or_else(|| PathBuf::from("baton.toml"));
    let Ok(config) = Config::from_file(&file) else { return HttpSettings::default() };
    let secrets = config
        .secrets
        .into_iter()
        .map(|(name, s)| {
            let secret = Secret {
                value: std::env::var(&s.env).ok(),
                env: s.env,
                hosts: s.hosts,
                tenants: s.tenants,
            };
            (name, secret)
        })
        .collect();
    HttpSettings { egress: config.egress, secrets }
}

/// An engine over `store`, answering from `model`, with this instance's verifiers (or, for
/// a `trust_validation` replay, the recorded verifier outcomes in `trusted`), the jail,
/// workspaces and redactor, `jobs` when it starts child runs, and `tools` when it may call
/// the user's own tools (a replay, a fixture's test and a probe never do).
#[allow(clippy::too_many_arguments)]
pub fn engine(
    store: Arc<dyn EventStore>,
    model: Arc<dyn ModelProvider>,
    registry: &Registry,
    workspaces: WorkspaceSetup,
    redactor: Redactor,
    jail: &Arc<Jail>,
    jobs: Option<Arc<Jobs>>,
    trusted: Option<Arc<baton_engine::replay::Trusted>>,
    tools: Option<Arc<dyn ToolHost>>,
) -> Engine {
    let catalog: Vec<Value> = registry
        .scenarios()
        .filter(|s| s.classifier_eligible())
        .map(|s| json!({"id": s.id, "display_name": s.display_name, "description": s.description, "examples": s.examples}))
        .collect();
    let mut verifiers = Verifiers::builtin();
    baton_verifiers::register(&mut verifiers, jail);
    if let Some(trusted) = trusted {
        verifiers = verifiers.trusting(trusted);
    }
    let mut engine = Engine::new(
        store,
        Arc::new(Runtime {
            model,
            verifiers,
            workspace: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            workspaces: Some(workspaces),
            catalog: Arc::new(Value::Array(catalog)),
            redactor: Arc::new(redactor),
            jobs,
            runner: Arc::new(baton_runners::Runners),
            tools,
        }),
        Arc::new(SystemClock),
    );
    engine.process = crate::place::this_process();
    engine
}

/// How jobs start, from the configuration's `[selection]`, `[jobs]` and `[waves]`.
#[derive(Clone, Debug)]
pub struct JobSettings {
    pub selection: Selection,
    /// How long the end of a parent waits for its cancelled children, as configured.
    pub settle_timeout_s: Option<f64>,
    /// Most workers of a wave at once, for waves that set none, as configured.
    pub max_parallel: Option<u32>,
    /// How long a job's idempotency key names its run.
    pub key_hold: chrono::Duration,
    /// Most keys one tenant's jobs hold at once.
    pub keys_max: u64,
}

/// How long an idempotency key names its run when the configuration says nothing: a day.
pub const KEY_HOLD_DEFAULT_S: u64 = 86_400;

/// How many idempotency keys one tenant's jobs may hold at once when the configuration
/// says nothing.
pub const KEYS_MAX_DEFAULT: u64 = 100_000;

/// The configuration's job settings: the file's when there is one (a file that does not
/// load is an error, never skipped), the defaults otherwise.
pub fn job_settings(place: &Place) -> anyhow::Result<JobSettings> {
    let config = match config_file(place.config.as_deref()) {
        Some(path) => Config::from_file(&path)?,
        None => Config::default(),
    };
    let d = Selection::default();
    let s = config.selection;
    let selection = Selection {
        default: s.default.unwrap_or(d.default),
        fallback: s.fallback.unwrap_or(d.fallback),
        classifier: s.classifier.unwrap_or(d.classifier),
        classify_kinds: s.classify_kinds.unwrap_or(d.classify_kinds),
    };
    // Both checked when the file was read: 1 through 10, and at most thirty days.
    let max_parallel = config.waves.max_parallel.and_then(|n| u32::try_from(n).ok());
    let hold_s = config.jobs.idempotency_hold_s.unwrap_or(KEY_HOLD_DEFAULT_S);
    let key_hold = chrono::Duration::seconds(i64::try_from(hold_s).unwrap_or(i64::MAX / 1_000));
    Ok(JobSettings {
        selection,
        settle_timeout_s: config.jobs.settle_timeout_s,
        max_parallel,
        key_hold,
        keys_max: config.jobs.idempotency_keys_max.unwrap_or(KEYS_MAX_DEFAULT),
    })
}

/// How this command drives waves: `baton wave run` dispatches manual waves too, under an
/// override of their parallelism that is not stored.
#[derive(Clone, Copy, Debug, Default)]
pub struct WaveDrive {
    pub active: bool,
    pub max_parallel: Option<u32>,
}

/// What the engine needs to start child runs: the scenarios (a chain goes to one of them),
/// how jobs select, and the settle timeout (`--settle-timeout-s`, else the configuration's).
pub fn jobs(
    place: &Place,
    registry: Arc<Registry>,
    settle_timeout_s: Option<f64>,
    waves: WaveDrive,
) -> anyhow::Result<Jobs> {
    let settings = job_settings(place)?;
    let settle_timeout =
        baton_engine::job::settle_timeout(settle_timeout_s.or(settings.settle_timeout_s))
            .map_err(|e| anyhow::anyhow!("--settle-timeout-s: {e}"))?;
    let wave_settings = WaveSettings {
        max_parallel: settings.max_parallel.unwrap_or(WaveSettings::default().max_parallel),
        drive_max_parallel: waves.max_parallel,
        active: waves.active,
    };
    Ok(Jobs::new(registry, settings.selection, place.scenarios.clone(), settle_timeout)
        .with_waves(wave_settings))
}

/// [`jobs`] that reload the scenarios directory when its files change (a job may run for
/// long, and chain late), merging the tenant's overrides over each load.
pub async fn reloading_jobs(
    place: &Place,
    store: &dyn EventStore,
    registry: Arc<Registry>,
    settle_timeout_s: Option<f64>,
    tenant: Option<&str>,
    waves: WaveDrive,
) -> anyhow::Result<Arc<Jobs>> {
    let jobs = jobs(place, registry, settle_timeout_s, waves)?;
    let Ok((handle, _)) = baton_scenario::RegistryHandle::open(vec![place.scenarios.clone()])
    else {
        return Ok(Arc::new(jobs));
    };
    let overrides = match tenant {
        Some(t) => Some((t.to_owned(), crate::scenarios::stored(store, t).await?)),
        None => None,
    };
    Ok(Arc::new(jobs.reloading(handle, overrides)))
}

/// An engine for actions on a wave: the existing store, and the configuration's wave
/// settings (its default `max_parallel`).
pub async fn wave_engine(place: &Place) -> anyhow::Result<Engine> {
    let store = crate::place::open_existing_store(place).await?;
    let jobs = jobs(place, Arc::new(Registry::default()), None, WaveDrive::default())?;
    Ok(engine(
        store,
        Arc::new(ScriptedModel::default()),
        &Registry::default(),
        workspace_setup(place, None, None),
        redactor(place),
        &jail(place),
        Some(Arc::new(jobs)),
        None,
        None,
    ))
}

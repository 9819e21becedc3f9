//! `baton run`, `resume`, `approve`, `answer`, `cancel`, `runs` and `events`.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use baton_engine::cassette;
use baton_engine::clock::SystemClock;
use baton_engine::event::{Event, EventData};
use baton_engine::job::{JobRequest, Jobs, Selection};
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::pinning::Upgrade;
use baton_engine::redact::Redactor;
use baton_engine::runner::Runtime;
use baton_engine::store::EventStore;
use baton_engine::verifier::Verifiers;
use baton_engine::wave_drive::WaveSettings;
use baton_engine::workspace::WorkspaceSetup;
use baton_engine::{Engine, Outcome, Status};
use baton_jail::{Jail, Unavailable};
use baton_providers::client::Providers;
use baton_providers::config::Config;
use baton_scenario::{Registry, Scenario};
use baton_store::{PostgresStore, SqliteStore, Store};
use baton_workspace::LocalWorkspaces;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use crate::escape;
use crate::limits::DATA_BYTES_MAX;
use crate::out::outln;
use crate::timeline;

/// Where runs live and where scenarios are read from.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// The SQLite database; with a PostgreSQL `--db`, a path in Baton's own directory
    /// (`--data`) that names no file — workspaces and snapshots live beside it either way.
    pub db: PathBuf,
    /// The PostgreSQL database `--db` names, when it names one.
    pub postgres: Option<String>,
    /// How long this process's holds on runs in a PostgreSQL database last without a
    /// renewal (`baton worker --lease-s`); none: the store's default.
    pub hold_for: Option<std::time::Duration>,
    pub scenarios: PathBuf,
    /// The provider configuration given with `--config`.
    pub config: Option<PathBuf>,
    /// Where snapshot repositories live (`--snapshots`; default `snapshots/` beside the
    /// database).
    pub snapshots: Option<PathBuf>,
    /// `--no-jail`: programs run unconfined.
    pub no_jail: bool,
}

impl Place {
    /// The run database as messages name it (a PostgreSQL URL without its password).
    pub(crate) fn db_shown(&self) -> String {
        match &self.postgres {
            Some(url) => baton_store::postgres::shown(url),
            None => self.db.display().to_string(),
        }
    }

    /// Whether the run database exists (a PostgreSQL database always does: its tables are
    /// made on first use).
    pub(crate) fn db_exists(&self) -> bool {
        self.postgres.is_some() || self.db.exists()
    }
}

/// The run database (its runs and its tokens), created when absent.
pub(crate) async fn open_any(place: &Place) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match &place.postgres {
        Some(url) => Arc::new(
            PostgresStore::connect_holding(
                url,
                place.hold_for.unwrap_or(baton_store::postgres::DEFAULT_HOLD_FOR),
            )
            .await
            .map_err(store_error)?,
        ),
        None => Arc::new(SqliteStore::open(&place.db).map_err(store_error)?),
    })
}

/// The run database, created when absent: for commands that start runs.
pub(crate) async fn open_store(place: &Place) -> anyhow::Result<Arc<dyn EventStore>> {
    Ok(open_any(place).await?)
}

/// The run database, which must exist: for commands that read runs or change existing
/// ones. Nothing is created, so a mistyped `--db` leaves no directories or empty database.
pub(crate) async fn open_existing_any(place: &Place) -> anyhow::Result<Arc<dyn Store>> {
    if place.postgres.is_some() {
        return open_any(place).await;
    }
    if !place.db.exists() {
        bail!("no database at {}; start a run first or pass --db", place.db.display());
    }
    let store = SqliteStore::open_existing(&place.db).map_err(store_error)?;
    Ok(Arc::new(store))
}

/// [`open_existing_any`], for its runs.
pub(crate) async fn open_existing_store(place: &Place) -> anyhow::Result<Arc<dyn EventStore>> {
    Ok(open_existing_any(place).await?)
}

/// A store's error as the user reads it: the store names the path and the reason.
fn store_error(e: baton_engine::store::Error) -> anyhow::Error {
    match e {
        baton_engine::store::Error::Backend(message) => anyhow::Error::msg(message),
        other => other.into(),
    }
}

/// The model answering a run: the scripted model with `--script`, else the providers of the
/// configuration (`--config`, ./baton.toml, or the environment). The second value says where
/// it came from, recorded on the run so that a later process resumes with the same.
///
/// With `check`, every level of that scenario that calls a model must be satisfiable by the
/// configured providers before anything runs (a script answers every level).
pub(crate) fn load_model(
    script: Option<&Path>,
    config: Option<&Path>,
    check: Option<&Scenario>,
) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    if let Some(path) = script.filter(|p| p.extension().is_some_and(|e| e == "json"))
        && let Ok(loaded) = cassette::Cassette::load(path)
    {
        // A cassette given where a script is expected: replay it (read once).
        return Ok(replaying(path, loaded));
    }
    if let Some(path) = script {
        let model = ScriptedModel::load(path).map_err(|e| anyhow::anyhow!("--script: {e}"))?;
        let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        return Ok((Arc::new(model), Some(format!("script:{}", absolute.display()))));
    }
    let file = config_file(config);
    let (config, source) = match &file {
        Some(path) => {
            let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            (Config::from_file(path)?, format!("config:{}", absolute.display()))
        }
        None => (Config::from_env(|k| std::env::var(k).ok()), "env".to_owned()),
    };
    if config.providers.is_empty() {
        bail!(
            "no model to call: pass --script FILE for the scripted model, or configure providers in baton.toml (--config) or with ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENAI_BASE_URL"
        );
    }
    if let Some(scenario) = check {
        let blocked = crate::cmd_validate::unsatisfiable_levels(scenario, &config);
        if !blocked.is_empty() {
            let configured = match &file {
                Some(path) => path.display().to_string(),
                None => "the environment (ANTHROPIC_API_KEY, OPENAI_API_KEY, OPENAI_BASE_URL)"
                    .to_owned(),
            };
            let levels: Vec<String> = blocked
                .iter()
                .map(|(level, wanted)| format!("level `{level}` wants {wanted}"))
                .collect();
            bail!(
                "scenario `{}` cannot run with the models configured in {configured}: {}; no configured model satisfies {}. Configure a provider and model that match (see the README's `baton.toml` section), or run with --script FILE",
                scenario.id,
                levels.join("; "),
                if blocked.len() == 1 { "it" } else { "them" }
            );
        }
    }
    let providers = Providers::new(config).map_err(anyhow::Error::msg)?;
    Ok((Arc::new(providers), Some(source)))
}

/// A model that answers from a cassette only.
fn replay(path: &Path) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    let cassette = cassette::Cassette::load(path).map_err(anyhow::Error::msg)?;
    Ok(replaying(path, cassette))
}

/// A model that answers from `cassette`, read from `path` (recorded as the run's source).
fn replaying(
    path: &Path,
    cassette: cassette::Cassette,
) -> (Arc<dyn ModelProvider>, Option<String>) {
    let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    (Arc::new(cassette::Replayer::new(cassette)), Some(format!("cassette:{}", absolute.display())))
}

/// The model a run uses, given the run's options: a cassette to replay, or a model (scripted
/// or configured), optionally recorded into a cassette.
pub(crate) fn choose_model(
    script: Option<&Path>,
    config: Option<&Path>,
    replay_from: Option<&Path>,
    record_to: Option<&Path>,
    scenario: &Scenario,
) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    if let Some(path) = replay_from {
        return replay(path);
    }
    let (model, source) = load_model(script, config, Some(scenario))?;
    match record_to {
        Some(path) => Ok((Arc::new(cassette::Recorder::new(model, path.to_path_buf())), source)),
        None => Ok((model, source)),
    }
}

/// The model a run recorded as its source, for resuming it.
pub(crate) fn recorded_model(
    source: Option<&str>,
    script: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<Arc<dyn ModelProvider>> {
    if script.is_some() || config.is_some() {
        return Ok(load_model(script, config, None)?.0);
    }
    match source {
        Some(s) if s.starts_with("cassette:") => Ok(replay(Path::new(&s["cassette:".len()..]))?.0),
        Some(s) if s.starts_with("script:") => {
            Ok(load_model(Some(Path::new(&s["script:".len()..])), None, None)?.0)
        }
        Some(s) if s.starts_with("config:") => {
            Ok(load_model(None, Some(Path::new(&s["config:".len()..])), None)?.0)
        }
        _ => Ok(load_model(None, None, None)?.0),
    }
}

/// Where runs get their workspaces: `DIR` from `--workspace`, else one directory per run
/// under `workspaces/` beside the database; their snapshots under `--snapshots`, else
/// `snapshots/` beside the database.
pub(crate) fn workspace_setup(
    place: &Place,
    dir: Option<PathBuf>,
    branch: Option<String>,
) -> WorkspaceSetup {
    let data = place.db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    let root = absolute(data.join("workspaces"));
    let snapshots = absolute(place.snapshots.clone().unwrap_or_else(|| data.join("snapshots")));
    let dir = dir.map(absolute);
    let opener = LocalWorkspaces::new(root, snapshots).jailed(jail(place));
    WorkspaceSetup { opener: Arc::new(opener), dir, branch }
}

/// An engine for reading, deciding and finishing runs: its model answers nothing (a run
/// resumes with the model it recorded), its workspaces are the run's own.
pub(crate) fn probe_engine(
    place: &Place,
    store: &Arc<dyn EventStore>,
    registry: &Registry,
) -> Engine {
    engine(
        Arc::clone(store),
        Arc::new(ScriptedModel::default()),
        registry,
        workspace_setup(place, None, None),
        redactor(place),
        jail(place),
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
pub(crate) fn redactor(place: &Place) -> Redactor {
    let mut names: Vec<String> = WELL_KNOWN_KEY_VARIABLES.iter().map(|&n| n.to_owned()).collect();
    let file = place.config.clone().unwrap_or_else(|| PathBuf::from("baton.toml"));
    if let Ok(config) = Config::from_file(&file) {
        names.extend(config.providers.iter().filter_map(|p| p.api_key_env.clone()));
    }
    Redactor::new(names.iter().filter_map(|n| std::env::var(n).ok()))
}

/// Baton's own directory: the database's.
pub(crate) fn data_dir(place: &Place) -> PathBuf {
    let data = place.db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::path::absolute(data).unwrap_or_else(|_| data.to_path_buf())
}

/// The jail every program a run starts goes through — set up at the first program, once
/// per process — or its absence with `--no-jail`.
pub(crate) fn jail(place: &Place) -> Arc<Jail> {
    static JAIL: std::sync::OnceLock<Arc<Jail>> = std::sync::OnceLock::new();
    Arc::clone(JAIL.get_or_init(|| Arc::new(build_jail(place))))
}

/// The configuration file to read: `--config`, else ./baton.toml when something is
/// there — whatever is there is read (and refused when it is not a regular file), never
/// silently skipped.
fn config_file(config: Option<&Path>) -> Option<PathBuf> {
    config.map(Path::to_path_buf).or_else(|| {
        let default = PathBuf::from("baton.toml");
        std::fs::symlink_metadata(&default).is_ok().then_some(default)
    })
}

fn build_jail(place: &Place) -> Jail {
    if place.no_jail {
        return Jail::off();
    }
    let config = match config_file(place.config.as_deref()).map(|f| Config::from_file(&f)) {
        Some(Ok(config)) => config.jail,
        Some(Err(e)) => return Jail::unavailable(Unavailable(e.to_string())),
        None => baton_providers::config::JailConfig::default(),
    };
    let init = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => {
            return Jail::unavailable(Unavailable(format!("cannot find Baton's binary: {e}")));
        }
    };
    let data = data_dir(place);
    let snapshots = place.snapshots.clone().unwrap_or_else(|| data.join("snapshots"));
    let mut read_only = config.read_only;
    if let Some(extra) = std::env::var_os("BATON_JAIL_READ_ONLY") {
        read_only.extend(std::env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    }
    const MIB: u64 = 1024 * 1024;
    let d = baton_jail::Limits::default();
    let limits = baton_jail::Limits {
        processes: config.processes.unwrap_or(d.processes),
        new_files: config.new_files.unwrap_or(d.new_files),
        new_bytes: config.new_mib.map_or(d.new_bytes, |m| m.saturating_mul(MIB)),
        file_bytes: config.file_mib.map_or(d.file_bytes, |m| m.saturating_mul(MIB)),
        data_bytes: config.memory_mib.map_or(d.data_bytes, |m| m.saturating_mul(MIB)),
        ..d
    };
    Jail::lazy(baton_jail::Settings {
        bwrap: std::env::var_os("BATON_BWRAP").map(PathBuf::from).or(config.bwrap),
        init,
        run_as: (config.uid.unwrap_or(65534), config.gid.unwrap_or(65534)),
        read_only,
        path: None,
        hidden: hidden(place, &data, snapshots),
        protected: protected(place),
        data: Some(data.clone()),
        scratch: data.join("jail"),
        limits,
    })
}

/// Baton's own state, which no jailed program may see: its directory (where it lies in a
/// workspace), the database and its journals, the runs' workspaces (the running one's own is shown), the snapshots, the jail's own
/// directory.
fn hidden(place: &Place, data: &Path, snapshots: PathBuf) -> Vec<PathBuf> {
    let db = std::path::absolute(&place.db).unwrap_or_else(|_| place.db.clone());
    let mut hidden: Vec<PathBuf> = ["", "-wal", "-shm", "-journal"]
        .iter()
        .map(|suffix| {
            let mut name = db.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        })
        .collect();
    hidden.push(data.to_path_buf());
    hidden.push(data.join("workspaces"));
    hidden.push(std::path::absolute(&snapshots).unwrap_or(snapshots));
    hidden.push(data.join("jail"));
    hidden
}

/// What a jailed program may read but not change when its workspace holds it: the
/// configuration (`--config` or ./baton.toml) and the scenarios directory.
fn protected(place: &Place) -> Vec<PathBuf> {
    let config = place.config.clone().unwrap_or_else(|| PathBuf::from("baton.toml"));
    [config, place.scenarios.clone()]
        .into_iter()
        .map(|p| std::path::absolute(&p).unwrap_or(p))
        .collect()
}

/// Before a run starts programs: refused when the jail cannot be set up, and said out
/// loud when it is off.
pub(crate) fn check_jail(place: &Place, scenario: &Scenario) -> anyhow::Result<()> {
    let runs_programs = scenario
        .levels
        .iter()
        .flat_map(|l| &l.verifiers)
        .any(|v| baton_engine::verifier::runs_programs(v.uses))
        || scenario
            .levels
            .iter()
            .any(|l| matches!(&l.kind, baton_scenario::LevelKind::Wave(w) if w.command.is_some()));
    if !runs_programs {
        return Ok(());
    }
    let jail = jail(place);
    if jail.is_off() {
        eprintln!(
            "baton: warning: --no-jail: scenario `{}` runs verifiers, scanners or MCP servers unconfined, as Baton's own user; whatever the model wrote can read and change what this user can (its verifier outcomes record `jail: off`)",
            scenario.id
        );
    } else if let Some(why) = jail.refusal() {
        bail!("scenario `{}` runs programs, and {why}", scenario.id);
    }
    Ok(())
}

pub(crate) fn engine(
    store: Arc<dyn EventStore>,
    model: Arc<dyn ModelProvider>,
    registry: &Registry,
    workspaces: WorkspaceSetup,
    redactor: Redactor,
    jail: Arc<Jail>,
    jobs: Option<Arc<Jobs>>,
) -> Engine {
    engine_trusting(store, model, registry, workspaces, redactor, jail, jobs, None)
}

/// [`engine`], with a `trust_validation` replay's recorded verifier outcomes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn engine_trusting(
    store: Arc<dyn EventStore>,
    model: Arc<dyn ModelProvider>,
    registry: &Registry,
    workspaces: WorkspaceSetup,
    redactor: Redactor,
    jail: Arc<Jail>,
    jobs: Option<Arc<Jobs>>,
    trusted: Option<Arc<baton_engine::replay::Trusted>>,
) -> Engine {
    let catalog: Vec<Value> = registry
        .scenarios()
        .filter(|s| s.classifier_eligible())
        .map(|s| json!({"id": s.id, "display_name": s.display_name, "description": s.description, "examples": s.examples}))
        .collect();
    let mut verifiers = Verifiers::builtin();
    baton_verifiers::register(&mut verifiers);
    if let Some(trusted) = trusted {
        verifiers = verifiers.trusting(trusted);
    }
    Engine::new(
        store,
        Arc::new(Runtime {
            model,
            verifiers,
            workspace: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            workspaces: Some(workspaces),
            catalog: Arc::new(Value::Array(catalog)),
            redactor,
            jail,
            jobs,
        }),
        Arc::new(SystemClock),
    )
}

/// The configuration's `[selection]` and `[jobs]` settings: the file's when there is one
/// (a file that does not load is an error, never skipped), the defaults otherwise.
pub(crate) fn job_settings(place: &Place) -> anyhow::Result<(Selection, Option<f64>, Option<u32>)> {
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
    // Checked when the file was read: 1 through 10.
    let parallel = config.waves.max_parallel.and_then(|n| u32::try_from(n).ok());
    Ok((selection, config.jobs.settle_timeout_s, parallel))
}

/// How this command drives waves: `baton wave run` dispatches manual waves too, under an
/// override of their parallelism that is not stored.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WaveDrive {
    pub active: bool,
    pub max_parallel: Option<u32>,
}

/// What the engine needs to start child runs: the scenarios (a chain goes to one of them),
/// how jobs select, and the settle timeout (`--settle-timeout-s`, else the configuration's).
pub(crate) fn jobs(
    place: &Place,
    registry: Arc<Registry>,
    settle_timeout_s: Option<f64>,
    waves: WaveDrive,
) -> anyhow::Result<Jobs> {
    let (selection, configured, parallel) = job_settings(place)?;
    let settle_timeout = baton_engine::job::settle_timeout(settle_timeout_s.or(configured))
        .map_err(|e| anyhow::anyhow!("--settle-timeout-s: {e}"))?;
    let settings = WaveSettings {
        max_parallel: parallel.unwrap_or(WaveSettings::default().max_parallel),
        drive_max_parallel: waves.max_parallel,
        active: waves.active,
    };
    Ok(Jobs::new(registry, selection, place.scenarios.clone(), settle_timeout).with_waves(settings))
}

/// [`jobs`] that reload the scenarios directory when its files change (a job may run for
/// long, and chain late), merging the tenant's overrides over each load.
async fn reloading_jobs(
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
        Some(t) => Some((t.to_owned(), crate::cmd_tenant::stored(store, t).await?)),
        None => None,
    };
    Ok(Arc::new(jobs.reloading(handle, overrides)))
}

pub(crate) fn registry(place: &Place) -> anyhow::Result<Registry> {
    match Registry::load(&[&place.scenarios]) {
        Ok(loaded) => Ok(loaded.registry),
        Err(e) => {
            eprint!("{}", e.diagnostics.render());
            bail!("the scenarios in {} do not load", place.scenarios.display())
        }
    }
}

pub(crate) fn find_scenario(
    registry: &Registry,
    which: &str,
    place: &Place,
) -> anyhow::Result<Arc<Scenario>> {
    if let Some(s) = registry.get(which) {
        return Ok(Arc::clone(s));
    }
    let known: Vec<&str> = registry.scenarios().map(|s| s.id.as_str()).collect();
    bail!("no scenario `{which}` in {} (known: {})", place.scenarios.display(), known.join(", "))
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

/// Options of `baton run`.
#[derive(Debug)]
pub(crate) struct RunArgs {
    /// What the job asks for: a pin, an intent route, a kind, or nothing (the default).
    pub job: JobRequest,
    /// The job's cost cap, all its runs together.
    pub max_cost_usd: Option<f64>,
    /// Refuse to start when the scenario's forecast p90 cost is over this.
    pub max_forecast_usd: Option<f64>,
    pub settle_timeout_s: Option<f64>,
    pub idempotency_key: Option<String>,
    /// Run the scenarios with this tenant's overrides merged in.
    pub tenant: Option<String>,
    pub input: String,
    pub meta: Vec<(String, String)>,
    pub script: Option<PathBuf>,
    pub json: bool,
    /// Show the text of model answers as it streams in.
    pub stream: bool,
    /// Create the job's first run and leave it to a worker.
    pub queue: bool,
    /// With `queue`: more jobs like the first, one per input (`--input-lines`).
    pub more_inputs: Vec<String>,
    /// Replay model answers from this cassette instead of calling any model.
    pub cassette: Option<PathBuf>,
    /// Record every model answer into this cassette.
    pub record: Option<PathBuf>,
    /// The workspace directory, instead of a new one under the data directory.
    pub workspace: Option<PathBuf>,
    /// Name the completed run's result with this branch of the workspace repository.
    pub branch: Option<String>,
    /// Run this scenario instead of selecting one (a standalone wave's, made by `baton
    /// wave plan`).
    pub given: Option<Arc<Scenario>>,
}

pub(crate) async fn run(place: &Place, args: RunArgs) -> anyhow::Result<ExitCode> {
    // Arguments are checked before anything is created: a bad one never leaves a run.
    if let Some(branch) = &args.branch {
        check_branch_name(branch).map_err(|why| {
            anyhow::anyhow!(
                "--branch {branch:?} is not a valid branch name: {why}; use letters, digits, '-', '_' and '/' (see git check-ref-format)"
            )
        })?;
    }
    if let Some(path) = &args.record {
        check_writable_file(path).map_err(|why| {
            anyhow::anyhow!("cannot record the cassette to {}: {why}", path.display())
        })?;
    }
    if let Some(usd) = args.max_cost_usd
        && (!usd.is_finite() || usd <= 0.0)
    {
        bail!("--max-cost-usd must be a positive amount of US dollars, not {usd}");
    }
    if let Some(key) = &args.idempotency_key
        && (key.trim().is_empty() || key.len() > 256)
    {
        bail!("--idempotency-key must be 1 to 256 bytes and not blank");
    }
    let mut metadata = Map::new();
    for (k, v) in args.meta {
        metadata.insert(k, Value::String(v));
    }
    // A job may name its scenario in its metadata too, as the reference's payloads do;
    // the flags win.
    let from_meta = |key: &str| metadata.get(key).and_then(Value::as_str).map(str::to_owned);
    let job = JobRequest {
        pin: args.job.pin.or_else(|| from_meta("scenario_id")),
        intent: args.job.intent.or_else(|| from_meta("intent_route")),
        kind: args.job.kind.or_else(|| from_meta("kind")),
    };
    for (flag, value) in
        [("--scenario", &job.pin), ("--intent", &job.intent), ("--kind", &job.kind)]
    {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            bail!("{flag} is empty; give a value or leave it out");
        }
    }
    if let Some(tenant) = &args.tenant {
        crate::cmd_tenant::check_tenant(tenant)?;
    }
    // A tenant's overrides are in the database; with no database yet it has none. Nothing
    // is created before every argument and file has been checked.
    let registry = match &args.tenant {
        Some(tenant) if place.db_exists() => {
            let store = open_existing_store(place).await?;
            crate::cmd_tenant::merged(store.as_ref(), registry(place)?, tenant).await?
        }
        _ => registry(place)?,
    };
    let registry = Arc::new(registry);
    let (selection, _, _) = job_settings(place)?;
    let (scenario, selected) = match args.given {
        Some(scenario) => (scenario, None),
        None => {
            // A scenario typed on the command line that matches nothing is an error: a
            // typo must not start a paid default.
            let (scenario, selected) = baton_engine::job::select(&registry, &selection, &job, true)
                .map_err(|e| anyhow::anyhow!("{e} (in {})", place.scenarios.display()))?;
            if let Some(warning) = &selected.warning {
                eprintln!("baton: warning: {}", escape::one_line(warning));
            }
            (scenario, Some(selected))
        }
    };
    if args.branch.is_some() && !baton_engine::exec::owns_workspace(&scenario) {
        bail!(
            "--branch names the result in the run's workspace, and scenario `{}` has no tool_loop level (no workspace); leave --branch out",
            scenario.id
        );
    }
    if let Some(dir) = &args.workspace
        && !baton_engine::exec::needs_workspace(&scenario)
    {
        bail!(
            "--workspace {}: scenario `{}` reads no files (no tool_loop level, no verifier that runs in a workspace), so the directory would not be used; drop --workspace",
            dir.display(),
            scenario.id
        );
    }
    check_jail(place, &scenario)?;
    if let Some(max) = args.max_forecast_usd {
        crate::cmd_forecast::guard(place, &scenario, max).await?;
    }
    let chosen = choose_model(
        args.script.as_deref(),
        place.config.as_deref(),
        args.cassette.as_deref(),
        args.record.as_deref(),
        &scenario,
    );
    let (model, source) = match chosen {
        // A standalone wave calls no model until `baton wave run` runs its workers, with
        // the model that command is given.
        Err(_)
            if baton_engine::exec::calls_no_model(&scenario)
                && args.script.is_none()
                && args.cassette.is_none() =>
        {
            (Arc::new(ScriptedModel::default()) as Arc<dyn ModelProvider>, None)
        }
        other => other?,
    };
    let store = open_store(place).await?;
    if let Some(key) = &args.idempotency_key
        && let Some(existing) = store.run_by_key(key).await?
    {
        return existing_run(place, store, &existing.run_id, key, args.json).await;
    }
    let jobs = reloading_jobs(
        place,
        store.as_ref(),
        Arc::clone(&registry),
        args.settle_timeout_s,
        args.tenant.as_deref(),
        WaveDrive::default(),
    )
    .await?;
    let mut engine = engine(
        store,
        model,
        &registry,
        workspace_setup(place, args.workspace, args.branch),
        redactor(place),
        jail(place),
        Some(jobs),
    );
    if args.stream {
        engine.live = Some(timeline::live_sink());
    }
    // The id is printed by the timeline once the store holds the run (see `drive`): a run
    // that fails before its first commit (its workspace cannot be opened, say) was never
    // created, and its id would name nothing.
    let run_id = Engine::new_run_id();
    let first = baton_engine::job::Start {
        input: args.input,
        metadata,
        model_source: source,
        selected,
        tree_max_cost_usd: args.max_cost_usd,
        budget: None,
        parent: None,
        idempotency_key: args.idempotency_key.clone(),
        tenant: args.tenant.clone(),
        parent_seq: None,
        replay: None,
    };
    if args.queue {
        let code = queue(place, &engine, &run_id, &scenario, first.clone(), args.json).await?;
        for input in args.more_inputs {
            let start = baton_engine::job::Start { input, ..first.clone() };
            queue(place, &engine, &Engine::new_run_id(), &scenario, start, args.json).await?;
        }
        return Ok(code);
    }
    let follow = vec![Followed::new(&run_id, 0, 0)];
    match drive(&engine, &run_id, &scenario, args.json, follow, Driving::Start(Box::new(first)))
        .await
    {
        // Another process started a job with this key between the look above and here.
        Err(e) => match (e.downcast_ref::<baton_engine::exec::Error>(), &args.idempotency_key) {
            (
                Some(baton_engine::exec::Error::Store(baton_engine::store::Error::KeyTaken {
                    run_id,
                    ..
                })),
                Some(key),
            ) => {
                let run_id = run_id.clone();
                existing_run(place, Arc::clone(&engine.store), &run_id, key, args.json).await
            }
            _ => Err(e),
        },
        done => done,
    }
}

/// The most jobs one `--input-lines` file queues.
const INPUT_LINES_MAX: usize = 100_000;

/// The inputs of `--input-lines`: each non-empty line of the file, at least one.
pub(crate) fn input_lines(path: &Path) -> anyhow::Result<Vec<String>> {
    let bytes_max = 64 * 1024 * 1024;
    let text = baton_scenario::capped::read_text(path, bytes_max)
        .map_err(|e| anyhow::anyhow!("--input-lines: {e}"))?;
    let lines: Vec<String> =
        text.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect();
    if lines.is_empty() {
        bail!(
            "--input-lines {}: no line holds an input; write one job's input per line",
            path.display()
        );
    }
    if lines.len() > INPUT_LINES_MAX {
        bail!(
            "--input-lines {}: {} jobs, more than {INPUT_LINES_MAX} at once; split the file",
            path.display(),
            lines.len()
        );
    }
    Ok(lines)
}

/// `baton run --queue`: the job's first run is created, durable and `running`, and left to
/// a worker.
async fn queue(
    place: &Place,
    engine: &Engine,
    run_id: &str,
    scenario: &Arc<Scenario>,
    first: baton_engine::job::Start,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let key = first.idempotency_key.clone();
    match engine.create_job(run_id, scenario, first).await {
        Ok(()) => {}
        Err(baton_engine::exec::Error::Store(baton_engine::store::Error::KeyTaken {
            run_id: taken,
            ..
        })) => {
            let key = key.unwrap_or_default();
            return existing_run(place, Arc::clone(&engine.store), &taken, &key, json).await;
        }
        Err(e) => return Err(e.into()),
    }
    if json {
        outln!("{}", json!({"run_id": run_id, "status": "running", "queued": true}))?;
    } else {
        outln!("run {run_id}")?;
        outln!(
            "queued: a `baton worker` on {} drives it (or `baton resume {run_id}`)",
            place.db_shown()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A job started again with its idempotency key: the first one's run, as it stands — its
/// result, or what it waits for — and no new run.
async fn existing_run(
    place: &Place,
    store: Arc<dyn EventStore>,
    run_id: &str,
    key: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    eprintln!(
        "baton: run {run_id} was started with idempotency key {}; no new run was started",
        escape::one_line(&format!("{key:?}"))
    );
    let engine = probe_engine(place, &store, &Registry::default());
    let state = engine.state(run_id).await?;
    let outcome = if state.status.is_final() {
        Outcome::Finished(state.status)
    } else if state.status == Status::Paused {
        Outcome::Paused
    } else if state.status == Status::Waiting {
        Outcome::Waiting
    } else if store.is_held(run_id).await? {
        Outcome::Interrupted("it is being driven by another process".to_owned())
    } else {
        Outcome::Interrupted("no process drives it".to_owned())
    };
    if !json {
        outln!("run {run_id}")?;
    }
    report(&engine, run_id, &outcome, json).await?;
    Ok(exit_code(&outcome))
}

/// Continues a run on the scenario version it started with (or was last moved to), which
/// the store keeps; with `upgrade`, moves it to the scenario's current version first.
pub(crate) async fn resume(
    place: &Place,
    run_id: &str,
    script: Option<&Path>,
    json: bool,
    upgrade: bool,
    waves: WaveDrive,
) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    let probe = probe_engine(place, &store, &Registry::default());
    let state = probe.state(run_id).await.with_context(|| format!("cannot read run {run_id}"))?;
    let (scenario, registry) = if upgrade {
        let registry = registry(place)?;
        let current = find_scenario(&registry, &state.scenario_id, place)?;
        match probe.upgrade(run_id, &current).await? {
            Upgrade::Moved(u) if json => {
                eprintln!("run {run_id} moved from version {} to {}", u.from_version, u.version);
            }
            Upgrade::Moved(_) => {}
            Upgrade::Current => eprintln!(
                "run {run_id} already is on the current version of scenario `{}`; nothing to upgrade",
                current.id
            ),
        }
        (current, registry)
    } else {
        let scenario = run_scenario(place, &probe, &state, run_id).await?;
        // The catalog (what a classifier level may route to) and the scenarios a chain may
        // go to are the directory's when it loads; the run's own scenario never depends on it.
        let mut registry =
            Registry::load(&[&place.scenarios]).map(|l| l.registry).unwrap_or_default();
        if let Some(tenant) = &state.tenant {
            registry = crate::cmd_tenant::merged(store.as_ref(), registry, tenant).await?;
        }
        (scenario, registry)
    };
    check_jail(place, &scenario)?;
    // A run of a tree continues from its job's first run, so that every parent takes the
    // result of the run below it.
    let root = root_of(&store, run_id).await?;
    let (root_scenario, root_state) = if root == run_id {
        (scenario, state)
    } else {
        let root_state = probe.state(&root).await?;
        (run_scenario(place, &probe, &root_state, &root).await?, root_state)
    };
    let registry = Arc::new(registry);
    // A replay goes on as it began: answers from its recording, verifiers as its strategy
    // says, children settled in the recording's order.
    let mut how = Driving::Continue;
    let engine = if let Some(replayed) = &root_state.replay_of {
        if script.is_some() {
            bail!(
                "run {root} replays run {}: it takes its answers from that recording, not from --script",
                replayed.of_run_id
            );
        }
        let recorded = crate::cmd_replay::recording_of(place, &probe, replayed).await?;
        let trusted = (replayed.strategy == baton_engine::replay::Strategy::TrustValidation)
            .then(|| Arc::new(recorded.trusted(&root)));
        let jobs = jobs(place, Arc::clone(&registry), None, waves)?
            .settling_as(Arc::new(recorded.settle_order(&root)));
        let cassette = recorded.cassette();
        how = Driving::Replay(Box::new(recorded));
        engine_trusting(
            store,
            Arc::new(cassette::Replayer::new(cassette)),
            &registry,
            workspace_setup(place, None, None),
            redactor(place),
            jail(place),
            Some(Arc::new(jobs)),
            trusted,
        )
    } else {
        let model = match recorded_model(
            root_state.model_source.as_deref(),
            script,
            place.config.as_deref(),
        ) {
            // A run of manual waves calls no model; `baton wave run` needs one for its
            // workers.
            Err(_) if baton_engine::exec::calls_no_model(&root_scenario) && !waves.active => {
                Arc::new(ScriptedModel::default()) as Arc<dyn ModelProvider>
            }
            other => other?,
        };
        let jobs = reloading_jobs(
            place,
            store.as_ref(),
            Arc::clone(&registry),
            None,
            root_state.tenant.as_deref(),
            waves,
        )
        .await?;
        engine(
            store,
            model,
            &registry,
            workspace_setup(place, None, None),
            redactor(place),
            jail(place),
            Some(jobs),
        )
    };
    // Show the decision or answer that led here, then what follows.
    let mut follow = Vec::new();
    for (id, depth) in tree_of(engine.store.as_ref(), &root, true).await? {
        let last = engine.store.run(&id).await?.map_or(0, |r| r.last_seq);
        let after = if id == run_id { last.saturating_sub(1) } else { last };
        follow.push(Followed::new(&id, after, depth));
    }
    drive(&engine, &root, &root_scenario, json, follow, how).await
}

/// Where a run of a tree is continued from: its highest ancestor that has not ended (the
/// job's first run, unless that ended without waiting for this one), itself when none.
async fn root_of(store: &Arc<dyn EventStore>, run_id: &str) -> anyhow::Result<String> {
    let mut top = run_id.to_owned();
    // Bounded by the chain's depth; the bound guards against a damaged record.
    for _ in 0..=baton_engine::limits::CHAIN_DEPTH_MAX + 1 {
        let Some(record) = store.run(&top).await? else {
            bail!("no run {top}");
        };
        let Some(parent) = record.parent_run_id else { break };
        match store.run(&parent).await? {
            Some(p) if !is_final(&p.status) => top = parent,
            _ => break,
        }
    }
    Ok(top)
}

/// A run and every run below it that exists, parents before children, with their depth
/// under `root`.
async fn tree(store: &dyn EventStore, root: &str) -> anyhow::Result<Vec<(String, usize)>> {
    tree_of(store, root, false).await
}

/// [`tree`], with `recorded` also the children a parent recorded that do not exist yet
/// (a follower waits for them).
async fn tree_of(
    store: &dyn EventStore,
    root: &str,
    recorded: bool,
) -> anyhow::Result<Vec<(String, usize)>> {
    let mut out = Vec::new();
    let mut pending = vec![(root.to_owned(), 0usize)];
    while let Some((id, depth)) = pending.pop() {
        if store.run(&id).await?.is_none() {
            if recorded && depth > 0 {
                out.push((id, depth));
            }
            continue;
        }
        let state = baton_engine::fold(&store.load(&id, 0).await?);
        for child in state.children.iter().rev() {
            pending.push((child.started.child_run_id.clone(), depth + 1));
        }
        out.push((id, depth));
    }
    Ok(out)
}

/// The scenario version a run continues on: loaded from the texts the store keeps under
/// the run's checksum, checked like files and required to hash to that checksum. A run
/// from before versions were kept continues from the scenarios directory when its files
/// still hash to the run's checksum (and its texts are kept from then on); else the error
/// says how to go on.
async fn run_scenario(
    place: &Place,
    probe: &Engine,
    state: &baton_engine::RunState,
    run_id: &str,
) -> anyhow::Result<Arc<Scenario>> {
    let short: String = state.checksum.chars().take(12).collect();
    if let Some(texts) = probe.kept_texts(&state.checksum).await? {
        let name = format!(
            "{} (version {} of run {run_id}, {short}…, as stored)",
            state.scenario_id, state.scenario_version
        );
        let scenario = Registry::load_texts(&name, &place.scenarios, &texts).map_err(|e| {
            eprint!("{}", e.diagnostics.render());
            anyhow::anyhow!(
                "run {run_id}: the stored version of scenario `{}` ({short}…) does not load ({e}); move the run to the current files with `baton resume {run_id} --upgrade`",
                state.scenario_id
            )
        })?;
        if scenario.checksum != state.checksum {
            bail!(
                "run {run_id}: the stored texts of scenario `{}` hash to {}, not to the run's checksum {}; the database was changed — restore it from a backup, or move the run to the current files with `baton resume {run_id} --upgrade`",
                state.scenario_id,
                scenario.checksum,
                state.checksum
            );
        }
        return Ok(scenario);
    }
    let registry = registry(place).with_context(|| {
        format!("run {run_id} started before Baton kept scenario versions, so it resumes only from the files it started with")
    })?;
    let scenario = find_scenario(&registry, &state.scenario_id, place)?;
    if scenario.checksum != state.checksum {
        bail!(
            "run {run_id} started before Baton kept scenario versions, and scenario `{}` in {} has changed since (checksum {} then, {} now); restore the files it started with to resume it there, or move it to the current files with `baton resume {run_id} --upgrade`",
            state.scenario_id,
            place.scenarios.display(),
            state.checksum,
            scenario.checksum
        );
    }
    // From here on the run keeps its version whatever happens to the files.
    probe.keep_texts(&scenario).await?;
    Ok(scenario)
}

/// How [`drive`] drives a job.
#[derive(Debug)]
pub(crate) enum Driving {
    /// A new job, from what it starts with.
    Start(Box<baton_engine::job::Start>),
    /// A job that exists.
    Continue,
    /// A replay that exists: the recording's decisions it has not made yet are made.
    Replay(Box<baton_engine::replay::Tree>),
}

pub(crate) async fn drive(
    engine: &Engine,
    run_id: &str,
    scenario: &Arc<Scenario>,
    json: bool,
    follow: Vec<Followed>,
    how: Driving,
) -> anyhow::Result<ExitCode> {
    let start = match &how {
        Driving::Start(s) => Some(s),
        _ => None,
    };
    // Print events as they land — the runs the job starts too, nested under the event
    // that started each — from another task reading the store; a new run's id heads them,
    // so it is printed only once the store holds the run.
    let printer = (!json).then(|| {
        let mut unannounced = start.is_some().then(|| run_id.to_owned());
        Printer::spawn(Arc::clone(&engine.store), follow, move |id, depth, e| {
            if let Some(id) = unannounced.take() {
                outln!("run {id}")?;
            }
            print_timeline(e, depth, id)
        })
    });
    let signals = tokio::spawn(stop_on_signal(engine.stop.clone()));
    let outcome = match how {
        Driving::Start(s) => engine.run_job(run_id, scenario, *s).await,
        Driving::Continue => engine.drive_tree(run_id, scenario).await,
        Driving::Replay(recorded) => engine.resume_replay(run_id, scenario, &recorded).await,
    };
    signals.abort();
    // The engine has returned: everything it wrote is in the store, and the printer reads
    // it to the end before it stops.
    let printed = match printer {
        Some(printer) => printer.finish().await,
        None => Ok(()),
    };
    let outcome = outcome?;
    printed?;
    report(engine, run_id, &outcome, json).await?;
    Ok(exit_code(&outcome))
}

/// What a job came to: its JSON result, or what it waits for, why it stopped or its output.
async fn report(
    engine: &Engine,
    run_id: &str,
    outcome: &Outcome,
    json: bool,
) -> anyhow::Result<()> {
    let state = engine.state(run_id).await?;
    let mut runs = Vec::new();
    for (id, depth) in tree(engine.store.as_ref(), run_id).await? {
        let s = if id == run_id { state.clone() } else { engine.state(&id).await? };
        runs.push((id, depth, s));
    }
    if json {
        let tree: Vec<Value> = runs
            .iter()
            .map(|(id, depth, s)| {
                json!({
                    "run_id": id,
                    "depth": depth,
                    "scenario_id": s.scenario_id,
                    "status": s.status.as_str(),
                    "pending_approvals": open_approvals(s),
                    "pending_question": s.pending_ask,
                })
            })
            .collect();
        outln!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "run_id": run_id,
                "scenario_id": state.scenario_id,
                "status": state.status.as_str(),
                "final_output": state.final_output,
                "aborted_reason": state.finished.as_ref().and_then(|f| f.aborted_reason.clone()),
                "totals": state.totals,
                "tree_totals": state.tree_totals(),
                "checksum": state.checksum,
                "selected": state.selected,
                "pending_approvals": open_approvals(&state),
                "pending_question": state.pending_ask,
                "tree": tree,
            }))?
        )?;
    } else if *outcome == Outcome::Paused {
        let waiting: Vec<&(String, usize, baton_engine::RunState)> =
            runs.iter().filter(|(_, _, s)| s.awaiting_person()).collect();
        let who = waiting.first().map_or(run_id, |(id, _, _)| id.as_str());
        outln!(
            "paused: run {who} waits for a person; continue with `baton approve {who}` or `baton answer {who} --answer JSON`"
        )?;
        for (id, _, s) in waiting {
            for line in waiting_lines(s, id) {
                outln!("  {line}")?;
            }
        }
    } else if *outcome == Outcome::Waiting
        && let Some(w) = baton_engine::wave_actions::wave_under_way(&state)
        && state.open_children().next().is_none()
    {
        let c = w.counts();
        let decision = w.decide(false, engine.wave_settings().parallel_for(w));
        let next = if decision.is_final() {
            format!(
                "its decision is `{}`: end it with `baton wave complete {run_id}`",
                decision.as_str()
            )
        } else {
            format!(
                "dispatch with `baton wave dispatch {run_id}`, record with `baton wave record {run_id}`, or run its workers with `baton wave run {run_id}`"
            )
        };
        outln!(
            "waiting: wave {run_id} (level `{}`) waits for outside agents: {} planned, {} in flight, {} settled; {next}",
            escape::one_line(&w.level_id),
            c.planned,
            c.in_flight,
            c.assignments - c.planned - c.in_flight
        )?;
    } else if *outcome == Outcome::Waiting {
        let children: Vec<String> = state
            .open_children()
            .map(|c| format!("{} ({})", c.started.child_run_id, c.started.scenario_id))
            .collect();
        outln!(
            "waiting: run {run_id} waits for the runs it started: {}; see them with `baton runs --tree`, continue with `baton resume {run_id}`",
            escape::one_line(&children.join(", "))
        )?;
    } else if let Outcome::Interrupted(reason) = outcome {
        outln!(
            "interrupted: run {run_id} stopped without ending ({}); nothing is lost — continue it with `baton resume {run_id}`",
            escape::one_line(reason)
        )?;
    } else if let Some(output) = &state.final_output {
        outln!("output:\n{}", escape::terminal_safe(output, escape::Layout::Block))?;
    }
    Ok(())
}

/// Stops the engine's drives at the first SIGINT or SIGTERM: the running step is cut and
/// awaited (its processes killed), and the run is recorded as interrupted, to be resumed.
async fn stop_on_signal(stop: baton_engine::cancel::CancelToken) {
    stop_on_signals(
        stop,
        "baton: stopping — the running step is cut and the run recorded as interrupted (press Ctrl-C again to exit at once)",
        "baton: exiting at once; the run stays resumable",
    )
    .await;
}

/// Cancels `stop` at the first SIGINT or SIGTERM, saying `stopping`; a second exits at once,
/// saying `exiting` — the jails die with this process (their first process is tied to
/// it), and runs are left as they are, resumable.
pub(crate) async fn stop_on_signals(
    stop: baton_engine::cancel::CancelToken,
    stopping: &str,
    exiting: &str,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) =
        (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("{stopping}");
    stop.cancel();
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("{exiting}");
    std::process::exit(130);
}

/// The approval requests a run waits for, as JSON.
fn open_approvals(state: &baton_engine::RunState) -> Value {
    state
        .open_approvals()
        .map(|p| {
            json!({
                "request_id": p.request.request_id,
                "level_id": p.level_id,
                "approver_role": p.request.approver_role,
                "question": p.request.question,
                "schema": p.request.schema,
            })
        })
        .collect()
}

/// One line per approval request a run waits for: id, level, prompt summary, command.
fn waiting_lines(state: &baton_engine::RunState, run_id: &str) -> Vec<String> {
    state
        .open_approvals()
        .map(|p| {
            let deadline = p.request.deadline.map_or(String::new(), |d| {
                format!(" (decide by {}, or it times out)", d.format("%Y-%m-%d %H:%M:%S UTC"))
            });
            escape::one_line(&format!(
                "approval {} (level `{}`, role {}): {} — `baton approve {run_id} --request {}`{deadline}",
                p.request.request_id,
                p.level_id,
                p.request.approver_role,
                baton_engine::exec::summary(&p.request.question),
                p.request.request_id
            ))
        })
        .collect()
}

/// How often a follower looks for new events.
const FOLLOW_POLL: Duration = Duration::from_millis(50);

fn print_event(e: &Event, as_json: bool) -> std::io::Result<()> {
    if as_json {
        outln!("{}", timeline::json_line(e))?;
    } else if let Some(line) = timeline::line(e) {
        outln!("{}", timeline::styled(&line))?;
    }
    Ok(())
}

/// An event of a run `depth` levels below the job's first: a timeline line indented by
/// its depth, or — with `run_id` — a JSON line naming its run.
/// A timeline line at its depth in the tree; a nested run's lines begin with the start of
/// its id, since the runs of a wave print side by side.
fn print_timeline(e: &Event, depth: usize, run_id: &str) -> std::io::Result<()> {
    let Some(line) = timeline::line(e) else { return Ok(()) };
    if depth == 0 {
        return outln!("{}", timeline::styled(&line));
    }
    let short: String = run_id.chars().take(8).collect();
    outln!("{}{short} {}", "    ".repeat(depth), timeline::styled(&line))
}

/// An event as a JSON line naming its run.
fn print_json_line(e: &Event, run_id: &str) -> std::io::Result<()> {
    let mut line: Value = serde_json::from_str(&timeline::json_line(e)).unwrap_or_default();
    if let Value::Object(map) = &mut line {
        map.insert("run_id".to_owned(), json!(run_id));
    }
    outln!("{line}")
}

/// A run whose events a follower emits, from `after` on.
pub(crate) struct Followed {
    run_id: String,
    after: u64,
    depth: usize,
    /// Its end has been emitted.
    done: bool,
}

impl Followed {
    pub(crate) fn new(run_id: &str, after: u64, depth: usize) -> Self {
        Followed { run_id: run_id.to_owned(), after, depth, done: false }
    }
}

/// Emits the events of a run and of the runs it starts, after each one's `after`, as
/// they arrive, until the first run ends or — with `stop` — until told to stop; then it
/// reads the logs once more, so every event written before the stop is emitted, once and
/// in order. A child's events come right after the event that started it, and all of them
/// before its parent's `child_run_settled`. It stops early, quietly, once standard
/// output's reader has gone (nothing it emits could be read).
async fn follow(
    store: &dyn EventStore,
    mut runs: Vec<Followed>,
    nested: bool,
    mut stop: Option<oneshot::Receiver<()>>,
    mut emit: impl FnMut(&str, usize, &Event) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let mut stopping = false;
    loop {
        // Whether a parent's log stopped at a child's settlement that must come first.
        let mut held_back = false;
        let mut emitted = 0;
        let mut i = 0;
        while i < runs.len() {
            if runs[i].done {
                i += 1;
                continue;
            }
            let events = match store.load(&runs[i].run_id, runs[i].after).await {
                Ok(events) => events,
                // A new run is written with its first level's results: wait for it (and a
                // run that failed before it was written has nothing to show).
                Err(baton_engine::store::Error::NotFound(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            // A run followed from its end (it had ended before) has no end left to emit —
            // once the record says it ended with nothing past what was read (it may have
            // ended between the read above and this look).
            if events.is_empty()
                && let Some(record) = store.run(&runs[i].run_id).await?
                && is_final(&record.status)
                && record.last_seq <= runs[i].after
            {
                runs[i].done = true;
            }
            emitted += events.len();
            for e in &events {
                if let EventData::ChildRunSettled(c) = &e.data
                    && runs.iter().any(|r| r.run_id == c.child_run_id && !r.done)
                {
                    held_back = true;
                    break;
                }
                emit(&runs[i].run_id, runs[i].depth, e)?;
                if crate::out::closed() {
                    return Ok(());
                }
                runs[i].after = e.seq;
                if let EventData::ChildRunStarted(c) = &e.data
                    && nested
                    && !runs.iter().any(|r| r.run_id == c.child_run_id)
                {
                    let depth = runs[i].depth + 1;
                    runs.push(Followed::new(&c.child_run_id, 0, depth));
                }
                if matches!(e.data, EventData::ScenarioFinished(_)) {
                    runs[i].done = true;
                }
            }
            i += 1;
        }
        if runs.first().is_none_or(|r| r.done) {
            return Ok(());
        }
        if held_back && emitted > 0 {
            continue;
        }
        if stopping {
            if !held_back {
                return Ok(());
            }
            tokio::time::sleep(FOLLOW_POLL).await;
            continue;
        }
        match stop.as_mut() {
            // A sent stop and a dropped sender both mean: read to the end, then stop.
            Some(rx) => tokio::select! {
                _ = rx => stopping = true,
                () = tokio::time::sleep(FOLLOW_POLL) => {}
            },
            None => tokio::time::sleep(FOLLOW_POLL).await,
        }
    }
}

/// Whether a listed status is a run's end.
pub(crate) fn is_final(status: &str) -> bool {
    [Status::Completed, Status::Aborted, Status::Cancelled, Status::Failed]
        .iter()
        .any(|s| s.as_str() == status)
}

/// A task printing a tree's events while another drives it.
struct Printer {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Printer {
    fn spawn(
        store: Arc<dyn EventStore>,
        runs: Vec<Followed>,
        emit: impl FnMut(&str, usize, &Event) -> std::io::Result<()> + Send + 'static,
    ) -> Printer {
        let (stop, stopped) = oneshot::channel();
        let task =
            tokio::spawn(
                async move { follow(store.as_ref(), runs, true, Some(stopped), emit).await },
            );
        Printer { stop, task }
    }

    /// Stops the printer once it has emitted every event in the store, and waits for it.
    async fn finish(self) -> anyhow::Result<()> {
        // The task may have ended already (at the end of the run): nobody to tell then.
        let _ = self.stop.send(());
        self.task.await.map_err(|e| anyhow::anyhow!("the event printer stopped: {e}"))?
    }
}

fn exit_code(outcome: &Outcome) -> ExitCode {
    match outcome {
        // A job whose tree waits on a child some other process drives is, here, paused.
        Outcome::Paused | Outcome::Waiting => ExitCode::from(3),
        Outcome::Interrupted(_) => ExitCode::from(6),
        Outcome::Finished(Status::Completed) => ExitCode::SUCCESS,
        Outcome::Finished(Status::Aborted) => ExitCode::from(4),
        Outcome::Finished(Status::Cancelled) => ExitCode::from(5),
        Outcome::Finished(_) => ExitCode::from(1),
    }
}

/// Options of `baton approve`.
#[derive(Debug)]
pub(crate) struct Decision {
    pub request: Option<String>,
    pub reject: bool,
    pub comment: Option<String>,
    pub by: Option<String>,
    /// A file with the approver's data for the level's `output_schema`.
    pub data: Option<PathBuf>,
    pub script: Option<PathBuf>,
    pub no_resume: bool,
}

/// Reads the approver's data: a regular file of at most [`DATA_BYTES_MAX`] bytes holding JSON.
fn read_data(path: &Path) -> anyhow::Result<Value> {
    let shown = path.display();
    let bytes = baton_scenario::capped::read_bytes(path, DATA_BYTES_MAX)
        .map_err(|e| anyhow::anyhow!("--data: {e}"))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("--data {shown}:{}:{}: not JSON: {e}", e.line(), e.column()))
}

/// An engine that records decisions and answers: it needs no scenario, so it works from a
/// directory where the scenarios do not load.
async fn decision_engine(place: &Place) -> anyhow::Result<Engine> {
    let store = open_existing_store(place).await?;
    Ok(probe_engine(place, &store, &Registry::default()))
}

/// An engine for actions on a wave: the existing store, and the configuration's wave
/// settings (its default `max_parallel`).
pub(crate) async fn wave_engine(place: &Place) -> anyhow::Result<Engine> {
    let store = open_existing_store(place).await?;
    let jobs = jobs(place, Arc::new(Registry::default()), None, WaveDrive::default())?;
    Ok(engine(
        store,
        Arc::new(ScriptedModel::default()),
        &Registry::default(),
        workspace_setup(place, None, None),
        redactor(place),
        jail(place),
        Some(Arc::new(jobs)),
    ))
}

/// Continues a run after a decision or an answer was recorded, on the scenario version it
/// started with; when that cannot be loaded here, says why and how to continue it (exit 0:
/// what was asked is recorded).
async fn continue_run(
    place: &Place,
    run_id: &str,
    script: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let probe = decision_engine(place).await?;
    let state = probe.state(run_id).await?;
    if let Err(e) = run_scenario(place, &probe, &state, run_id).await {
        eprintln!(
            "the run is not continued here: {}; continue it with `baton resume {run_id}` once that is fixed",
            escape::terminal_safe(&format!("{e:#}"), escape::Layout::Block)
        );
        return Ok(ExitCode::SUCCESS);
    }
    resume(place, run_id, script, false, false, WaveDrive::default()).await
}

pub(crate) async fn approve(place: &Place, run_id: &str, d: Decision) -> anyhow::Result<ExitCode> {
    let data = d.data.as_deref().map(read_data).transpose()?;
    let engine = decision_engine(place).await?;
    let decision = baton_engine::Decision {
        request_id: d.request,
        approved: !d.reject,
        comment: d.comment,
        by: d.by,
        data,
    };
    let decided = engine.decide(run_id, decision).await?;
    outln!(
        "{} request {} of run {run_id}",
        if decided.approved { "approved" } else { "rejected" },
        escape::one_line(&decided.request_id)
    )?;
    if d.no_resume {
        return Ok(ExitCode::SUCCESS);
    }
    continue_run(place, run_id, d.script.as_deref()).await
}

pub(crate) async fn answer(
    place: &Place,
    run_id: &str,
    answer: &str,
    script: Option<&Path>,
    no_resume: bool,
) -> anyhow::Result<ExitCode> {
    let value: Value = serde_json::from_str(answer).with_context(|| {
        format!("--answer must be JSON (a string needs quotes: '\"yes\"'), got {answer}")
    })?;
    let engine = decision_engine(place).await?;
    engine.answer(run_id, value).await?;
    outln!("answered run {run_id}")?;
    if no_resume {
        return Ok(ExitCode::SUCCESS);
    }
    continue_run(place, run_id, script).await
}

/// Refuses a `--by` or `--reason` given empty.
pub(crate) fn check_who_and_why(by: Option<&str>, reason: Option<&str>) -> anyhow::Result<()> {
    for (flag, value) in [("--by", by), ("--reason", reason)] {
        if value.is_some_and(|v| v.trim().is_empty()) {
            bail!("{flag} is empty; give a value or leave the flag out");
        }
    }
    Ok(())
}

/// Records a cancel and ends the run here when nobody drives it. Needs no scenario: the
/// end of a cancelled run reads nothing from it, so a broken or changed scenarios
/// directory never keeps a run from being stopped.
pub(crate) async fn cancel(
    place: &Place,
    run_id: &str,
    by: Option<String>,
    reason: Option<String>,
) -> anyhow::Result<ExitCode> {
    check_who_and_why(by.as_deref(), reason.as_deref())?;
    let store = open_existing_store(place).await?;
    // The settle timeout of the configuration when it loads; a broken configuration never
    // keeps a run from being stopped.
    let probe = engine(
        Arc::clone(&store),
        Arc::new(ScriptedModel::default()),
        &Registry::default(),
        workspace_setup(place, None, None),
        redactor(place),
        jail(place),
        jobs(place, Arc::new(Registry::default()), None, WaveDrive::default()).ok().map(Arc::new),
    );
    let Some(record) = store.run(run_id).await? else {
        bail!("no run {run_id} in {}", place.db_shown());
    };
    // The run and every run below it that has not ended.
    probe.cancel_tree(run_id, by, reason).await?;
    match probe.end_cancelled_tree(run_id).await {
        Ok(_) => outln!("cancelled run {run_id}")?,
        Err(baton_engine::exec::Error::Store(baton_engine::store::Error::Busy(_))) => outln!(
            "cancel requested for run {run_id}: the process driving it stops at its next check"
        )?,
        Err(e) => return Err(e.into()),
    }
    // A child's parent takes its result now; `baton resume` continues the parent.
    if let Some(parent) = &record.parent_run_id {
        probe.settle_children(parent).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// How the run list shows a run whose status is `running` and that no process drives
/// (its driver died, or it stopped for a transient reason): `baton resume RUN` continues it.
pub(crate) const INTERRUPTED: &str = Status::Interrupted.as_str();

/// Every status a run can have in the run list (`runs --status`): the stored ones, and
/// [`INTERRUPTED`].
pub(crate) fn run_statuses() -> [&'static str; 8] {
    [
        Status::Running.as_str(),
        Status::Paused.as_str(),
        Status::Waiting.as_str(),
        Status::Interrupted.as_str(),
        Status::Completed.as_str(),
        Status::Aborted.as_str(),
        Status::Cancelled.as_str(),
        Status::Failed.as_str(),
    ]
}

/// A level a paused run waits on, and for what.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
struct Waiting {
    level_id: String,
    /// `approval` or `answer`.
    #[serde(rename = "for")]
    wants: &'static str,
}

/// The approvals and questions of a log that nobody has decided or answered yet, in the
/// order they were asked.
fn waiting_on(events: &[Event]) -> Vec<Waiting> {
    let mut open: Vec<(&str, Waiting)> = Vec::new();
    for e in events {
        let level_id = e.level_id.clone().unwrap_or_default();
        match &e.data {
            EventData::ApprovalRequested(a) => {
                open.push((&a.request_id, Waiting { level_id, wants: "approval" }));
            }
            EventData::AskUser(a) => open.push((&a.call_id, Waiting { level_id, wants: "answer" })),
            EventData::ApprovalDecided(d) => {
                open.retain(|(id, w)| !(w.wants == "approval" && *id == d.request_id));
            }
            EventData::UserAnswered(a) => {
                open.retain(|(id, w)| !(w.wants == "answer" && *id == a.call_id));
            }
            // A level that ended no longer waits (a cancel closes it as skipped).
            EventData::LevelFinished(_) => open.retain(|(_, w)| w.level_id != level_id),
            EventData::ScenarioFinished(_) => open.clear(),
            _ => {}
        }
    }
    open.into_iter().map(|(_, w)| w).collect()
}

/// A duration as people read it: `850 ms`, `12.4 s`, `3 min 05 s`, `2 h 10 min`.
fn human_duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {:02} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {:02} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

pub(crate) async fn runs(
    place: &Place,
    status: Option<&str>,
    tree: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    // A run is interrupted when its status is running and nobody holds it.
    // (A waiting run nobody drives is interrupted too: it is found among all of them.)
    let stored = if status == Some(INTERRUPTED) { None } else { status };
    let mut list = Vec::new();
    for mut record in store.runs(stored).await? {
        if record.status == Status::Running.as_str() && !store.is_held(&record.run_id).await? {
            record.status = INTERRUPTED.to_owned();
        }
        let maybe_interrupted =
            status == Some(INTERRUPTED) && record.status == Status::Waiting.as_str();
        if status.is_none_or(|s| s == record.status) || maybe_interrupted {
            list.push(record);
        }
    }
    let list = if tree { as_tree(list) } else { list.into_iter().map(|r| (r, 0)).collect() };
    let mut rows = Vec::with_capacity(list.len());
    for (mut record, depth) in list {
        let events = store.load(&record.run_id, 0).await?;
        let state = baton_engine::state::fold(&events);
        if record.status == Status::Waiting.as_str()
            && !tree_is_live(store.as_ref(), &state).await?
        {
            record.status = INTERRUPTED.to_owned();
        }
        let paused = record.status == Status::Paused.as_str();
        let mut waiting = if paused { waiting_on(&events) } else { Vec::new() };
        if let Some(w) = manual_wave(&state) {
            let c = w.counts();
            waiting.push(Waiting {
                level_id: format!(
                    "{} ({} planned, {} in flight)",
                    w.level_id, c.planned, c.in_flight
                ),
                wants: "outside agents",
            });
        }
        // A run waiting for its children waits on each of them.
        for child in state.open_children() {
            waiting.push(Waiting {
                level_id: format!("{} ({})", child.started.child_run_id, child.started.scenario_id),
                wants: "child run",
            });
        }
        // The approval requests a paused run waits for, by id (for `approve --request`).
        let requests: Vec<String> = if paused {
            state.open_approvals().map(|p| p.request.request_id.clone()).collect()
        } else {
            Vec::new()
        };
        if status.is_some_and(|s| s != record.status) {
            continue;
        }
        rows.push((record, depth, state.totals, waiting, requests));
    }
    if json {
        let mut list = Vec::with_capacity(rows.len());
        for (record, depth, totals, waiting, requests) in &rows {
            let mut row = serde_json::to_value(record)?;
            if let Value::Object(map) = &mut row {
                map.insert("cost_usd".to_owned(), json!(totals.cost_usd));
                map.insert("tokens".to_owned(), json!(totals.tokens));
                map.insert("duration_ms".to_owned(), json!(totals.duration_ms));
                map.insert("waiting_on".to_owned(), serde_json::to_value(waiting)?);
                map.insert("pending_requests".to_owned(), json!(requests));
                if tree {
                    map.insert("depth".to_owned(), json!(depth));
                }
                if record.status == INTERRUPTED {
                    let resume = format!("baton resume {}", record.run_id);
                    map.insert("continue_with".to_owned(), json!(resume));
                }
            }
            list.push(row);
        }
        outln!("{}", serde_json::to_string_pretty(&list)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        outln!("no runs{}", status.map_or(String::new(), |s| format!(" with status {s}")))?;
        return Ok(ExitCode::SUCCESS);
    }
    let width = 36 + rows.iter().map(|(_, d, ..)| d * 2).max().unwrap_or(0);
    outln!(
        "{:<width$}  {:<11} {:<22} {:>9} {:>9} {:>12}  {:<19}  waits on",
        "run",
        "status",
        "scenario",
        "cost",
        "tokens",
        "duration",
        "updated"
    )?;
    for (r, depth, totals, waiting, requests) in rows {
        let waits: Vec<String> =
            waiting.iter().map(|w| format!("{} ({})", w.level_id, w.wants)).collect();
        let row = format!(
            "{:<width$}  {:<11} {:<22} {:>9} {:>9} {:>12}  {:<19}  {}",
            format!("{}{}", "  ".repeat(depth), r.run_id),
            r.status,
            r.scenario_id,
            format!("${:.4}", totals.cost_usd),
            totals.tokens,
            human_duration(totals.duration_ms),
            r.updated_at.format("%Y-%m-%d %H:%M:%S"),
            waits.join(", ")
        );
        outln!("{}", escape::one_line(&row))?;
        if !requests.is_empty() {
            outln!("    waits for approval: {}", escape::one_line(&requests.join(", ")))?;
        }
        if r.status == INTERRUPTED {
            outln!("    no process drives it; continue it with `baton resume {}`", r.run_id)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a waiting run's tree is going on: one of its open children is driven, waits
/// for a person, or waits for children of its own that are. A waiting run whose children
/// are missing, ended or undriven waits for nothing: its driver died.
async fn tree_is_live(
    store: &dyn EventStore,
    state: &baton_engine::RunState,
) -> anyhow::Result<bool> {
    // A manual wave waits for outside agents, not for a driver.
    if manual_wave(state).is_some() {
        return Ok(true);
    }
    let mut pending: Vec<String> =
        state.open_children().map(|c| c.started.child_run_id.clone()).collect();
    // Bounded by the chain's depth and the children a run records.
    let mut looked = 0;
    while let Some(id) = pending.pop() {
        looked += 1;
        if looked > 1_000 {
            return Ok(true);
        }
        let Some(record) = store.run(&id).await? else { continue };
        if record.status == Status::Paused.as_str() || store.is_held(&id).await? {
            return Ok(true);
        }
        if record.status == Status::Waiting.as_str() {
            let child = baton_engine::state::fold(&store.load(&id, 0).await?);
            pending.extend(child.open_children().map(|c| c.started.child_run_id.clone()));
        }
    }
    Ok(false)
}

/// The manual wave a run is at, if it waits for outside agents.
fn manual_wave(state: &baton_engine::RunState) -> Option<&baton_engine::wave::WaveState> {
    baton_engine::wave_actions::wave_under_way(state).filter(|w| w.plan.is_manual())
}

/// Runs ordered as trees: each run whose parent is not listed, newest first, then the
/// runs below it, depth first, each with its depth under the first.
fn as_tree(
    list: Vec<baton_engine::store::RunRecord>,
) -> Vec<(baton_engine::store::RunRecord, usize)> {
    let listed: std::collections::HashSet<String> = list.iter().map(|r| r.run_id.clone()).collect();
    let mut below: std::collections::HashMap<String, Vec<baton_engine::store::RunRecord>> =
        std::collections::HashMap::new();
    let mut tops = Vec::new();
    for r in list {
        match r.parent_run_id.clone().filter(|p| listed.contains(p)) {
            Some(parent) => below.entry(parent).or_default().push(r),
            None => tops.push(r),
        }
    }
    let mut out = Vec::new();
    let mut pending: Vec<(baton_engine::store::RunRecord, usize)> =
        tops.into_iter().rev().map(|r| (r, 0)).collect();
    while let Some((r, depth)) = pending.pop() {
        if let Some(mut children) = below.remove(&r.run_id) {
            // The list is newest first; children read in the order they started.
            children.reverse();
            pending.extend(children.into_iter().rev().map(|c| (c, depth + 1)));
        }
        out.push((r, depth));
    }
    out
}

pub(crate) async fn export_cassette(
    place: &Place,
    run_id: &str,
    out: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    if store.run(run_id).await?.is_none() {
        bail!("no run {run_id} in {}", place.db_shown());
    }
    let cassette = cassette::from_events(&store.load(run_id, 0).await?);
    match out {
        Some(path) => {
            cassette.save(path).map_err(anyhow::Error::msg)?;
            outln!("wrote {} recorded answers to {}", cassette.entries.len(), path.display())?;
        }
        None => outln!("{}", serde_json::to_string_pretty(&cassette)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn events(
    place: &Place,
    run_id: &str,
    follow_on: bool,
    tree: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    if store.run(run_id).await?.is_none() {
        bail!("no run {run_id} in {}", place.db_shown());
    }
    if tree {
        // Each run's events with those of the runs it started nested under the event that
        // started each; read once (closed at once) unless following.
        let (stop, stopped) = oneshot::channel();
        if !follow_on {
            let _ = stop.send(());
        }
        let runs = vec![Followed::new(run_id, 0, 0)];
        follow(store.as_ref(), runs, true, Some(stopped), |id, depth, e| {
            if json { print_json_line(e, id) } else { print_timeline(e, depth, id) }
        })
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    if follow_on {
        let runs = vec![Followed::new(run_id, 0, 0)];
        follow(store.as_ref(), runs, false, None, |_, _, e| print_event(e, json)).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let log = store.load(run_id, 0).await?;
    for e in &log {
        print_event(e, json)?;
    }
    if !json {
        for line in waiting_lines(&baton_engine::fold(&log), run_id) {
            outln!("waiting   {line}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use baton_engine::event::{
        ApprovalDecided, ApprovalRequested, AskUser, LevelStarted, NewEvent, UserAnswered, Warning,
    };
    use baton_engine::store::{MemoryStore, RunRecord};
    use chrono::Utc;

    use super::*;

    fn warning(seq: u64) -> Event {
        NewEvent::run(EventData::Warning(Warning { message: format!("w{seq}") }))
            .at(seq, Utc::now())
    }

    #[tokio::test]
    async fn the_printer_emits_every_event_written_before_it_is_stopped_once_and_in_order() {
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::default());
        let now = Utc::now();
        let record = RunRecord {
            run_id: "r".to_owned(),
            scenario_id: "s".to_owned(),
            status: "running".to_owned(),
            created_at: now,
            updated_at: now,
            last_seq: 0,
            parent_run_id: None,
            root_run_id: None,
            idempotency_key: None,
            tenant: None,
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        // Started before the run exists, as `baton run` does.
        let printer =
            Printer::spawn(Arc::clone(&store), vec![Followed::new("r", 0, 0)], move |_, _, e| {
                sink.lock().unwrap().push(e.seq);
                Ok(())
            });
        store.create_run(&record, vec![warning(1)]).await.unwrap();
        while seen.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // Written while the printer sleeps between polls, then stopped at once.
        store.append("r", 2, vec![warning(2), warning(3)], "running").await.unwrap();
        store.append("r", 4, vec![warning(4)], "paused").await.unwrap();
        printer.finish().await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_printer_stopped_before_its_run_was_written_emits_nothing() {
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::default());
        let runs = vec![Followed::new("never", 0, 0)];
        let printer = Printer::spawn(store, runs, |_, _, _| panic!("nothing to print"));
        printer.finish().await.unwrap();
    }

    fn at(seq: u64, level: &str, data: EventData) -> Event {
        NewEvent::level(level, 1, data).at(seq, Utc::now())
    }

    #[test]
    fn a_run_waits_on_the_approvals_and_questions_nobody_has_answered() {
        let started = |seq, level: &str| {
            at(
                seq,
                level,
                EventData::LevelStarted(LevelStarted {
                    role: "r".to_owned(),
                    kind: "k".to_owned(),
                    parent: None,
                }),
            )
        };
        let approval = |seq, level: &str, id: &str| {
            at(
                seq,
                level,
                EventData::ApprovalRequested(ApprovalRequested {
                    request_id: id.to_owned(),
                    approver_role: "lead".to_owned(),
                    question: "ok?".to_owned(),
                    schema: Value::Null,
                    deadline: None,
                }),
            )
        };
        let decided = |seq, id: &str| {
            NewEvent::run(EventData::ApprovalDecided(ApprovalDecided {
                request_id: id.to_owned(),
                approved: false,
                comment: None,
                by: None,
                data: None,
                timed_out: false,
            }))
            .at(seq, Utc::now())
        };
        let ask = at(
            5,
            "ask",
            EventData::AskUser(AskUser { call_id: "c1".to_owned(), question: json!("which?") }),
        );
        let mut log = vec![started(1, "gate"), approval(2, "gate", "a1")];
        let waits = |log: &[Event]| -> Vec<(String, &'static str)> {
            waiting_on(log).into_iter().map(|w| (w.level_id, w.wants)).collect()
        };
        assert_eq!(waits(&log), [("gate".to_owned(), "approval")]);
        log.push(decided(3, "a1"));
        assert!(waits(&log).is_empty());
        // A request decided under another id does not answer this one.
        log.push(approval(4, "gate", "a2"));
        log.push(ask);
        assert_eq!(waits(&log), [("gate".to_owned(), "approval"), ("ask".to_owned(), "answer")]);
        log.push(
            NewEvent::run(EventData::UserAnswered(UserAnswered {
                call_id: "c1".to_owned(),
                answer: json!("b"),
            }))
            .at(6, Utc::now()),
        );
        assert_eq!(waits(&log), [("gate".to_owned(), "approval")]);
        log.push(decided(7, "other"));
        assert_eq!(waits(&log), [("gate".to_owned(), "approval")]);
    }

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

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(human_duration(850), "850 ms");
        assert_eq!(human_duration(12_400), "12.4 s");
        assert_eq!(human_duration(185_000), "3 min 05 s");
        assert_eq!(human_duration(7_800_000), "2 h 10 min");
    }

    #[test]
    fn the_statuses_runs_accepts_are_the_ones_runs_have() {
        let statuses = run_statuses();
        for s in [Status::Running, Status::Paused, Status::Completed, Status::Cancelled] {
            assert!(statuses.contains(&s.as_str()));
        }
        assert!(!statuses.contains(&Status::New.as_str()), "a run is listed once it started");
        assert!(statuses.contains(&INTERRUPTED));
    }
}

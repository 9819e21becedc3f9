//! What a job is made of before an engine drives it: the scenarios it can reach
//! ([`Jobs`]), how one is selected ([`select`]) and chained ([`chain_target`]), what a
//! scenario needs (programs, a workspace) and the jail pre-check over everything a job can
//! reach, child run ids, and the start of a run ([`Start`], [`caps`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_scenario::model::{LevelKind, Uses};
use baton_scenario::{Registry, Scenario};
use serde_json::{Map, Value};

use crate::event::{BudgetCaps, ParentLink, ScenarioSelected};
use crate::limits::{SETTLE_TIMEOUT_S_DEFAULT, SETTLE_TIMEOUT_S_MAX};

/// How jobs pick their scenario (`[selection]` in `baton.toml`).
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// The scenario of a job that names nothing else, and of one whose route is unknown.
    pub default: String,
    /// Where a chain goes when its route names no scenario, and where a classified job
    /// goes when the classifier gives no usable route.
    pub fallback: String,
    /// The classifier scenario, for jobs of the kinds in `classify_kinds`.
    pub classifier: String,
    pub classify_kinds: Vec<String>,
}

impl Default for Selection {
    /// The reference's: `code_build` by default, `quick_qa` as the fallback, the
    /// `intent_classifier` for `task` jobs.
    fn default() -> Self {
        Selection {
            default: "code_build".to_owned(),
            fallback: "quick_qa".to_owned(),
            classifier: "intent_classifier".to_owned(),
            classify_kinds: vec!["task".to_owned()],
        }
    }
}

/// What a job asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobRequest {
    /// A scenario id: the job runs exactly it.
    pub pin: Option<String>,
    /// An intent route, looked up case-insensitively.
    pub intent: Option<String>,
    /// The job's kind (`task`, `question`, …).
    pub kind: Option<String>,
}

/// Where jobs find the scenarios they select and chain to, and how long a parent's end
/// waits for its children.
#[derive(Debug)]
pub struct Jobs {
    registry: std::sync::RwLock<Arc<Registry>>,
    /// Reloads the scenarios when their files change, for a process that lives longer
    /// than the files stay as they are; none keeps the registry it was given.
    reload: Option<Reload>,
    pub selection: Selection,
    /// The scenarios directory, where a stored version finds its seed directory.
    pub scenarios_dir: PathBuf,
    /// How long the end of a parent waits for its cancelled children to settle.
    pub settle_timeout: Duration,
    /// How waves are dispatched.
    pub waves: crate::wave_drive::WaveSettings,
    /// For a replay: the order the recording settled each wave's workers in.
    pub settle_order: Option<Arc<crate::replay::SettleOrder>>,
}

/// How [`Jobs`] reloads: the directory's handle, and the tenant's overrides to merge over
/// what it loads.
#[derive(Debug)]
struct Reload {
    handle: baton_scenario::RegistryHandle,
    tenant: Option<(String, Vec<baton_scenario::registry::Override>)>,
}

/// `run_interrupted.cause` when a chain found no scenario to go to (the scenarios did not
/// load, or the fallback is not among them).
pub const CAUSE_SCENARIOS: &str = "scenarios";

/// Longest text of a reload's diagnostics kept in the warning that records them.
const RELOAD_DIAGNOSTICS_BYTES_MAX: usize = 8 * 1024;

impl Jobs {
    /// Jobs over `registry`, which stays as it is.
    pub fn new(
        registry: Arc<Registry>,
        selection: Selection,
        scenarios_dir: PathBuf,
        settle_timeout: Duration,
    ) -> Self {
        Jobs {
            registry: std::sync::RwLock::new(registry),
            reload: None,
            selection,
            scenarios_dir,
            settle_timeout,
            waves: crate::wave_drive::WaveSettings::default(),
            settle_order: None,
        }
    }

    /// Settles waves' workers in a recording's order (a replay's jobs).
    #[must_use]
    pub fn settling_as(mut self, order: Arc<crate::replay::SettleOrder>) -> Self {
        self.settle_order = Some(order);
        self
    }

    /// Dispatches waves with these settings.
    #[must_use]
    pub fn with_waves(mut self, waves: crate::wave_drive::WaveSettings) -> Self {
        self.waves = waves;
        self
    }

    /// Reloads the scenarios through `handle` when their files change (merging a tenant's
    /// overrides over them), keeping the last registry that loaded.
    #[must_use]
    pub fn reloading(
        mut self,
        handle: baton_scenario::RegistryHandle,
        tenant: Option<(String, Vec<baton_scenario::registry::Override>)>,
    ) -> Self {
        self.reload = Some(Reload { handle, tenant });
        self
    }

    /// The scenarios as of now.
    pub fn registry(&self) -> Arc<Registry> {
        match self.registry.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Reloads when a file changed: `None` when nothing did (or nothing reloads), else the
    /// diagnostics of the new load — `Ok` when it replaced the registry (its warnings), `Err`
    /// when it did not load and the last good one stays.
    pub fn refresh(&self) -> Option<Result<String, String>> {
        let reload = self.reload.as_ref()?;
        let loaded = match reload.handle.refresh_if_changed()? {
            Ok(warnings) => warnings,
            Err(e) => return Some(Err(e.diagnostics.render())),
        };
        let fresh = reload.handle.current();
        let merged = match &reload.tenant {
            None => fresh,
            Some((tenant, overrides)) => match fresh.with_overrides(tenant, overrides) {
                Ok(l) => Arc::new(l.registry),
                Err(e) => return Some(Err(e.diagnostics.render())),
            },
        };
        match self.registry.write() {
            Ok(mut g) => *g = merged,
            Err(poisoned) => *poisoned.into_inner() = merged,
        }
        Some(Ok(loaded.render()))
    }
}

/// Checks a settle timeout given in seconds: more than zero, at most
/// [`SETTLE_TIMEOUT_S_MAX`]; `None` is the default.
pub fn settle_timeout(seconds: Option<f64>) -> Result<Duration, String> {
    let s = seconds.unwrap_or(SETTLE_TIMEOUT_S_DEFAULT);
    if !s.is_finite() || s <= 0.0 || s > SETTLE_TIMEOUT_S_MAX {
        return Err(format!(
            "the settle timeout must be more than 0 and at most {SETTLE_TIMEOUT_S_MAX} seconds, not {s}"
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Picks a job's scenario: the pin, else the intent route, else the classifier for the
/// configured kinds, else the default. A route nobody serves falls back to the default
/// with a warning on the selection (a misrouted job never breaks); an unknown pin is an
/// error when `strict_pin` (a scenario id typed by a person must not start a paid default),
/// else it falls back the same way.
pub fn select(
    registry: &Registry,
    selection: &Selection,
    job: &JobRequest,
    strict_pin: bool,
) -> Result<(Arc<Scenario>, ScenarioSelected), String> {
    let chosen = |scenario: &Arc<Scenario>, how: &str, warning: Option<String>| {
        (
            Arc::clone(scenario),
            ScenarioSelected {
                scenario_id: scenario.id.clone(),
                how: how.to_owned(),
                pin: job.pin.clone(),
                intent: job.intent.clone(),
                kind: job.kind.clone(),
                warning,
            },
        )
    };
    let default = |warning: Option<String>| match registry.get(&selection.default) {
        Some(s) => Ok(chosen(s, "default", warning)),
        None => Err(format!(
            "{}the default scenario `{}` is not among the scenarios ({}); set `[selection] default` in baton.toml to one of them",
            warning.map(|w| format!("{w}, and ")).unwrap_or_default(),
            selection.default,
            known(registry)
        )),
    };
    if let Some(pin) = &job.pin {
        return match registry.get(pin) {
            Some(s) => Ok(chosen(s, "pin", None)),
            None if strict_pin => Err(unknown_scenario(registry, pin)),
            None => default(Some(format!("no scenario `{pin}`; the job runs the default"))),
        };
    }
    if let Some(intent) = &job.intent {
        return match registry.by_route(intent) {
            Some(s) => Ok(chosen(s, "intent", None)),
            None => default(Some(format!(
                "no scenario serves intent route `{intent}` (routes: {}); the job runs the default",
                routes(registry)
            ))),
        };
    }
    if let Some(kind) = &job.kind
        && selection.classify_kinds.iter().any(|k| k.eq_ignore_ascii_case(kind))
    {
        return match registry.get(&selection.classifier) {
            Some(s) => Ok(chosen(s, "classifier", None)),
            None => default(Some(format!(
                "jobs of kind `{kind}` go to the classifier `{}`, which is not among the scenarios",
                selection.classifier
            ))),
        };
    }
    default(None)
}

/// The first scenario, among `scenario` and the worker scenarios of its waves (and of
/// theirs, transitively, as `registry` has them), whose runs start programs: what a job
/// that starts there can reach before any route is chosen. Its fan-out children are levels
/// of the same scenarios, so they are covered; a chain is checked when it is decided.
pub fn starting_programs(registry: &Registry, scenario: &Arc<Scenario>) -> Option<Arc<Scenario>> {
    let mut seen = std::collections::HashSet::new();
    let mut pending = vec![Arc::clone(scenario)];
    while let Some(s) = pending.pop() {
        if !seen.insert(s.id.clone()) {
            continue;
        }
        if starts_programs(&s) {
            return Some(s);
        }
        for level in &s.levels {
            if let baton_scenario::LevelKind::Wave(w) = &level.kind
                && let Some(worker) = w.worker.as_deref().and_then(|id| registry.get(id))
            {
                pending.push(Arc::clone(worker));
            }
        }
    }
    None
}

/// Why a job starting at `scenario` cannot run here: it reaches a scenario that starts
/// programs (see [`starting_programs`]) and the verifiers that would start them say they
/// cannot (their jail cannot be set up). None when it can run, the jail being off
/// included (a run says that on its own).
pub fn program_refusal(
    verifiers: &crate::verifier::Verifiers,
    registry: &Registry,
    scenario: &Arc<Scenario>,
) -> Option<String> {
    programs_refused(registry, scenario, |starting| {
        program_uses(starting).find_map(|uses| verifiers.refusal(uses))
    })
}

/// Why a job starting at `scenario` cannot run here, when it reaches a scenario that
/// starts programs ([`starting_programs`]) and `why` says of it why they cannot run.
pub fn programs_refused(
    registry: &Registry,
    scenario: &Arc<Scenario>,
    why: impl FnOnce(&Scenario) -> Option<String>,
) -> Option<String> {
    let starting = starting_programs(registry, scenario)?;
    let why = why(&starting)?;
    Some(if starting.id == scenario.id {
        format!("scenario `{}` runs programs, and {why}", scenario.id)
    } else {
        format!(
            "scenario `{}` starts workers of scenario `{}`, which runs programs, and {why}",
            scenario.id, starting.id
        )
    })
}

/// What to say of a scenario id `registry` does not hold: the closest id when one is near
/// enough to be a typo, and every known id.
pub fn unknown_scenario(registry: &Registry, which: &str) -> String {
    let near = baton_scenario::suggest::closest(which, registry.scenarios().map(|s| s.id.as_str()));
    let shown: String = which.chars().take(crate::limits::ROUTE_CHARS_MAX).collect();
    match near {
        Some(near) => {
            format!("no scenario `{shown}`; did you mean `{near}`? (known: {})", known(registry))
        }
        None => format!("no scenario `{shown}` (known: {})", known(registry)),
    }
}

/// The scenario a chain goes to: the scenario whose id the route is (the classifier names
/// ids), else the one serving the route, else the fallback — with a warning saying why.
/// The classifier itself is never a chain's target.
pub fn chain_target(
    registry: &Registry,
    selection: &Selection,
    route: &str,
) -> Result<(Arc<Scenario>, Option<String>), String> {
    let route = route.trim();
    let found = (!route.is_empty() && route != selection.classifier)
        .then(|| registry.get(route).or_else(|| registry.by_route(route)))
        .flatten();
    if let Some(s) = found {
        return Ok((Arc::clone(s), None));
    }
    let why = if route.is_empty() {
        "no intent route was named".to_owned()
    } else if route == selection.classifier {
        format!("route `{route}` is the classifier itself")
    } else {
        format!("route `{route}` names no scenario (routes: {})", routes(registry))
    };
    match registry.get(&selection.fallback) {
        Some(s) => {
            Ok((Arc::clone(s), Some(format!("{why}; the job goes to the fallback `{}`", s.id))))
        }
        None => Err(format!(
            "{why}, and the fallback scenario `{}` is not among the scenarios ({}); set `[selection] fallback` in baton.toml",
            selection.fallback,
            known(registry)
        )),
    }
}

/// `text` cut to [`RELOAD_DIAGNOSTICS_BYTES_MAX`] bytes, at a character's edge.
pub use crate::run_ids::child_run_id;

pub(crate) fn cut(text: &str) -> String {
    if text.len() <= RELOAD_DIAGNOSTICS_BYTES_MAX {
        return text.to_owned();
    }
    let mut end = RELOAD_DIAGNOSTICS_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

fn known(registry: &Registry) -> String {
    let ids: Vec<&str> = registry.scenarios().map(|s| s.id.as_str()).collect();
    ids.join(", ")
}

fn routes(registry: &Registry) -> String {
    let routes: Vec<&str> = registry.routes().map(|(r, _)| r).collect();
    if routes.is_empty() { "none".to_owned() } else { routes.join(", ") }
}

/// What a new run starts from, beyond its scenario.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Start {
    pub input: String,
    pub metadata: Map<String, Value>,
    /// Where model answers come from, when not the configured providers.
    pub model_source: Option<String>,
    /// How the job's scenario was chosen (a job's root).
    pub selected: Option<ScenarioSelected>,
    /// The cap on what the run and every run it starts may cost together (`--max-cost-usd`
    /// on the job); it narrows the run's own cost cap too.
    pub tree_max_cost_usd: Option<f64>,
    /// For a child: its caps, as its parent recorded them.
    pub budget: Option<BudgetCaps>,
    /// For a child: where it hangs.
    pub parent: Option<ParentLink>,
    /// The job's idempotency key, as its first run claims it: a second job of the tenant
    /// with it (and the same request) gets this run instead, until the claim expires.
    pub idempotency: Option<crate::store::KeyClaim>,
    /// The tenant whose overrides the scenarios were merged with (a child's is its
    /// parent's).
    pub tenant: Option<String>,
    /// For a child: the parent's `child_run_started` seq, after which its creator asks
    /// whether the parent still wants it (none: the parent's whole log is read).
    pub parent_seq: Option<u64>,
    /// For a replay's root: what it replays, recorded right after its start.
    pub replay: Option<crate::event::RunReplayed>,
    /// Start the run under the rule from before failed attempts were routed by edges (a
    /// failure ends the run at once): a replay of a run recorded under it, and a child of a
    /// run started under it.
    pub failures_unrouted: bool,
    /// Where the job waits for a driver (a job's root; its home is the engine's to set).
    pub placement: crate::store::Placement,
}

/// The caps of a new run of `scenario`: its scenario's, narrowed by a tree cap.
pub fn caps(scenario: &Scenario, tree_max_cost_usd: Option<f64>) -> BudgetCaps {
    let own = scenario.budget.max_cost_usd;
    let max_cost_usd = match (own, tree_max_cost_usd) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    BudgetCaps {
        max_cost_usd,
        max_tokens: scenario.budget.max_tokens,
        max_duration_s: scenario.budget.max_duration_s,
        max_level_runs: scenario.budget.max_level_runs,
        tree_max_cost_usd,
    }
}

/// Whether runs of the scenario start programs themselves (which then run in the jail): a
/// verifier that runs one (a build, a scanner, an MCP server) or a wave level's command.
pub fn starts_programs(scenario: &Scenario) -> bool {
    program_uses(scenario).next().is_some()
}

/// The verifiers that start programs in runs of the scenario: those it declares that run
/// one, and `command` for a wave level's command workers (child runs with a command
/// verifier).
fn program_uses(scenario: &Scenario) -> impl Iterator<Item = Uses> + '_ {
    let declared = scenario.levels.iter().flat_map(|l| &l.verifiers).map(|v| v.uses);
    let waves = scenario
        .levels
        .iter()
        .filter(|l| matches!(&l.kind, LevelKind::Wave(w) if w.command.is_some()))
        .map(|_| Uses::Command);
    declared.filter(|&uses| reads_files(uses)).chain(waves)
}

/// Whether runs of the scenario edit a workspace of their own: it has a tool-loop level.
pub fn owns_workspace(scenario: &Scenario) -> bool {
    scenario.levels.iter().any(|l| matches!(l.kind, LevelKind::ToolLoop { .. }))
}

/// Whether runs of the scenario need a workspace: they edit one (a tool loop), or a
/// verifier runs a program or a scanner on the run's files. Such a run gets the directory
/// the user named or one of its own, recorded in `scenario_started` — never whatever
/// directory the process happens to run in.
pub fn needs_workspace(scenario: &Scenario) -> bool {
    owns_workspace(scenario)
        || scenario.levels.iter().flat_map(|l| &l.verifiers).any(|v| reads_files(v.uses))
}

/// Whether a verifier reads the workspace, running programs on it: every kind but the
/// schema check and the judge, which read the level's answer only.
fn reads_files(uses: Uses) -> bool {
    !matches!(uses, Uses::Schema | Uses::LlmJudge)
}

/// Whether a run of `scenario` never calls a model: its levels are all waves whose
/// assignments outside agents dispatch (a standalone wave's) or programs run.
pub fn calls_no_model(scenario: &Scenario) -> bool {
    scenario.levels.iter().all(|l| {
        matches!(&l.kind, LevelKind::Wave(w)
            if w.dispatch == baton_scenario::model::WaveDispatch::Manual || w.command.is_some())
    })
}

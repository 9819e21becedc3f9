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

use std::sync::Arc;

use baton_engine::event::ScenarioSelected;
use baton_engine::job::{JobRequest, Selection, Start};
use baton_scenario::{Registry, Scenario};
use serde_json::{Map, Value};

use crate::error::Error;

/// The longest idempotency key, in bytes.
pub const KEY_BYTES_MAX: usize = 256;

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
}

/// Checks the request's own values.
pub fn check(request: &JobStart) -> Result<(), Error> {
    for (field, value) in [
        ("scenario", &request.job.pin),
        ("intent", &request.job.intent),
        ("kind", &request.job.kind),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(Error::invalid(format!("{field} is empty; give a value or leave it out")));
        }
    }
    if let Some(usd) = request.max_cost_usd
        && (!usd.is_finite() || usd <= 0.0)
    {
        return Err(Error::invalid(format!(
            "max_cost_usd must be a positive amount of US dollars, not {usd}"
        )));
    }
    if let Some(key) = &request.idempotency_key
        && (key.trim().is_empty() || key.len() > KEY_BYTES_MAX)
    {
        return Err(Error::invalid(format!(
            "idempotency_key must be 1 to {KEY_BYTES_MAX} bytes and not blank"
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
            Error::invalid(message)
        } else {
            Error::refused(message)
        }
    })
}

/// Plans a job: checks the request, selects its scenario (or takes `given`, a standalone
/// wave's), and refuses it when it can reach a scenario that starts programs and the jail
/// cannot be set up.
pub fn plan(
    place: &crate::place::Place,
    registry: &Registry,
    selection: &Selection,
    request: JobStart,
    given: Option<Arc<Scenario>>,
) -> Result<Planned, Error> {
    check(&request)?;
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
        idempotency_key: request.idempotency_key,
        tenant: request.tenant,
        ..Start::default()
    };
    Ok(Planned { scenario, selected, start, warnings })
}

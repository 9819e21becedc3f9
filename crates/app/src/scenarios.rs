//! The scenarios a job sees: the directory's, a tenant's overrides merged in, and the
//! version a run continues on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use baton_engine::Engine;
use baton_engine::store::{EventStore, TenantOverride};
use baton_scenario::registry::Override;
use baton_scenario::{Registry, Scenario};

use crate::error::Error;
use crate::place::Place;

/// The scenarios directory, loaded: every scenario, or an error with every diagnostic.
pub fn registry(place: &Place) -> anyhow::Result<Registry> {
    match Registry::load(&[&place.scenarios]) {
        Ok(loaded) => Ok(loaded.registry),
        Err(e) => Err(Error::invalid(format!(
            "the scenarios in {} do not load",
            place.scenarios.display()
        ))
        .with_diagnostics(e.diagnostics.render())
        .into()),
    }
}

/// Scenario `which` of `registry`, or an error naming the closest and the known ones.
pub fn find_scenario(
    registry: &Registry,
    which: &str,
    place: &Place,
) -> anyhow::Result<Arc<Scenario>> {
    if let Some(s) = registry.get(which) {
        return Ok(Arc::clone(s));
    }
    Err(Error::not_found(format!(
        "{} (in {})",
        baton_engine::job::unknown_scenario(registry, which),
        place.scenarios.display()
    ))
    .into())
}

/// The scenario version a run continues on: loaded from the texts the store keeps under
/// the run's checksum, checked like files and required to hash to that checksum. A run
/// from before versions were kept continues from the scenarios directory when its files
/// still hash to the run's checksum (and its texts are kept from then on); else the error
/// says how to go on.
pub async fn run_scenario(
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
            Error::refused(format!(
                "run {run_id}: the stored version of scenario `{}` ({short}…) does not load ({e}); move the run to the current files with `baton resume {run_id} --upgrade`",
                state.scenario_id
            ))
            .with_diagnostics(e.diagnostics.render())
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

/// A scenario by the path of its file, or by id in the scenarios directory `scenarios`.
pub fn by_file_or_id(scenarios: &Path, which: &str) -> anyhow::Result<Arc<Scenario>> {
    let as_file = PathBuf::from(which);
    let is_file = as_file.is_file();
    let path = if is_file { as_file } else { scenarios.to_path_buf() };
    let loaded = Registry::load(&[&path]).map_err(|e| {
        Error::invalid(format!("the scenarios in {} do not load", path.display()))
            .with_diagnostics(e.diagnostics.render())
    })?;
    let found = if is_file {
        loaded.registry.scenarios().next().cloned()
    } else {
        loaded.registry.get(which).cloned()
    };
    found.ok_or_else(|| {
        let ids: Vec<&str> = loaded.registry.scenarios().map(|s| s.id.as_str()).collect();
        Error::invalid(format!(
            "no scenario `{which}` in {} (known: {})\n  = help: give a scenario id or the path of a scenario file",
            scenarios.display(),
            ids.join(", ")
        ))
        .into()
    })
}

/// Longest tenant name, in characters.
const TENANT_CHARS_MAX: usize = 64;

/// Why `tenant` cannot name a tenant: letters, digits, `_` and `-`, at most
/// [`TENANT_CHARS_MAX`] characters (it names a directory in an overrides tree too).
pub fn check_tenant(tenant: &str) -> anyhow::Result<()> {
    let good = !tenant.is_empty()
        && tenant.chars().count() <= TENANT_CHARS_MAX
        && tenant.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !good {
        let shown: String = tenant.chars().take(TENANT_CHARS_MAX + 1).collect();
        return Err(Error::invalid(format!(
            "tenant {shown:?} must be 1 to {TENANT_CHARS_MAX} letters, digits, `_` or `-`"
        ))
        .into());
    }
    Ok(())
}

/// The overrides of `tenant` as the loader takes them, named for messages.
pub fn as_overrides(stored: &[TenantOverride]) -> Vec<Override> {
    stored
        .iter()
        .map(|o| Override {
            scenario_id: o.scenario_id.clone(),
            name: format!("tenant {} override of {} (stored)", o.tenant, o.scenario_id),
            yaml: o.yaml.clone(),
        })
        .collect()
}

/// The tenant's stored overrides, as the loader takes them.
pub async fn stored(store: &dyn EventStore, tenant: &str) -> anyhow::Result<Vec<Override>> {
    Ok(as_overrides(&store.tenant_overrides(Some(tenant)).await?))
}

/// `base` with the tenant's stored overrides merged over it: the scenarios a run of the
/// tenant sees. An override that no longer loads over the current files is an error that
/// says which and how to fix it.
pub async fn merged(
    store: &dyn EventStore,
    base: Registry,
    tenant: &str,
) -> anyhow::Result<Registry> {
    let stored = stored(store, tenant).await?;
    if stored.is_empty() {
        return Ok(base);
    }
    match base.with_overrides(tenant, &stored) {
        Ok(loaded) => Ok(loaded.registry),
        Err(e) => Err(Error::refused(format!(
            "tenant `{tenant}`'s overrides do not load over the current scenarios; fix them with `baton tenant set {tenant} SCENARIO FILE` or remove one with `baton tenant rm`"
        ))
        .with_diagnostics(e.diagnostics.render())
        .into()),
    }
}

/// `baton validate`: the scenario files or directories of `paths` loaded, with the
/// tenants' overrides of `overrides` merged over them and the configuration's models
/// checked against them; every problem and warning found, and the scenarios when none of
/// them is an error.
pub fn validate(
    paths: &[std::path::PathBuf],
    overrides: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<(baton_scenario::Diagnostics, Option<Registry>)> {
    let mut all = baton_scenario::Diagnostics::new();
    let mut registry = match Registry::load(paths) {
        Ok(loaded) => {
            all.extend(loaded.warnings);
            Some(loaded.registry)
        }
        Err(e) => {
            all.extend(e.diagnostics);
            None
        }
    };
    // Each tenant's overrides are merged over the base and checked; the base registry is
    // the one summarised.
    if let (Some(dir), Some(base)) = (overrides, registry.as_ref()) {
        // A file where a tenant directory belongs is an error the loader reports.
        match baton_scenario::registry::read_overrides(dir) {
            Ok(tenants) => {
                for (tenant, list) in tenants {
                    match base.with_overrides(&tenant, &list) {
                        Ok(loaded) => all.extend(loaded.warnings),
                        Err(e) => all.extend(e.diagnostics),
                    }
                }
            }
            Err(e) => all.extend(e.diagnostics),
        }
        if all.has_errors() {
            registry = None;
        }
    }
    // With a provider configuration, every model constraint must resolve to something.
    if let (Some(path), Some(r)) = (crate::place::config_file(config), registry.as_ref()) {
        for d in crate::models::check_models(r, &path)? {
            all.push(d);
        }
        if all.has_errors() {
            registry = None;
        }
    }
    Ok((all, registry))
}

//! `baton tenant set|list|show|rm|import`: tenants' overrides, kept in the database.
//!
//! An override is partial YAML deep-merged over a base scenario (maps merge key by key,
//! lists and scalars replace). It is checked — merged with the tenant's other overrides
//! over the scenarios as they are now, exactly like a scenario file — before it is stored,
//! so a stored override always loaded once; `baton run --tenant T` runs the merged
//! scenarios, and the run records the merged checksum and its tenant.

#![allow(clippy::print_stderr)]

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use baton_engine::store::{EventStore, TenantOverride};
use baton_scenario::Registry;
use baton_scenario::registry::Override;

use crate::cmd_run::{Place, open_existing_store, open_store, registry};
use crate::escape;
use crate::out::outln;

/// Longest tenant name, in characters.
const TENANT_CHARS_MAX: usize = 64;

/// Why `tenant` cannot name a tenant: letters, digits, `_` and `-`, at most
/// [`TENANT_CHARS_MAX`] characters (it names a directory in an overrides tree too).
pub(crate) fn check_tenant(tenant: &str) -> anyhow::Result<()> {
    let good = !tenant.is_empty()
        && tenant.chars().count() <= TENANT_CHARS_MAX
        && tenant.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !good {
        bail!(
            "tenant {:?} must be 1 to {TENANT_CHARS_MAX} letters, digits, `_` or `-`",
            escape::one_line(tenant)
        );
    }
    Ok(())
}

/// The overrides of `tenant` as the loader takes them, named for messages.
fn as_overrides(stored: &[TenantOverride]) -> Vec<Override> {
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
pub(crate) async fn stored(store: &dyn EventStore, tenant: &str) -> anyhow::Result<Vec<Override>> {
    Ok(as_overrides(&store.tenant_overrides(Some(tenant)).await?))
}

/// `base` with the tenant's stored overrides merged over it: the scenarios a run of the
/// tenant sees. An override that no longer loads over the current files is an error that
/// says which and how to fix it.
pub(crate) async fn merged(
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
        Err(e) => {
            eprint!("{}", e.diagnostics.render());
            bail!(
                "tenant `{tenant}`'s overrides do not load over the current scenarios; fix them with `baton tenant set {tenant} SCENARIO FILE` or remove one with `baton tenant rm`"
            )
        }
    }
}

/// Checks overrides of one tenant over the scenarios (the stored ones with `new` in place
/// of the one for the same scenario); renders every problem with file:line:column.
fn check(base: &Registry, tenant: &str, all: &[Override]) -> anyhow::Result<String> {
    match base.with_overrides(tenant, all) {
        Ok(loaded) => {
            let ids: Vec<String> = all
                .iter()
                .filter_map(|o| loaded.registry.get(&o.scenario_id))
                .map(|s| format!("{} (checksum {}…)", s.id, &s.checksum[..12]))
                .collect();
            Ok(ids.join(", "))
        }
        Err(e) => {
            eprint!("{}", e.diagnostics.render());
            bail!("tenant `{tenant}`: the override does not load; nothing was stored")
        }
    }
}

pub(crate) async fn set(
    place: &Place,
    tenant: &str,
    scenario: &str,
    file: &Path,
) -> anyhow::Result<ExitCode> {
    check_tenant(tenant)?;
    let yaml =
        baton_scenario::capped::read_text(file, baton_scenario::limits::SOURCE_BYTES_MAX as u64)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let base = registry(place)?;
    let store = open_store(place).await?;
    let mut all: Vec<Override> = as_overrides(&store.tenant_overrides(Some(tenant)).await?)
        .into_iter()
        .filter(|o| o.scenario_id != scenario)
        .collect();
    all.push(Override {
        scenario_id: scenario.to_owned(),
        name: file.display().to_string(),
        yaml: yaml.clone(),
    });
    let merged = check(&base, tenant, &all)?;
    let stored = TenantOverride {
        tenant: tenant.to_owned(),
        scenario_id: scenario.to_owned(),
        yaml,
        updated_at: chrono::Utc::now(),
    };
    store.put_tenant_override(&stored).await?;
    outln!("stored tenant {tenant}'s override of {scenario}; its scenarios now: {merged}")?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn list(place: &Place, tenant: Option<&str>) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    let all = store.tenant_overrides(tenant).await?;
    if all.is_empty() {
        outln!("no tenant overrides{}", tenant.map_or(String::new(), |t| format!(" of {t}")))?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{:<24} {:<24} {:>8}  updated", "tenant", "scenario", "bytes")?;
    for o in all {
        let row = format!(
            "{:<24} {:<24} {:>8}  {}",
            o.tenant,
            o.scenario_id,
            o.yaml.len(),
            o.updated_at.format("%Y-%m-%d %H:%M:%S")
        );
        outln!("{}", escape::one_line(&row))?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn show(place: &Place, tenant: &str, scenario: &str) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    let found = store.tenant_overrides(Some(tenant)).await?;
    let Some(o) = found.iter().find(|o| o.scenario_id == scenario) else {
        bail!(
            "tenant `{tenant}` has no override of `{scenario}` (see `baton tenant list {tenant}`)"
        );
    };
    outln!("{}", escape::terminal_safe(&o.yaml, escape::Layout::Block))?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn rm(place: &Place, tenant: &str, scenario: &str) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    if !store.remove_tenant_override(tenant, scenario).await? {
        bail!("tenant `{tenant}` has no override of `{scenario}`; nothing was removed");
    }
    outln!("removed tenant {tenant}'s override of {scenario}")?;
    Ok(ExitCode::SUCCESS)
}

/// Imports an overrides tree (`DIR/TENANT/SCENARIO_ID.yaml`, for GitOps): every tenant's
/// files are checked together over the scenarios, and stored only when all load.
pub(crate) async fn import(place: &Place, dir: &Path) -> anyhow::Result<ExitCode> {
    let tenants = match baton_scenario::registry::read_overrides(dir) {
        Ok(t) => t,
        Err(e) => {
            eprint!("{}", e.diagnostics.render());
            bail!("the overrides in {} cannot be read; nothing was stored", dir.display())
        }
    };
    let base = registry(place)?;
    let store: Arc<dyn EventStore> = open_store(place).await?;
    // Each tenant's files are checked with the overrides it has stored already, as they
    // will be merged.
    for (tenant, list) in &tenants {
        check_tenant(tenant)?;
        let mut all: Vec<Override> = stored(store.as_ref(), tenant)
            .await?
            .into_iter()
            .filter(|o| !list.iter().any(|n| n.scenario_id == o.scenario_id))
            .collect();
        all.extend(list.iter().cloned());
        check(&base, tenant, &all)?;
    }
    let mut count = 0;
    for (tenant, list) in &tenants {
        for o in list {
            let stored = TenantOverride {
                tenant: tenant.clone(),
                scenario_id: o.scenario_id.clone(),
                yaml: o.yaml.clone(),
                updated_at: chrono::Utc::now(),
            };
            store.put_tenant_override(&stored).await?;
            count += 1;
        }
    }
    outln!("imported {count} overrides of {} tenants from {}", tenants.len(), dir.display())?;
    Ok(ExitCode::SUCCESS)
}

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

use crate::escape;
use crate::out::outln;
use baton_app::place::{Place, open_existing_store, open_store};
use baton_app::scenarios::{as_overrides, check_tenant, registry, stored};

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

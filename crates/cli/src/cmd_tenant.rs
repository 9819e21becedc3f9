//! `baton tenant set|list|show|rm|import`: tenants' overrides, kept in the database.
//!
//! An override is partial YAML deep-merged over a base scenario (maps merge key by key,
//! lists and scalars replace). It is checked — merged with the tenant's other overrides
//! over the scenarios as they are now, exactly like a scenario file — before it is stored,
//! so a stored override always loaded once; `baton run --tenant T` runs the merged
//! scenarios, and the run records the merged checksum and its tenant.

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;

use crate::escape;
use crate::out::outln;
use baton_app::place::{Place, open_existing_store};

pub(crate) async fn set(
    place: &Place,
    tenant: &str,
    scenario: &str,
    file: &Path,
) -> anyhow::Result<ExitCode> {
    let merged = baton_app::tenants::set(place, tenant, scenario, file).await?;
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

/// Imports an overrides tree (`DIR/TENANT/SCENARIO_ID.yaml`), checked before any is
/// stored (see the application layer's `tenants::import`).
pub(crate) async fn import(place: &Place, dir: &Path) -> anyhow::Result<ExitCode> {
    let (count, tenants) = baton_app::tenants::import(place, dir).await?;
    outln!("imported {count} overrides of {tenants} tenants from {}", dir.display())?;
    Ok(ExitCode::SUCCESS)
}

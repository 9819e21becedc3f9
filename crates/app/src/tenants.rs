//! Tenants' overrides, kept in the database: each checked — merged with the tenant's other
//! overrides over the scenarios as they are now, exactly like a scenario file — before it
//! is stored, so a stored override always loaded once.

use std::path::Path;
use std::sync::Arc;

use baton_engine::store::{EventStore, TenantOverride};
use baton_scenario::Registry;
use baton_scenario::registry::Override;

use crate::error::Error;
use crate::place::{Place, open_store};
use crate::scenarios::{as_overrides, check_tenant, registry, stored};

/// Checks overrides of one tenant over the scenarios; the merged scenarios with their
/// checksums, or the problems rendered with file:line:column.
fn check(base: &Registry, tenant: &str, all: &[Override]) -> Result<String, Error> {
    match base.with_overrides(tenant, all) {
        Ok(loaded) => {
            let ids: Vec<String> = all
                .iter()
                .filter_map(|o| loaded.registry.get(&o.scenario_id))
                .map(|s| format!("{} (checksum {}…)", s.id, &s.checksum[..12]))
                .collect();
            Ok(ids.join(", "))
        }
        Err(e) => Err(Error::invalid(format!(
            "tenant `{tenant}`: the override does not load; nothing was stored"
        ))
        .with_diagnostics(e.diagnostics.render())),
    }
}

/// Stores `file` as `tenant`'s override of `scenario`, once it loads with the others;
/// the tenant's scenarios as they now are.
pub async fn set(
    place: &Place,
    tenant: &str,
    scenario: &str,
    file: &Path,
) -> anyhow::Result<String> {
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
    Ok(merged)
}

/// Imports an overrides tree (`DIR/TENANT/SCENARIO_ID.yaml`, for GitOps): every tenant's
/// files are checked together over the scenarios, and stored only when all load. How many
/// overrides of how many tenants were stored.
pub async fn import(place: &Place, dir: &Path) -> anyhow::Result<(usize, usize)> {
    let tenants = baton_scenario::registry::read_overrides(dir).map_err(|e| {
        Error::invalid(format!(
            "the overrides in {} cannot be read; nothing was stored",
            dir.display()
        ))
        .with_diagnostics(e.diagnostics.render())
    })?;
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
    Ok((count, tenants.len()))
}

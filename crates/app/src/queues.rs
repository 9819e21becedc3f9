//! The rules of queues and limits, for every surface (`baton queue`, `baton tenant
//! limit`, `baton run --queue=NAME`, `baton worker --queues`): which names, times and
//! limits are allowed, and what a start or a worker may name.

use std::sync::Arc;

use anyhow::bail;
use baton_engine::store::{PRIORITY_MAX, Placement};
use baton_store::queues::{
    AGING_S_DEFAULT, AGING_S_MAX, QUEUES_MAX, QueueChange, QueueLoad, QueueRecord, QueueSet,
    QueueStore, TenantLimit, check_name,
};
use chrono::Utc;

use crate::place::{Place, open_existing_any};

pub use baton_store::queues::{QueueLoad as Load, QueueRecord as Queue, TenantLimit as Limit};

/// The most runs a limit may allow at once.
pub const MAX_RUNNING_MAX: u32 = 1_000_000;

/// A queue's settings as given: the aging time, and the limit (`Some(None)`: none).
pub type QueueSettings = QueueSet;

fn check_aging(aging_s: u64) -> anyhow::Result<()> {
    if !(1..=AGING_S_MAX).contains(&aging_s) {
        bail!("--aging-s must be 1 to {AGING_S_MAX} seconds, not {aging_s}");
    }
    Ok(())
}

fn check_limit(max_running: Option<u32>) -> anyhow::Result<()> {
    if let Some(n) = max_running
        && !(1..=MAX_RUNNING_MAX).contains(&n)
    {
        bail!("a limit must be 1 to {MAX_RUNNING_MAX} runs at once, not {n}");
    }
    Ok(())
}

/// The queue store of the database `place` names, which must exist.
pub async fn open(place: &Place) -> anyhow::Result<Arc<dyn QueueStore>> {
    Ok(open_existing_any(place).await?)
}

/// Makes queue `name` (aging [`AGING_S_DEFAULT`] and no limit unless given).
pub async fn create(
    store: &dyn QueueStore,
    name: &str,
    settings: QueueSettings,
) -> anyhow::Result<QueueRecord> {
    check_name(name).map_err(anyhow::Error::msg)?;
    let aging_s = settings.aging_s.unwrap_or(AGING_S_DEFAULT);
    check_aging(aging_s)?;
    let max_running = settings.max_running.flatten();
    check_limit(max_running)?;
    let now = Utc::now();
    let queue = QueueRecord {
        name: name.to_owned(),
        aging_s,
        max_running,
        created_at: now,
        updated_at: now,
    };
    match store.create_queue(&queue).await? {
        QueueChange::Created => Ok(queue),
        QueueChange::Exists => {
            bail!("queue {name} exists already; change it with `baton queue set {name}`")
        }
        QueueChange::Full => bail!(
            "there are {QUEUES_MAX} queues already, the most there may be; start jobs in one of them (`baton queue list`)"
        ),
    }
}

/// Changes what is given of queue `name`'s settings (its runs keep their due times).
pub async fn set(
    store: &dyn QueueStore,
    name: &str,
    settings: QueueSettings,
) -> anyhow::Result<QueueRecord> {
    check_name(name).map_err(anyhow::Error::msg)?;
    if let Some(aging_s) = settings.aging_s {
        check_aging(aging_s)?;
    }
    if let Some(max_running) = settings.max_running {
        check_limit(max_running)?;
    }
    match store.change_queue(name, settings, Utc::now()).await? {
        Some(queue) => Ok(queue),
        None => bail!("there is no queue {name}; make it with `baton queue create {name}`"),
    }
}

/// Every queue with the runs waiting in it and leased from it now.
pub async fn loads(store: &dyn QueueStore) -> anyhow::Result<Vec<QueueLoad>> {
    Ok(store.queue_loads(Utc::now()).await?)
}

/// Sets (`Some`) or removes (`None`) `tenant`'s limit on the runs leased at once.
pub async fn limit_tenant(
    store: &dyn QueueStore,
    tenant: &str,
    max_running: Option<u32>,
) -> anyhow::Result<bool> {
    crate::scenarios::check_tenant(tenant)?;
    check_limit(max_running)?;
    Ok(store.set_tenant_limit(tenant, max_running, Utc::now()).await?)
}

/// Every tenant's limit.
pub async fn tenant_limits(store: &dyn QueueStore) -> anyhow::Result<Vec<TenantLimit>> {
    Ok(store.tenant_limits().await?)
}

/// Where a job started with `queue` (none: the default queue) and `priority` waits. The
/// name is checked here; that the queue exists, by the store when it creates the run.
pub fn placement(queue: Option<&str>, priority: i16) -> anyhow::Result<Placement> {
    if !(0..=PRIORITY_MAX).contains(&priority) {
        bail!("a priority is 0 to {PRIORITY_MAX}, not {priority}");
    }
    let mut placement = Placement { priority, ..Placement::default() };
    if let Some(queue) = queue {
        check_name(queue).map_err(anyhow::Error::msg)?;
        queue.clone_into(&mut placement.queue);
    }
    Ok(placement)
}

/// The queues a worker takes runs from, checked: each a name that exists.
pub async fn worker_queues(store: &dyn QueueStore, queues: &[String]) -> anyhow::Result<()> {
    for name in queues {
        check_name(name).map_err(anyhow::Error::msg)?;
        if store.queue(name).await?.is_none() {
            bail!(
                "there is no queue {name} to take runs from; make it with `baton queue create {name}` (`baton queue list` shows the queues)"
            );
        }
    }
    Ok(())
}

//! `baton queue create|set|list` and `baton tenant limit`: the queues jobs wait in and the
//! limits on runs driven at once, kept in the database (the rules are the application
//! layer's `queues`).

use std::process::ExitCode;

use anyhow::bail;
use serde_json::json;

use crate::escape;
use crate::out::outln;
use crate::service_args::QueueCommand;
use baton_app::place::Place;

pub(crate) async fn run(place: &Place, command: QueueCommand) -> anyhow::Result<ExitCode> {
    let store = baton_app::queues::open(place).await?;
    match command {
        QueueCommand::Create { name, settings } => {
            let q = baton_app::queues::create(store.as_ref(), &name, settings.settings()).await?;
            outln!("made queue {}: {}", q.name, shown(q.aging_s, q.max_running))?;
        }
        QueueCommand::Set { name, settings } => {
            let q = baton_app::queues::set(store.as_ref(), &name, settings.settings()).await?;
            outln!("queue {}: {}", q.name, shown(q.aging_s, q.max_running))?;
        }
        QueueCommand::List { json } => {
            let loads = baton_app::queues::loads(store.as_ref()).await?;
            if json {
                outln!("{}", serde_json::to_string(&loads)?)?;
                return Ok(ExitCode::SUCCESS);
            }
            outln!(
                "{:<24} {:>8} {:>8} {:>10} {:>8}",
                "queue",
                "waiting",
                "driven",
                "limit",
                "aging_s"
            )?;
            for l in loads {
                let limit = l.queue.max_running.map_or("-".to_owned(), |n| n.to_string());
                let row = format!(
                    "{:<24} {:>8} {:>8} {:>10} {:>8}",
                    l.queue.name, l.waiting, l.leased, limit, l.queue.aging_s
                );
                outln!("{}", escape::one_line(&row))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn shown(aging_s: u64, max_running: Option<u32>) -> String {
    let limit =
        max_running.map_or("no limit".to_owned(), |n| format!("at most {n} runs driven at once"));
    format!("aging {aging_s} s, {limit}")
}

/// `baton tenant limit [TENANT [MAX | --none]]`.
pub(crate) async fn limit(
    place: &Place,
    tenant: Option<&str>,
    max: Option<u32>,
    none: bool,
) -> anyhow::Result<ExitCode> {
    let store = baton_app::queues::open(place).await?;
    let Some(tenant) = tenant else {
        let limits = baton_app::queues::tenant_limits(store.as_ref()).await?;
        if limits.is_empty() {
            outln!("no tenant limits")?;
        }
        for l in limits {
            outln!("{}", escape::one_line(&format!("{:<24} {:>10}", l.tenant, l.max_running)))?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    match (max, none) {
        (Some(n), _) => {
            baton_app::queues::limit_tenant(store.as_ref(), tenant, Some(n)).await?;
            outln!("tenant {tenant}: at most {n} runs driven at once")?;
        }
        (None, true) => {
            let removed = baton_app::queues::limit_tenant(store.as_ref(), tenant, None).await?;
            let said = if removed { "its limit is removed" } else { "it had no limit" };
            outln!("tenant {tenant}: {said}")?;
        }
        (None, false) => {
            let limits = baton_app::queues::tenant_limits(store.as_ref()).await?;
            match limits.iter().find(|l| l.tenant == tenant) {
                Some(l) => outln!("{}", json!({"tenant": tenant, "max_running": l.max_running}))?,
                None => bail!(
                    "tenant {tenant} has no limit; set one with `baton tenant limit {tenant} MAX`"
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

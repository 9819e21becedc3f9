//! `baton webhook add|list|rm|rotate|deliveries`: the application layer's webhook use
//! cases on the database, for one tenant (none: runs of no tenant).

use std::process::ExitCode;

use baton_app::WebhookStore;
use baton_app::place::Place;
use baton_app::webhooks;

use crate::args::WebhookCommand;
use crate::escape;
use crate::out::outln;

pub(crate) async fn run(place: &Place, command: WebhookCommand) -> anyhow::Result<ExitCode> {
    let now = chrono::Utc::now();
    match command {
        WebhookCommand::Add { url, tenant, events } => {
            let settings = webhooks::settings(place)?;
            let store = baton_app::place::open_any(place).await?;
            let added =
                webhooks::add(store_of(&store), &settings, tenant.as_deref(), &url, &events, now)
                    .await?;
            outln!("webhook {}", added.webhook.id)?;
            outln!("secret {}", added.secret)?;
            outln!(
                "sent: {}; the secret is shown this once: give it to the receiver, which checks each delivery's signature with it",
                added.webhook.types.join(", ")
            )?;
        }
        WebhookCommand::List { tenant, json } => {
            let store = baton_app::place::open_existing_any(place).await?;
            let list = webhooks::list(store_of(&store), tenant.as_deref()).await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&list)?)?;
            } else if list.is_empty() {
                outln!("no webhooks")?;
            } else {
                for w in list {
                    let line = format!(
                        "{}  {}  {}  since {}",
                        w.id,
                        w.url,
                        w.types.join(","),
                        w.created_at.format("%Y-%m-%d %H:%M:%S")
                    );
                    outln!("{}", escape::one_line(&line))?;
                }
            }
        }
        WebhookCommand::Rm { id, tenant } => {
            let store = baton_app::place::open_existing_any(place).await?;
            webhooks::remove(store_of(&store), tenant.as_deref(), &id, now).await?;
            outln!("removed webhook {}", escape::one_line(&id))?;
        }
        WebhookCommand::Rotate { id, tenant } => {
            let store = baton_app::place::open_existing_any(place).await?;
            let rotated = webhooks::rotate(store_of(&store), tenant.as_deref(), &id, now).await?;
            outln!("webhook {}", rotated.webhook.id)?;
            outln!("secret {}", rotated.secret)?;
            outln!(
                "the previous secret signs too until {}",
                rotated.webhook.previous_until.map(|t| t.to_rfc3339()).unwrap_or_default()
            )?;
        }
        WebhookCommand::Deliveries { id, tenant, json } => {
            let store = baton_app::place::open_existing_any(place).await?;
            let found = webhooks::deliveries(store_of(&store), tenant.as_deref(), &id).await?;
            if json {
                let rows: Vec<serde_json::Value> = found
                    .iter()
                    .map(|(d, attempts)| {
                        let mut v = serde_json::to_value(d).unwrap_or_default();
                        v["attempts_made"] = serde_json::to_value(attempts).unwrap_or_default();
                        v
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?)?;
            } else if found.is_empty() {
                outln!("no deliveries")?;
            } else {
                for (d, attempts) in found {
                    let line = format!(
                        "{}  {}  run {} event {}  {}  {} attempt(s)",
                        d.id,
                        d.kind,
                        d.run_id,
                        d.seq,
                        d.state.as_str(),
                        attempts.len()
                    );
                    outln!("{}", escape::one_line(&line))?;
                    for a in attempts {
                        let line = format!(
                            "    #{} {}  {}  {} ms",
                            a.attempt,
                            a.at.format("%Y-%m-%d %H:%M:%S%.3f"),
                            match (a.status, &a.error) {
                                (Some(s), None) => format!("answered {s}"),
                                (Some(s), Some(e)) => format!("answered {s}: {e}"),
                                (None, Some(e)) => e.clone(),
                                (None, None) => String::new(),
                            },
                            a.duration_ms
                        );
                        outln!("{}", escape::one_line(&line))?;
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn store_of(store: &std::sync::Arc<dyn baton_app::Store>) -> &dyn WebhookStore {
    store.as_ref()
}

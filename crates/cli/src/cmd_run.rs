//! `baton approve`, `answer`, `cancel`, `runs`, `events` and `cassette export`: the
//! commands on runs that exist, as the application layer's `runs` and `listing` find
//! them.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use baton_app::engines::WaveDrive;
use baton_app::follow::{Followed, follow};
use baton_app::listing::{INTERRUPTED, QUEUED};
use baton_app::place::{Place, open_existing_store};
use baton_app::runs::Cancelled;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::drive::{going_on, print_event, print_json_line, print_timeline, resume, waiting_lines};
use crate::escape;
use crate::out::outln;

/// Options of `baton approve` beside the decision: the model a continued run answers from,
/// and whether to continue it here.
#[derive(Debug)]
pub(crate) struct Then {
    pub script: Option<PathBuf>,
    pub no_resume: bool,
}

/// Continues a run after a decision or an answer was recorded, on the scenario version it
/// started with; when that cannot be loaded here, says why and how to continue it (exit 0:
/// what was asked is recorded).
async fn continue_run(
    place: &Place,
    run_id: &str,
    script: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    if let Some(e) = baton_app::runs::not_continued(place, run_id).await? {
        eprintln!(
            "the run is not continued here: {}; continue it with `baton resume {run_id}` once that is fixed",
            escape::terminal_safe(&format!("{e:#}"), escape::Layout::Block)
        );
        return Ok(ExitCode::SUCCESS);
    }
    resume(place, run_id, script, false, false, WaveDrive::default()).await
}

pub(crate) async fn approve(
    place: &Place,
    run_id: &str,
    decision: baton_app::runs::Decision,
    then: Then,
) -> anyhow::Result<ExitCode> {
    let decided = baton_app::runs::approve(place, run_id, decision).await?;
    outln!(
        "{} request {} of run {run_id}",
        if decided.approved { "approved" } else { "rejected" },
        escape::one_line(&decided.request_id)
    )?;
    if then.no_resume {
        return Ok(ExitCode::SUCCESS);
    }
    continue_run(place, run_id, then.script.as_deref()).await
}

pub(crate) async fn answer(
    place: &Place,
    run_id: &str,
    answer: &str,
    script: Option<&Path>,
    no_resume: bool,
) -> anyhow::Result<ExitCode> {
    baton_app::runs::answer(place, run_id, answer).await?;
    outln!("answered run {run_id}")?;
    if no_resume {
        return Ok(ExitCode::SUCCESS);
    }
    continue_run(place, run_id, script).await
}

/// Records a steering message for the run (see the application layer's `runs::steer`).
pub(crate) async fn steer(
    place: &Place,
    run_id: &str,
    message: &str,
    by: Option<String>,
) -> anyhow::Result<ExitCode> {
    let by = by.unwrap_or_else(|| {
        std::env::var("USER")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| "terminal".to_owned())
    });
    let engine = baton_app::runs::decision_engine(place).await?;
    let sent = baton_app::runs::steer(place, &engine, run_id, message, &by).await?;
    outln!(
        "recorded steering message {} for run {run_id}: the next model call of a steerable level takes it",
        escape::one_line(&sent.id)
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Records a cancel and ends the run here when nobody drives it (see the application
/// layer's `runs::cancel_run`).
pub(crate) async fn cancel(
    place: &Place,
    run_id: &str,
    by: Option<String>,
    reason: Option<String>,
) -> anyhow::Result<ExitCode> {
    match baton_app::runs::cancel_run(place, run_id, by, reason).await? {
        Cancelled::Ended => outln!("cancelled run {run_id}")?,
        Cancelled::Requested => outln!(
            "cancel requested for run {run_id}: the process driving it stops at its next check"
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A duration as people read it: `850 ms`, `12.4 s`, `3 min 05 s`, `2 h 10 min`.
fn human_duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {:02} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {:02} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

pub(crate) async fn runs(
    place: &Place,
    status: Option<&str>,
    tree: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let rows = baton_app::listing::list(place, status, tree).await?;
    if json {
        let list = rows
            .iter()
            .map(|row| baton_app::listing::row_json(row, tree))
            .collect::<serde_json::Result<Vec<Value>>>()?;
        outln!("{}", serde_json::to_string_pretty(&list)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        outln!("no runs{}", status.map_or(String::new(), |s| format!(" with status {s}")))?;
        return Ok(ExitCode::SUCCESS);
    }
    let width = 36 + rows.iter().map(|row| row.depth * 2).max().unwrap_or(0);
    outln!(
        "{:<width$}  {:<11} {:<22} {:>9} {:>9} {:>12}  {:<19}  waits on",
        "run",
        "status",
        "scenario",
        "cost",
        "tokens",
        "duration",
        "updated"
    )?;
    for baton_app::listing::Row { record: r, depth, totals, waiting, requests, damage } in rows {
        let waits: Vec<String> =
            waiting.iter().map(|w| format!("{} ({})", w.level_id, w.wants)).collect();
        let row = format!(
            "{:<width$}  {:<11} {:<22} {:>9} {:>9} {:>12}  {:<19}  {}",
            format!("{}{}", "  ".repeat(depth), r.run_id),
            r.status,
            r.scenario_id,
            format!("${:.4}", totals.cost_usd),
            totals.tokens,
            human_duration(totals.duration_ms),
            r.updated_at.format("%Y-%m-%d %H:%M:%S"),
            waits.join(", ")
        );
        outln!("{}", escape::one_line(&row))?;
        if !requests.is_empty() {
            outln!("    waits for approval: {}", escape::one_line(&requests.join(", ")))?;
        }
        if r.status == INTERRUPTED {
            outln!("    no process drives it; continue it with `baton resume {}`", r.run_id)?;
        }
        if r.status == QUEUED {
            let p = &r.placement;
            let priority =
                if p.priority > 0 { format!(" at priority {}", p.priority) } else { String::new() };
            outln!(
                "    waits in queue {}{priority} for a `baton worker` on this database to claim it",
                p.queue
            )?;
        }
        let ended =
            baton_engine::Status::from_name(&r.status).is_some_and(baton_engine::Status::is_final);
        if let Some(home) = r.placement.home.as_deref().filter(|_| !ended) {
            outln!(
                "    bound to the data dir {}: only a process whose data dir that is drives it",
                escape::one_line(home)
            )?;
        }
        if let Some(damage) = damage {
            outln!("    {}", escape::one_line(&damage))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn export_cassette(
    place: &Place,
    run_id: &str,
    out: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let cassette = baton_app::runs::cassette_of(place, run_id).await?;
    match out {
        Some(path) => {
            baton_app::models::save_cassette(&cassette, path).map_err(anyhow::Error::msg)?;
            outln!("wrote {} recorded answers to {}", cassette.entries.len(), path.display())?;
        }
        None => outln!("{}", cassette.to_text())?,
    }
    Ok(ExitCode::SUCCESS)
}

/// How `baton events RUN` shows a run's log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shown {
    pub(crate) follow: bool,
    pub(crate) tree: bool,
    pub(crate) writers: bool,
    pub(crate) json: bool,
}

pub(crate) async fn events(place: &Place, run_id: &str, how: Shown) -> anyhow::Result<ExitCode> {
    let Shown { follow: follow_on, tree, writers, json } = how;
    let store = open_existing_store(place).await?;
    baton_app::runs::existing_run(place, store.as_ref(), run_id).await?;
    if tree {
        // Each run's events with those of the runs it started nested under the event that
        // started each; read once (closed at once) unless following.
        let (stop, stopped) = oneshot::channel();
        if !follow_on {
            let _ = stop.send(());
        }
        let runs = vec![Followed::new(run_id, 0, 0)];
        follow(store.as_ref(), runs, true, Some(stopped), |id, depth, e| {
            going_on(if json { print_json_line(e, id) } else { print_timeline(e, depth, id) })
        })
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    if follow_on {
        let runs = vec![Followed::new(run_id, 0, 0)];
        follow(store.as_ref(), runs, false, None, |_, _, e| going_on(print_event(e, json))).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let log = store.load(run_id, 0).await?;
    // The first event of each commit names the process that wrote it, when asked.
    let writers: std::collections::BTreeMap<u64, String> = if writers {
        store.writers(run_id).await?.into_iter().collect()
    } else {
        Default::default()
    };
    for e in &log {
        match writers.get(&e.seq) {
            Some(writer) if json => {
                let mut line: serde_json::Value =
                    serde_json::from_str(&crate::timeline::json_line(e))?;
                line["writer"] = serde_json::Value::from(writer.as_str());
                outln!("{line}")?;
            }
            Some(writer) => {
                outln!("written by {}", crate::escape::one_line(writer))?;
                print_event(e, json)?;
            }
            None => print_event(e, json)?,
        }
    }
    if !json {
        for line in waiting_lines(&baton_engine::fold(&log), run_id) {
            outln!("waiting   {line}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Every run's events (of `tenant` when given) after `after`, in the order they were
/// committed: each line names its run (and, as JSON, its cursor); without `follow` it
/// ends with the cursor to go on from.
pub(crate) async fn feed(
    place: &Place,
    tenant: &Option<Option<String>>,
    after: baton_engine::store::FeedCursor,
    follow_on: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    let wait =
        if follow_on { std::time::Duration::from_secs(30) } else { std::time::Duration::ZERO };
    let mut at = after;
    loop {
        let page =
            baton_app::feed::next_page(store.as_ref(), tenant, at, baton_app::feed::PAGE_MAX, wait)
                .await?;
        for e in &page.events {
            let printed =
                if json { print_feed_line(e) } else { print_timeline(&e.event, 1, &e.run_id) };
            if going_on(printed)?.is_break() {
                return Ok(ExitCode::SUCCESS);
            }
        }
        let before = std::mem::replace(&mut at, page.next);
        if page.events.is_empty() && !follow_on && at == before {
            break;
        }
    }
    if !json {
        outln!("next      --after {at}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A feed event as a JSON line naming its run and its cursor.
fn print_feed_line(e: &baton_app::feed::FeedEvent) -> std::io::Result<()> {
    let mut line: serde_json::Value =
        serde_json::from_str(&crate::timeline::json_line(&e.event)).unwrap_or_default();
    if let serde_json::Value::Object(map) = &mut line {
        map.insert("run_id".to_owned(), serde_json::json!(e.run_id));
        map.insert("cursor".to_owned(), serde_json::json!(e.cursor.to_string()));
    }
    outln!("{line}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(human_duration(850), "850 ms");
        assert_eq!(human_duration(12_400), "12.4 s");
        assert_eq!(human_duration(185_000), "3 min 05 s");
        assert_eq!(human_duration(7_800_000), "2 h 10 min");
    }
}

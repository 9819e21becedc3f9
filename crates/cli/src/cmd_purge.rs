//! `baton purge`: retention, as the application layer's `upkeep::purge` plans it — whole
//! jobs that ended before a time, their runs and the directories they leave — said as it
//! goes.

use std::process::ExitCode;

use baton_app::place::Place;
use baton_app::upkeep::{gc, purge as plan};
use chrono::Utc;

use crate::out::outln;

pub(crate) async fn purge(
    place: &Place,
    before: Option<&str>,
    job: Option<String>,
    unended: bool,
    keep_failed: bool,
    dry_run: bool,
) -> anyhow::Result<ExitCode> {
    let which = match (job, before) {
        (Some(run_id), _) => plan::Which::Job { run_id, unended },
        (None, Some(before)) => plan::Which::EndedBefore {
            before: plan::parse_before(before, Utc::now())?,
            keep_failed,
        },
        (None, None) => anyhow::bail!("give --finished-before TIME or --job RUN"),
    };
    let purge = plan::plan(place, &which).await?;
    let before = purge.before;
    let (doomed, runs, paths) = (&purge.doomed, &purge.runs, &purge.paths);
    if doomed.is_empty() {
        outln!("nothing ended before {} to purge", before.to_rfc3339())?;
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if dry_run { "would purge" } else { "purged" };
    if !dry_run {
        let removed = plan::remove_runs(place, &purge).await?;
        if removed != runs.len() as u64 {
            #[allow(clippy::print_stderr)]
            {
                eprintln!(
                    "baton purge: {} of {} runs were gone already",
                    runs.len() as u64 - removed,
                    runs.len()
                );
            }
        }
    }
    for d in doomed {
        outln!(
            "{verb} job {} ({} run{})",
            d.root,
            d.runs.len(),
            if d.runs.len() == 1 { "" } else { "s" }
        )?;
    }
    let mut failed = false;
    for (path, what) in paths {
        let shown = crate::escape::one_line(&path.display().to_string());
        if !dry_run && let Err(e) = gc::remove(path) {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: cannot remove {shown}: {e}");
            }
            failed = true;
            continue;
        }
        let verb = if dry_run { "would remove" } else { "removed" };
        outln!("{verb} {shown} ({})", crate::escape::one_line(what))?;
    }
    // The snapshots handed off to the object store go with their runs.
    if let Some(handoff) = &place.handoff {
        let store = handoff.shown();
        for run in runs {
            if dry_run {
                outln!("would remove run {run}'s snapshots from {store}")?;
                continue;
            }
            match handoff.remove_run(run).await {
                Ok(0) => {}
                Ok(n) => outln!("removed {n} snapshot bundle(s) of run {run} from {store}")?,
                Err(e) => {
                    #[allow(clippy::print_stderr)]
                    {
                        eprintln!("error: {}", crate::escape::one_line(&e));
                    }
                    failed = true;
                }
            }
        }
    }
    match which {
        plan::Which::Job { .. } => outln!("{verb} {} job(s), {} run(s)", doomed.len(), runs.len())?,
        plan::Which::EndedBefore { .. } => outln!(
            "{verb} {} job(s), {} run(s) that ended before {}",
            doomed.len(),
            runs.len(),
            before.to_rfc3339()
        )?,
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

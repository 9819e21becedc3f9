//! `baton replay`, `baton diff`, `baton fixture record|accept` and `baton test`: what a
//! change to a scenario or a prompt does to recorded jobs, as the application layer's
//! `replay` and `fixtures` find it — printed here, every text a model wrote escaped.

#![allow(clippy::print_stderr)]

use std::path::Path;

use baton_app::fixture;
use baton_app::fixtures::{CaseResult, Cases, RecordArgs, run_cases};
use baton_app::place::Place;
use baton_app::replay::{replay_report, strategy};
use baton_engine::replay::{Change, Mismatch};
use serde_json::json;

use crate::escape::{Layout, one_line, terminal_safe};
use crate::out::{self, outln};

/// `baton replay RUN | --fixture DIR`.
pub(crate) async fn replay(
    place: &Place,
    run: Option<&str>,
    fixture_dir: Option<&Path>,
    trust_validation: bool,
    from_scenario: Option<&Path>,
    json: bool,
) -> anyhow::Result<std::process::ExitCode> {
    let done = replay_report(place, run, fixture_dir, trust_validation, from_scenario).await?;
    if json {
        outln!("{}", done.line)?;
    } else {
        outln!(
            "replay {} of {} ({}): {}",
            done.line["replay_run_id"].as_str().unwrap_or_default(),
            done.line["recorded_run_id"].as_str().unwrap_or("?"),
            strategy(trust_validation).as_str(),
            done.line["status"].as_str().unwrap_or_default()
        )?;
        if done.scratch {
            outln!("(replayed in a scratch database, removed when done)")?;
        }
        if done.mismatches.is_empty() {
            outln!(
                "the replay matches the recording event by event: {} run(s), {} events (times, durations, heartbeats and ids that come from time aside)",
                done.line["runs"],
                done.line["events"]
            )?;
        } else {
            outln!("the replay differs from the recording:")?;
            print_mismatches(&done.mismatches)?;
        }
        for miss in &done.misses {
            outln!("{}", terminal_safe(&miss.message(), Layout::Block))?;
        }
    }
    Ok(std::process::ExitCode::from(if done.mismatches.is_empty() { 0 } else { 1 }))
}

fn print_mismatches(mismatches: &[Mismatch]) -> std::io::Result<()> {
    for m in mismatches {
        let at = match (m.seq, m.replay_seq) {
            (Some(a), Some(b)) if a == b => format!("event {a}"),
            (Some(a), Some(b)) => format!("event {a} (replay's {b})"),
            (Some(a), None) => format!("event {a}"),
            (None, Some(b)) => format!("replay's event {b}"),
            (None, None) => "the run".to_owned(),
        };
        outln!("  {} at {at}: {}", one_line(&m.run), one_line(&m.message))?;
    }
    Ok(())
}

/// `baton diff RUN_A RUN_B`: where two jobs' paths, verdicts, outputs and costs diverge.
pub(crate) async fn diff(
    place: &Place,
    a: &str,
    b: &str,
    json: bool,
) -> anyhow::Result<std::process::ExitCode> {
    let baton_app::fixtures::Diff { a_summary: sa, b_summary: sb, changes, levels, mismatches } =
        baton_app::fixtures::diff(place, a, b).await?;
    if json {
        outln!(
            "{}",
            json!({
                "a": a, "b": b,
                "same": changes.is_empty(),
                "changes": changes,
                "levels": levels.iter().map(|(l, x, y)| json!({"level": l, "a": x, "b": y})).collect::<Vec<_>>(),
                "first_divergence": mismatches,
                "a_summary": sa, "b_summary": sb,
            })
        )?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    outln!("a: {a} ({}, ${:.6}, {} tokens)", sa.status, sa.cost_usd, sa.tokens)?;
    outln!("b: {b} ({}, ${:.6}, {} tokens)", sb.status, sb.cost_usd, sb.tokens)?;
    if changes.is_empty() {
        outln!("the two jobs took the same path to the same verdicts, output, cost and tokens")?;
    }
    for c in &changes {
        print_change(c, false)?;
    }
    if !levels.is_empty() {
        outln!("cost per level (a → b):")?;
        for (level, x, y) in &levels {
            let show = |v: &Option<(f64, u64)>| {
                v.map_or("—".to_owned(), |(c, t)| format!("${c:.6} {t} tok"))
            };
            outln!("  {:<32} {} → {}", one_line(level), show(x), show(y))?;
        }
    }
    if !mismatches.is_empty() {
        outln!("where the logs first diverge:")?;
        print_mismatches(&mismatches)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn print_change(c: &Change, judged: bool) -> std::io::Result<()> {
    let mark = if !judged {
        ""
    } else if c.fails {
        "FAIL "
    } else {
        "ok   "
    };
    let level = c.level.as_deref().map(|l| format!(" {}", one_line(l))).unwrap_or_default();
    if c.detail.contains('\n') {
        outln!("  {mark}{}{level}:", c.what)?;
        for line in c.detail.lines() {
            outln!("      {}", terminal_safe(line, Layout::OneLine))?;
        }
        Ok(())
    } else {
        outln!("  {mark}{}{level}: {}", c.what, one_line(&c.detail))
    }
}

/// What `baton test` and `baton fixture accept` were given: the fixtures and how to
/// replay them, and how `test` reports.
#[derive(Debug)]
pub(crate) struct TestArgs {
    pub cases: Cases,
    pub format: TestFormat,
}

/// `baton fixture record SCENARIO CASE …`, said once recorded.
pub(crate) async fn record(
    place: &Place,
    args: RecordArgs,
) -> anyhow::Result<std::process::ExitCode> {
    let (scenario, case) = (args.scenario.clone(), args.case.clone());
    let r = baton_app::fixtures::record(place, args).await?;
    if let Some(warning) = &r.jail_warning {
        eprintln!("baton: warning: {warning}");
    }
    outln!(
        "fixture {scenario}/{case} recorded from run {}: {}, {} levels, ${:.6}, {} tokens → {}",
        r.run_id,
        r.summary.status,
        r.summary.path.len(),
        r.summary.cost_usd,
        r.summary.tokens,
        r.dir.display()
    )?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// Output formats of `baton test`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TestFormat {
    Text,
    Json,
    Junit,
}

/// `baton test [SCENARIO…]`.
pub(crate) async fn test(place: &Place, args: TestArgs) -> anyhow::Result<std::process::ExitCode> {
    let (results, started) = run_cases(place, &args.cases, false).await?;
    let passed = results.iter().filter(|r| r.passed()).count();
    let failed = results.len() - passed;
    match args.format {
        TestFormat::Text => {
            for r in &results {
                print_case(r)?;
            }
            outln!(
                "{} fixture(s): {passed} passed, {failed} failed ({:.1} s)",
                results.len(),
                started.elapsed().as_secs_f64()
            )?;
        }
        TestFormat::Json => outln!("{}", baton_app::fixtures::json_report(&results))?,
        TestFormat::Junit => {
            out::write(format_args!("{}", baton_app::fixtures::junit(&results)))?;
        }
    }
    Ok(std::process::ExitCode::from(if failed == 0 { 0 } else { 1 }))
}

/// `baton fixture accept [SCENARIO [CASE]]`: records each fixture again from its replay.
pub(crate) async fn accept(
    place: &Place,
    args: TestArgs,
) -> anyhow::Result<std::process::ExitCode> {
    let (results, _) = run_cases(place, &args.cases, true).await?;
    let mut refused = 0;
    for r in results {
        let dir = fixture::root(&place.scenarios).join(&r.scenario).join(&r.case);
        let unanswered = r.misses.len() - r.rerecorded.min(r.misses.len());
        match (&r.error, &r.replayed) {
            (None, Some(replayed)) if unanswered == 0 => {
                let summary = baton_app::fixtures::accept(&dir, replayed)?;
                let changed = r.changes.len();
                outln!(
                    "accepted {}: {} ({changed} change(s) from what it expected{})",
                    r.name,
                    summary.status,
                    if r.rerecorded > 0 {
                        format!(", {} call(s) recorded live", r.rerecorded)
                    } else {
                        String::new()
                    }
                )?;
            }
            _ => {
                refused += 1;
                print_case(&r)?;
                outln!(
                    "not accepted {}: the replay did not run to a result{}",
                    r.name,
                    if unanswered > 0 {
                        "; its cassette misses requests: accept with --live to record them"
                    } else {
                        ""
                    }
                )?;
            }
        }
    }
    Ok(std::process::ExitCode::from(if refused == 0 { 0 } else { 1 }))
}

fn print_case(r: &CaseResult) -> std::io::Result<()> {
    let verdict = if r.passed() { "ok" } else { "FAIL" };
    outln!("{} … {verdict} ({:.1} s)", one_line(&r.name), r.seconds)?;
    if let Some(e) = &r.error {
        outln!("  error: {}", terminal_safe(e, Layout::OneLine))?;
    }
    // A request the cassette lacks comes first: the changes follow from it.
    for m in &r.misses {
        outln!(
            "  {} request of level {} (call {}) is not in the cassette{}",
            if r.rerecorded > 0 { "recorded live: the" } else { "FAIL the" },
            one_line(&m.level_id),
            m.call_index,
            if m.nearest.is_some() {
                "; how it differs from the recording (- recorded, + asked):"
            } else {
                ", which holds no call of that level"
            }
        )?;
        for line in m.diff.lines() {
            outln!("      {}", terminal_safe(line, Layout::OneLine))?;
        }
    }
    for c in &r.changes {
        print_change(c, true)?;
    }
    Ok(())
}

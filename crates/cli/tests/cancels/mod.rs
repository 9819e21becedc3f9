//! Cancel anywhere: every bundled scenario, cancelled (as `baton cancel` from another
//! process would) as soon as its event N is in the store, ends `cancelled`, with its partial
//! work discarded (a tool loop's workspace back to its base) and nothing it started still
//! running. Past a cap of cancel points per scenario, the sweep covers the first event of
//! every kind plus a seeded sample of the rest.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use super::{normalised_log, only_run, repo, text};

/// The directories a workspace's snapshots leave out and its restores keep (build caches).
const BUILD_CACHES: [&str; 6] =
    ["target", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"];

/// Most cancel points per scenario.
const POINTS_MAX: usize = 14;

/// A `baton` with the venv's tools on PATH and the cancel failpoint at `n` (if any).
fn baton_at(db: &Path, args: &[&str], n: Option<usize>) -> Output {
    baton_with(db, args, n.map(|n| ("BATON_FAILPOINT_CANCEL_AFTER_EVENT", n)))
}

/// A `baton` with the venv's tools on PATH and a failpoint (its variable and value).
fn baton_with(db: &Path, args: &[&str], failpoint: Option<(&str, usize)>) -> Output {
    let venv = repo().join(".peers/venv/bin");
    let path = format!("{}:{}", venv.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = super::baton_command();
    c.arg("--db").arg(db).args(args).env("PATH", path);
    if let Some((name, n)) = failpoint {
        c.env(name, n.to_string());
    }
    c.output().unwrap()
}

/// Drives a run to its end under the failpoint, deciding and answering what it waits for.
fn to_the_end(db: &Path, start: &[&str], n: Option<usize>) -> String {
    let out = baton_at(db, start, n);
    let run = only_run(db).unwrap_or_else(|| panic!("no run: {}", text(&out.stderr)));
    let mut code = out.status.code();
    for _ in 0..30 {
        match code {
            Some(0 | 4 | 5) => return run,
            // A failed run has ended; a refused decision (the run was cancelled meanwhile)
            // leaves the run to a driver.
            Some(1) => {
                let ended = normalised_log(db, &run)
                    .last()
                    .is_some_and(|e| e["kind"] == "scenario_finished");
                if ended {
                    return run;
                }
                code = baton_at(db, &["resume", &run], n).status.code();
            }
            Some(3) => {
                let approved = baton_at(db, &["approve", &run, "--by", "tester"], n);
                code = approved.status.code();
                if code == Some(1) && text(&approved.stderr).contains("not waiting for an approval")
                {
                    code = baton_at(db, &["answer", &run, "--answer", "\"yes\""], n).status.code();
                }
            }
            other => panic!("exit {other:?}: {}{}", text(&out.stdout), text(&out.stderr)),
        }
    }
    panic!("run {run} did not end");
}

/// Files under `dir`, relative to it.
fn files(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else {
                out.insert(path.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out
}

/// Whether a live process names `needle` in its command line or works inside it.
fn anything_running_in(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let cwd = std::fs::read_link(p.path().join("cwd")).unwrap_or_default();
        if cmdline.contains(needle) || cwd.to_string_lossy().contains(needle) {
            found.push(cmdline);
        }
    }
    found
}

/// The cancel points of a log of `len` events: the first event of every kind (the last
/// event, the end, excluded: a cancel after it has nothing to cancel), then a sample of
/// the others chosen by a fixed seed, up to [`POINTS_MAX`].
fn points(log: &[serde_json::Value], seed: u64) -> Vec<usize> {
    let mut chosen = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    for (i, e) in log.iter().enumerate().take(log.len() - 1) {
        if kinds.insert(e["kind"].as_str().unwrap_or_default().to_owned()) {
            chosen.insert(i + 1);
        }
    }
    let mut x = seed | 1;
    let mut tries = 0;
    while chosen.len() < POINTS_MAX.min(log.len() - 1) && tries < 1000 {
        // xorshift: a sample that is the same on every machine.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chosen.insert(usize::try_from(x % (log.len() as u64 - 1)).unwrap() + 1);
        tries += 1;
    }
    chosen.into_iter().collect()
}

#[test]
fn cancelled_after_any_event_every_bundled_scenario_ends_cancelled_with_its_work_discarded() {
    let scenarios = [
        ("release_notes", "release_notes"),
        ("security_review", "security_review"),
        ("document_writing", "document_writing"),
        ("research_brief", "research_brief"),
        ("parallel_review_demo", "parallel_review_demo"),
        ("quick_qa", "quick_qa"),
        ("intent_classifier", "intent_classifier"),
        ("code_build", "code_build"),
        ("code_build_strict", "code_build_strict"),
    ];
    let base = std::env::temp_dir().join(format!("baton-cli-cancel-{}", std::process::id()));
    let (mut effective, mut total) = (0, 0);
    for (seed, (scenario, script)) in (1u64..).zip(scenarios) {
        let script = format!("scenarios/scripts/{script}.yaml");
        let start =
            ["run", scenario, "--script", script.as_str(), "--input", "a greet CLI in Python"];
        let reference_db = base.join(format!("{scenario}-ref.db"));
        let run = to_the_end(&reference_db, &start, None);
        let reference = normalised_log(&reference_db, &run);
        assert_eq!(reference.last().unwrap()["kind"], "scenario_finished", "{scenario}");
        let points = points(&reference, seed);
        let mut cancelled = 0;
        for &n in &points {
            let db = base.join(format!("{scenario}-{n}.db"));
            let run = to_the_end(&db, &start, Some(n));
            let log = normalised_log(&db, &run);
            let end = log.last().unwrap();
            assert_eq!(
                end["kind"], "scenario_finished",
                "{scenario}: after {n} the run did not end"
            );
            if end["data"]["status"] != "cancelled" {
                // Event n came with the run's last commit (its end): the cancel came too
                // late and was not recorded, and the run is the one never cancelled.
                assert_eq!(log, reference, "{scenario}: cancelled after event {n}, not ended so");
                continue;
            }
            cancelled += 1;
            // No level starts after the cancel; the cancelled one is closed as skipped.
            let at = log.iter().position(|e| e["kind"] == "cancel_requested").unwrap();
            assert!(
                !log[at..].iter().any(|e| e["kind"] == "level_started"),
                "{scenario}: a level started after the cancel at {n}"
            );
            // A tool loop's workspace is back to its base (the bundled ones start empty),
            // but for the build caches snapshots leave out by design (a verifier's compiled
            // Python).
            let workspaces = db.parent().unwrap().join("workspaces").join(&run);
            if scenario.starts_with("code_build") {
                let kept: BTreeSet<PathBuf> = files(&workspaces)
                    .into_iter()
                    .filter(|f| {
                        !f.components().any(|c| {
                            BUILD_CACHES.contains(&c.as_os_str().to_str().unwrap_or_default())
                        })
                    })
                    .collect();
                assert_eq!(
                    kept,
                    BTreeSet::new(),
                    "{scenario}: cancelled after event {n}, the workspace kept work"
                );
            }
            let running = anything_running_in(&workspaces.display().to_string());
            assert!(running.is_empty(), "{scenario}: still running after {n}: {running:?}");
        }
        // Only a cancel that lands with the run's last commit comes too late: a run of more
        // than one level commits before its last level runs.
        let levels = reference.iter().filter(|e| e["kind"] == "level_started").count();
        assert!(
            levels < 2 || cancelled > 0,
            "{scenario}: no cancel of {} took effect",
            points.len()
        );
        effective += cancelled;
        total += points.len();
    }
    assert!(effective * 2 >= total, "only {effective} of {total} cancels took effect");
    let _ = std::fs::remove_dir_all(base);
}

/// Every run of a database: its id, whether it is a job's root, and its status.
fn all_runs(db: &Path) -> Vec<(String, bool, String)> {
    let out = baton_with(db, &["runs", "--json"], None);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_owned(),
                r.get("parent_run_id").is_none(),
                r["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn cancelled_after_any_event_of_a_wave_it_ends_cancelled_with_every_worker_ended() {
    let base = std::env::temp_dir().join(format!("baton-cli-cancel-wave-{}", std::process::id()));
    let start = [
        "run",
        "feature_wave",
        "--script",
        "scenarios/scripts/feature_wave.yaml",
        "--input",
        "a greet CLI in Python",
    ];
    let reference_db = base.join("ref.db");
    let out = baton_with(&reference_db, &start, None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let root = only_run(&reference_db).unwrap();
    let reference = normalised_log(&reference_db, &root);
    // Every event the job's process writes, whichever run of the tree: root and workers.
    let total: usize = all_runs(&reference_db)
        .iter()
        .map(|(id, _, _)| normalised_log(&reference_db, id).len())
        .sum();
    assert!(total > reference.len(), "the workers write too");
    let mut points: BTreeSet<usize> = (1..=4).chain(total - 3..total).collect();
    let mut x = 0x5eed_u64;
    while points.len() < POINTS_MAX && points.len() < total - 1 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        points.insert(usize::try_from(x % (total as u64 - 1)).unwrap() + 1);
    }
    let mut cancelled = 0;
    for &n in &points {
        let db = base.join(format!("{n}.db"));
        let out = baton_with(&db, &start, Some(("BATON_FAILPOINT_CANCEL_ROOT_AFTER_WRITES", n)));
        assert!(
            matches!(out.status.code(), Some(0 | 4 | 5)),
            "after write {n}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let run = only_run(&db).unwrap();
        let log = normalised_log(&db, &run);
        let end = log.last().unwrap();
        assert_eq!(end["kind"], "scenario_finished", "after write {n} the wave did not end");
        // Every run of the tree has ended, and no program of it is still running.
        for (id, _, status) in all_runs(&db) {
            assert!(
                ["completed", "failed", "aborted", "cancelled"].contains(&status.as_str()),
                "after write {n}: run {id} is {status}"
            );
        }
        let running =
            anything_running_in(&db.parent().unwrap().join("workspaces").display().to_string());
        assert!(running.is_empty(), "after write {n}: still running: {running:?}");
        if end["data"]["status"] != "cancelled" {
            // The cancel came with the job's last commit: the job ended as the one never
            // cancelled (its workers may have settled in another order: they run at once).
            let finished = reference.last().unwrap();
            assert_eq!(
                (&end["data"]["status"], &end["data"]["final_output"]),
                (&finished["data"]["status"], &finished["data"]["final_output"]),
                "cancelled after write {n}, not ended so"
            );
            assert!(n + 4 > total, "a cancel after write {n} of {total} was not recorded");
            continue;
        }
        cancelled += 1;
        // No worker is admitted and no level starts after the cancel.
        let at = log.iter().position(|e| e["kind"] == "cancel_requested").unwrap();
        assert!(
            !log[at..]
                .iter()
                .any(|e| e["kind"] == "level_started" || e["kind"] == "wave_dispatched"),
            "after write {n}: work started after the cancel"
        );
    }
    assert!(
        cancelled * 2 >= points.len(),
        "only {cancelled} of {} cancels took effect",
        points.len()
    );
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn a_workers_result_that_comes_after_its_cancel_ends_it_aborted_and_its_assignment_cancelled() {
    // A wave of two workers: one answers after 300 ms, the other after 5 s. The failpoint
    // records a cancel of the first and of the wave's run right before the first's result
    // is committed, as a `baton cancel` from another process would between the answer and
    // its commit; the wave's cancel then stops the second while it works.
    let dir = super::scratch("late-result");
    std::fs::create_dir_all(dir.join("scenarios")).unwrap();
    std::fs::write(
        dir.join("scenarios/worker.yaml"),
        "id: worker\nversion: 1\nlevels:\n  - id: work\n    kind: prompt\n    prompt: {inline: \"Work on {{ input }}\"}\n    terminal: true\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("scenarios/waver.yaml"),
        "id: waver\nversion: 1\nlevels:\n  - id: build\n    kind: wave\n    terminal: true\n    wave: {worker: worker, max_parallel: 2}\nedges:\n  - {from: build, to: __end__, when: \"wave.decision == 'complete'\"}\n  - {from: build, to: __fail__}\n",
    )
    .unwrap();
    let report = "```worker_report\n{\"outcome\": \"completed\", \"summary\": \"done\"}\n```\n";
    std::fs::write(
        dir.join("script.yaml"),
        format!(
            "scenarios:\n  worker:\n    levels:\n      work: [{{text: {report:?}, delay_ms: 300}}]\n    cases:\n      - when: \"two\"\n        levels:\n          work: [{{text: {report:?}, delay_ms: 5000}}]\n"
        ),
    )
    .unwrap();
    let db = dir.join("runs.db");
    let input = r#"{"tasks": [{"id": "t1", "title": "one"}, {"id": "t2", "title": "two"}]}"#;
    let out = super::baton_in(&dir, &db)
        .args(["run", "waver", "--input", input, "--script", "script.yaml"])
        .env("BATON_FAILPOINT_CANCEL_BEFORE_KIND", "level_finished")
        .output()
        .unwrap();
    let root = only_run(&db).unwrap_or_else(|| panic!("no run: {}", text(&out.stderr)));
    let log = normalised_log(&db, &root);
    let end = &log.last().unwrap()["data"];
    assert_eq!(end["status"], "cancelled", "{}", text(&out.stderr));
    let decided = log
        .iter()
        .rfind(|e| e["kind"] == "wave_decided")
        .unwrap_or_else(|| panic!("no wave decision: {log:?}"));
    assert_eq!(decided["data"]["decision"], "cancelled");
    let counts = &decided["data"]["counts"];
    assert_eq!((&counts["cancelled"], &counts["failed"]), (&2.into(), &0.into()), "{counts}");
    // The worker whose result came after its cancel ended `aborted`, saying why; its result
    // is in no `level_finished` of its log, only the size of what was dropped.
    let workers: Vec<(String, String)> = all_runs(&db)
        .into_iter()
        .filter(|(_, is_root, _)| !is_root)
        .map(|(id, _, status)| (id, status))
        .collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let late: Vec<&(String, String)> = workers.iter().filter(|(_, s)| s == "aborted").collect();
    assert_eq!(late.len(), 1, "one worker's result came after its cancel: {workers:?}");
    let worker_log = normalised_log(&db, &late[0].0);
    let finished = &worker_log.last().unwrap()["data"];
    assert_eq!(finished["aborted_reason"], "late_result_after_cancel", "{finished}");
    let dropped = worker_log
        .iter()
        .find(|e| e["kind"] == "late_result_discarded")
        .unwrap_or_else(|| panic!("nothing says a result was dropped: {worker_log:?}"));
    assert_eq!(dropped["level_id"], "work");
    assert_eq!(dropped["data"]["output_bytes"], report.len());
    assert!(
        !worker_log.iter().any(|e| e["kind"] == "level_finished" && e["data"]["skipped"] == false),
        "the late result was kept"
    );
    // What its model call spent still counts.
    assert_eq!(finished["totals"]["tokens"], 70, "{finished}");
    // The other worker was stopped by the wave's cancel.
    assert!(workers.iter().any(|(_, s)| s == "cancelled"), "{workers:?}");
    let _ = std::fs::remove_dir_all(dir);
}

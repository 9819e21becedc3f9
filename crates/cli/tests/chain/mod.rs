//! Damage detection and backups through the `baton` binary on real SQLite files: every
//! single-event edit of a bundled scenario's log is found by `verify` (property test),
//! a damaged run is neither decided on nor driven, a hand-edited `last_seq` is refused
//! instead of spun on, and a backup taken while runs go on verifies.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rusqlite::{Connection, params};

use super::{baton_db, repo, text};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "baton-chain-{name}-{}-{}",
        std::process::id(),
        uuid_like()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn uuid_like() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// Runs a bundled scenario with its script into `db`; returns the run id.
fn run_bundled(db: &Path, scenario: &str, input: &str) -> String {
    let script = format!("scenarios/scripts/{scenario}.yaml");
    let out = baton_db(db, &["run", scenario, "--input", input, "--script", &script, "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    report["run_id"].as_str().unwrap().to_owned()
}

/// One database holding a paused `release_notes` run (an approval, a review loop) and a
/// completed `quick_qa` run, copied into one file by `baton backup`; with the run ids.
fn template() -> &'static (PathBuf, Vec<String>) {
    static TEMPLATE: OnceLock<(PathBuf, Vec<String>)> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = temp("template");
        let db = dir.join("live.db");
        let runs = vec![
            run_bundled(&db, "release_notes", "v1.2: export to CSV, faster search"),
            run_bundled(&db, "quick_qa", "What is the capital of France?"),
        ];
        let copy = dir.join("template.db");
        let out = baton_db(&db, &["backup", copy.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        (copy, runs)
    })
}

fn events_in(conn: &Connection, run: &str) -> i64 {
    conn.query_row(
        "SELECT COALESCE(SUM(b.last_seq - b.first_seq + 1), 0) FROM batches b JOIN runs r ON b.rk = r.rk WHERE r.run_id = ?1",
        [run],
        |r| r.get(0),
    )
    .unwrap()
}

/// One edit of one event (or the tail) of a stored log. Positions are fractions of the
/// log, so that every case lands on a real event.
#[derive(Clone, Debug)]
enum Edit {
    Delete(f64),
    Swap(f64, f64),
    /// Event `a` moves to after event `b` (a < b); the ones between move up.
    Reorder(f64, f64),
    /// One byte of the payload is XORed with a non-zero mask.
    FlipPayload(f64, f64, u8),
    /// The event takes a number past the end of the log.
    Seq(f64, u8),
    Time(f64, i64),
    Kind(f64),
    Level(f64),
    Attempt(f64),
    /// The event's schema version is changed.
    Version(f64),
    /// Every event after this one is deleted; `last_seq` too when the flag is set.
    Truncate(f64, bool),
}

fn edit_strategy() -> impl Strategy<Value = Edit> {
    let at = 0.0..1.0f64;
    prop_oneof![
        at.clone().prop_map(Edit::Delete),
        (at.clone(), at.clone()).prop_map(|(a, b)| Edit::Swap(a, b)),
        (at.clone(), at.clone()).prop_map(|(a, b)| Edit::Reorder(a, b)),
        (at.clone(), at.clone(), 1u8..=255).prop_map(|(a, p, m)| Edit::FlipPayload(a, p, m)),
        (at.clone(), 1u8..10).prop_map(|(a, k)| Edit::Seq(a, k)),
        (at.clone(), prop_oneof![-5_000_000i64..-1, 1i64..5_000_000])
            .prop_map(|(a, d)| Edit::Time(a, d)),
        at.clone().prop_map(Edit::Kind),
        at.clone().prop_map(Edit::Level),
        at.clone().prop_map(Edit::Attempt),
        at.clone().prop_map(Edit::Version),
        (at, any::<bool>()).prop_map(|(a, b)| Edit::Truncate(a, b)),
    ]
}

/// Applies `edit` to run `run` (of `n` events) inside its packed batches; returns the
/// first event a check must report — the first of the batch whose hash the edit breaks, or
/// the one after a cut made at the end of a batch — or `None` when the edit left the log's
/// meaning unchanged (a flipped byte the batch still reads the same with).
fn apply(conn: &Connection, run: &str, n: i64, edit: &Edit) -> Option<i64> {
    use baton_store::sqlite::{put_raw_batches, raw_batches};
    let pick = |f: f64| 1 + ((f * n as f64) as i64).min(n - 1);
    let mut batches = raw_batches(conn, run).unwrap();
    // The batch holding event `s`, and the event's place in it.
    let find = |batches: &[baton_store::sqlite::RawBatch], s: i64| {
        let b = batches.iter().position(|b| b.first_seq <= s && s <= b.last_seq).unwrap();
        (b, usize::try_from(s - batches[b].first_seq).unwrap())
    };
    let spans: Vec<(i64, i64)> = batches.iter().map(|b| (b.first_seq, b.last_seq)).collect();
    let start = |s: i64| spans.iter().find(|(f, l)| *f <= s && s <= *l).unwrap().0;
    let reported = match *edit {
        Edit::Delete(a) => {
            let s = pick(a);
            let (b, i) = find(&batches, s);
            batches[b].events.remove(i);
            batches[b].last_seq -= 1;
            Some(batches[b].first_seq)
        }
        Edit::Swap(a, b) | Edit::Reorder(a, b) => {
            let (mut x, mut y) = (pick(a), pick(b));
            if x == y {
                if y < n { y += 1 } else { x -= 1 }
            }
            let (x, y) = (x.min(y), x.max(y));
            let at = |batches: &[baton_store::sqlite::RawBatch], s| find(batches, s);
            let (bx, ix) = at(&batches, x);
            let moved = batches[bx].events[ix].clone();
            if matches!(edit, Edit::Swap(..)) {
                let (by, iy) = at(&batches, y);
                batches[bx].events[ix] = batches[by].events[iy].clone();
                batches[by].events[iy] = moved;
            } else {
                // x+1..=y move down one place, x goes to y's.
                for s in x + 1..=y {
                    let (bs, is) = at(&batches, s);
                    let (bp, ip) = at(&batches, s - 1);
                    batches[bp].events[ip] = batches[bs].events[is].clone();
                }
                let (by, iy) = at(&batches, y);
                batches[by].events[iy] = moved;
            }
            Some(start(x))
        }
        Edit::FlipPayload(a, p, mask) => {
            // A byte of the packed blob itself, written as it is.
            let s = pick(a);
            let first = start(s);
            let body: Vec<u8> = conn
                .query_row(
                    "SELECT body FROM batches WHERE rk = (SELECT rk FROM runs WHERE run_id = ?1) AND first_seq = ?2",
                    params![run, first],
                    |r| r.get(0),
                )
                .unwrap();
            let mut flipped = body.clone();
            let i = ((p * body.len() as f64) as usize).min(body.len() - 1);
            flipped[i] ^= mask;
            conn.execute(
                "UPDATE batches SET body = ?3 WHERE rk = (SELECT rk FROM runs WHERE run_id = ?1) AND first_seq = ?2",
                params![run, first, flipped],
            )
            .unwrap();
            // The same to the byte: as text, with every key in its place (two JSON values
            // are equal whatever their keys' order; their encodings are not).
            let same = raw_batches(conn, run)
                .is_ok_and(|now| format!("{now:?}") == format!("{batches:?}"));
            return (!same).then_some(first);
        }
        Edit::Seq(a, k) => {
            let s = pick(a);
            let (b, _) = find(&batches, s);
            let shift = n + i64::from(k) - batches[b].first_seq;
            batches[b].first_seq += shift;
            batches[b].last_seq += shift;
            Some(start(s))
        }
        Edit::Time(a, d) => {
            let s = pick(a);
            let (b, i) = find(&batches, s);
            batches[b].events[i].at_us += d;
            Some(start(s))
        }
        Edit::Kind(a) => {
            let s = pick(a);
            let (b, i) = find(&batches, s);
            let kind = &mut batches[b].events[i].kind;
            *kind = if kind == "warning" { "heartbeat" } else { "warning" }.to_owned();
            Some(start(s))
        }
        Edit::Level(a) => {
            let s = pick(a);
            let (b, i) = find(&batches, s);
            let level = &mut batches[b].events[i].level_id;
            *level = if level.is_none() { Some("draft".to_owned()) } else { None };
            Some(start(s))
        }
        Edit::Attempt(a) => {
            let s = pick(a);
            let (b, i) = find(&batches, s);
            let attempt = &mut batches[b].events[i].attempt;
            *attempt = Some(attempt.map_or(1, |a| a + 1));
            Some(start(s))
        }
        Edit::Version(a) => {
            let s = pick(a);
            let (b, i) = find(&batches, s);
            let version = &mut batches[b].events[i].version;
            *version = if *version == 1 { 2 } else { 1 };
            Some(start(s))
        }
        Edit::Truncate(a, fix_last_seq) => {
            let keep = pick(a).min(n - 1);
            let (b, i) = find(&batches, keep);
            let at_end = keep == batches[b].last_seq;
            let first = batches[b].first_seq;
            batches.truncate(b + 1);
            batches[b].events.truncate(i + 1);
            batches[b].last_seq = keep;
            if fix_last_seq {
                conn.execute("UPDATE runs SET last_seq = ?2 WHERE run_id = ?1", params![run, keep])
                    .unwrap();
            }
            // A cut at the end of a batch leaves every batch whole: the run's record tells.
            Some(if at_end { keep + 1 } else { first })
        }
    };
    put_raw_batches(conn, run, &batches).unwrap();
    reported
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn verify_finds_every_single_event_edit_of_a_bundled_scenarios_log(
        which in 0usize..2,
        edit in edit_strategy(),
    ) {
        let (template, runs) = template();
        let dir = temp("edit");
        let db = dir.join("edited.db");
        std::fs::copy(template, &db).unwrap();
        let run = &runs[which];
        let expected = {
            let conn = Connection::open(&db).unwrap();
            let n = events_in(&conn, run);
            apply(&conn, run, n, &edit)
        };
        let out = baton_db(&db, &["verify"]);
        let stdout = text(&out.stdout);
        match expected {
            Some(seq) => {
                prop_assert_eq!(out.status.code(), Some(1), "{:?}: {}{}", edit, stdout, text(&out.stderr));
                let line = format!("damaged: run {run} at event {seq}: ");
                prop_assert!(stdout.contains(&line), "{:?}: expected `{}` in\n{}", edit, line, stdout);
                prop_assert_eq!(stdout.matches("damaged: run").count(), 1, "only the edited run: {}", stdout);
            }
            None => prop_assert_eq!(out.status.code(), Some(0), "{:?}: {}", edit, stdout),
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn a_damaged_run_is_neither_decided_on_nor_driven() {
    let dir = temp("refuse");
    let db = dir.join("baton.db");
    let run = run_bundled(&db, "release_notes", "v1.2");
    let conn = Connection::open(&db).unwrap();
    // The first model answer mentioning CSV, edited by hand inside its batch.
    let mut batches = baton_store::sqlite::raw_batches(&conn, &run).unwrap();
    let (b, i) = batches
        .iter()
        .enumerate()
        .find_map(|(b, batch)| {
            batch
                .events
                .iter()
                .position(|e| {
                    e.kind == "model_response"
                        && e.payload["text"].as_str().is_some_and(|t| t.contains("CSV"))
                })
                .map(|i| (b, i))
        })
        .unwrap();
    let edited = batches[b].events[i].payload["text"].as_str().unwrap().replace("CSV", "TSV");
    batches[b].events[i].payload["text"] = serde_json::Value::String(edited);
    let bad = batches[b].first_seq;
    baton_store::sqlite::put_raw_batches(&conn, &run, &batches).unwrap();
    let before = events_in(&conn, &run);
    let script = "scenarios/scripts/release_notes.yaml";
    for args in [
        vec!["approve", run.as_str(), "--by", "ann", "--script", script],
        vec!["approve", run.as_str(), "--reject", "--no-resume"],
        vec!["resume", run.as_str(), "--script", script],
        vec!["answer", run.as_str(), "--answer", "\"yes\""],
        vec!["cancel", run.as_str()],
    ] {
        let out = baton_db(&db, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}{err}", text(&out.stdout));
        assert!(
            err.contains(&format!("run {run} is damaged at event {bad}: events {bad} to ")),
            "{args:?}: {err}"
        );
        assert_eq!(events_in(&conn, &run), before, "{args:?} appended nothing");
    }
    // The run list still lists every run: the damaged one as damaged, saying where.
    let other = run_bundled(&db, "release_notes", "v1.3");
    let out = baton_db(&db, &["runs", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let status_of = |id: &str| {
        let row = rows.as_array().unwrap().iter().find(|r| r["run_id"] == id).unwrap();
        (row["status"].as_str().unwrap().to_owned(), row["damage"].as_str().map(str::to_owned))
    };
    let (status, damage) = status_of(&run);
    assert_eq!(status, "damaged");
    assert!(damage.unwrap().contains(&format!("damaged at event {bad}")));
    assert_eq!(status_of(&other), ("paused".to_owned(), None));
    let out = baton_db(&db, &["runs", "--status", "damaged"]);
    let listed = text(&out.stdout);
    assert!(listed.contains(&run) && !listed.contains(&other), "{listed}");
}

/// Runs `baton` and kills it if it has not ended within `limit`.
fn baton_within(db: &Path, args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .arg("--db")
        .arg(db)
        .current_dir(repo())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("BATON_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("baton {args:?} still ran after {limit:?} (spinning?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_hand_edited_last_seq_is_refused_not_spun_on() {
    let dir = temp("last-seq");
    let db = dir.join("baton.db");
    let run = run_bundled(&db, "release_notes", "v1.2");
    let out = baton_db(&db, &["approve", &run, "--no-resume"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let conn = Connection::open(&db).unwrap();
    let last = events_in(&conn, &run);
    conn.execute("UPDATE runs SET last_seq = last_seq + 2 WHERE run_id = ?1", [&run]).unwrap();
    let script = "scenarios/scripts/release_notes.yaml";
    let out = baton_within(&db, &["resume", &run, "--script", script], Duration::from_secs(30));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "run {run} is damaged at event {}: the event is missing: the run records {} events, its log ends at {last}",
            last + 1,
            last + 2
        )),
        "{err}"
    );
    assert_eq!(events_in(&conn, &run), last, "nothing was appended");
}

#[test]
fn a_backup_taken_while_runs_go_on_verifies_and_is_never_overwritten() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let dir = temp("backup");
    let db = dir.join("baton.db");
    run_bundled(&db, "quick_qa", "first");
    // Writers: other processes starting and finishing runs for as long as the backups go on.
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (db, stop, finished) = (db.clone(), Arc::clone(&stop), Arc::clone(&finished));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    run_bundled(&db, "quick_qa", &format!("writer {w}"));
                    finished.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    while finished.load(Ordering::SeqCst) < 2 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let copies: Vec<PathBuf> = (0..3)
        .map(|i| {
            let dest = dir.join(format!("copy-{i}.db"));
            let out = baton_db(&db, &["backup", dest.to_str().unwrap()]);
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            assert!(text(&out.stdout).contains("check the copy with `baton verify --db"));
            dest
        })
        .collect();
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.join().unwrap();
    }
    for dest in &copies {
        let out = baton_db(dest, &["verify", "--json"]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{report}");
        assert_eq!(report["ok"], true);
        assert!(report["runs"].as_array().unwrap().len() >= 3, "{report}");
    }
    let again = baton_db(&db, &["backup", copies[0].to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(text(&again.stderr).contains("already exists; a backup never overwrites"));
    let missing = baton_db(&dir.join("nothing.db"), &["verify"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("no database at"), "{}", text(&missing.stderr));
    assert!(!dir.join("nothing.db").exists(), "verify creates no database");
}

#[test]
fn verify_checks_the_scenario_versions_runs_are_pinned_to() {
    let dir = temp("pinned");
    let db = dir.join("baton.db");
    let notes = run_bundled(&db, "release_notes", "v1.2");
    let qa = run_bundled(&db, "quick_qa", "the capital of France?");
    let out = baton_db(&db, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    // A word of a stored template changed by hand: the version no longer hashes to its
    // checksum, and every run pinned to it is reported (the other is intact).
    let conn = Connection::open(&db).unwrap();
    let changed = conn
        .execute(
            "UPDATE scenario_texts SET texts = replace(texts, 'release', 'relapse') WHERE scenario_id = 'release_notes'",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let out = baton_db(&db, &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let finding = |id: &str| {
        report["runs"].as_array().unwrap().iter().find(|r| r["run_id"] == id).unwrap().clone()
    };
    let bad = finding(&notes);
    assert_eq!(bad["intact"], false, "{bad}");
    let problem = bad["problem"].as_str().unwrap();
    assert!(
        problem.starts_with("pinned to a damaged scenario version: the texts stored for "),
        "{problem}"
    );
    assert_eq!(finding(&qa)["intact"], true);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_run_record_that_disagrees_with_its_log_is_found_by_verify_and_the_log_decides() {
    let dir = temp("record-cache");
    let db = dir.join("baton.db");
    let run = run_bundled(&db, "release_notes", "v1.2");
    let out = baton_db(&db, &["verify", &run]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The record says the paused run completed: a cache that no longer matches the log.
    let conn = Connection::open(&db).unwrap();
    conn.execute("UPDATE runs SET status = 'completed' WHERE run_id = ?1", [&run]).unwrap();
    let out = baton_db(&db, &["verify", &run]);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("the run's record says `completed` but its log says `paused`"), "{said}");
    // The log decides: the approval it waits for is taken, and the run goes on to its end.
    let out = baton_db(&db, &["approve", &run, "--no-resume"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let script = "scenarios/scripts/release_notes.yaml";
    let out = baton_within(&db, &["resume", &run, "--script", script], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Its next events rewrote the record: the cache agrees again.
    let out = baton_db(&db, &["verify", &run]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
}

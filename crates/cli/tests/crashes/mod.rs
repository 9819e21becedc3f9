//! Crashes around the workspace, through the binary and the real SQLite store: a git
//! started by a killed Baton dies with it, a lock a dead git left is recovered on the next
//! open, a process still using the snapshot repository is waited for and then refused
//! with the run left resumable.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{baton_db, code_build_mid_level, events_of, scratch, snapshot_repo, text};

/// The live processes whose command line holds `needle`, with their command lines.
fn processes_naming(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let line = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if line.contains(needle) {
            found.push((pid, line));
        }
    }
    found
}

/// A scenario directory with one tool-loop level whose script calls `finish` at once.
fn one_tool_loop(dir: &Path) -> (PathBuf, PathBuf) {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).unwrap();
    std::fs::write(
        scenarios.join("edit.yaml"),
        "id: edit\nversion: 1\nlevels:\n  - id: work\n    kind: tool_loop\n    prompt: {inline: \"Do {{ input }}\"}\n    terminal: true\n",
    )
    .unwrap();
    let script = dir.join("script.yaml");
    std::fs::write(
        &script,
        "levels:\n  work:\n    - tool_calls:\n        - name: finish\n          arguments: {summary: done}\n",
    )
    .unwrap();
    (scenarios, script)
}

/// `baton run edit` on `workspace` (named with `--workspace`), in the background.
fn start_edit(dir: &Path, scenarios: &Path, script: &Path, workspace: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["--db", dir.join("runs.db").to_str().unwrap()])
        .args(["--scenarios", scenarios.to_str().unwrap(), "run", "edit", "--input", "it"])
        .args(["--script", script.to_str().unwrap(), "--workspace", workspace.to_str().unwrap()])
        .args(["--json"])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_git_started_by_a_killed_baton_does_not_survive_it() {
    let dir = scratch("crash-git-dies");
    let (scenarios, script) = one_tool_loop(&dir);
    // Enough incompressible bytes that `git add` of the run's base snapshot takes seconds.
    let workspace = dir.join("big");
    std::fs::create_dir_all(&workspace).unwrap();
    for f in 0..4 {
        let mut random =
            std::io::Read::take(std::fs::File::open("/dev/urandom").unwrap(), 16 << 20);
        let mut file = std::fs::File::create(workspace.join(format!("blob{f}"))).unwrap();
        std::io::copy(&mut random, &mut file).unwrap();
    }
    let repo = snapshot_repo(&dir, &workspace);
    let needle = repo.to_str().unwrap().to_owned();
    let mut child = start_edit(&dir, &scenarios, &script, &workspace);
    let deadline = Instant::now() + Duration::from_secs(30);
    let adding = loop {
        // Git itself (argv[0]), not setpriv before it became git: setpriv arms the signal
        // before it execs, so once git runs it dies with its starter.
        let adding: Vec<_> = processes_naming(&needle)
            .into_iter()
            .filter(|(_, l)| l.starts_with("git ") && l.contains(" add "))
            .collect();
        if !adding.is_empty() {
            break adding;
        }
        assert!(child.try_wait().unwrap().is_none(), "baton ended before its git add was seen");
        assert!(Instant::now() < deadline, "no git add was seen");
        std::thread::sleep(Duration::from_millis(2));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    // The kernel kills git with the thread that started it; give it a moment to act.
    let deadline = Instant::now() + Duration::from_millis(300);
    let mut left = processes_naming(&needle);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        left = processes_naming(&needle);
    }
    assert!(left.is_empty(), "git outlived the baton that started it: {left:?} (was {adding:?})");
    // Its lock is stale; the next run on the workspace removes it and says so (on fewer
    // files, to keep the test quick).
    let stale = repo.join("index.lock").exists();
    for f in 0..4 {
        std::fs::remove_file(workspace.join(format!("blob{f}"))).unwrap();
    }
    std::fs::write(workspace.join("small.txt"), "small\n").unwrap();
    let out = start_edit(&dir, &scenarios, &script, &workspace).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = events_of(&dir.join("runs.db"), result["run_id"].as_str().unwrap());
    let warned = events.iter().any(|e| {
        e["kind"] == "warning" && e["data"]["message"].as_str().unwrap().contains("stale lock")
    });
    assert_eq!(warned, stale, "a warning says so exactly when a stale lock was removed");
    assert!(!repo.join("index.lock").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_stale_index_lock_left_by_a_killed_driver_is_recovered_on_resume_and_the_run_completes() {
    let dir = scratch("crash-stale-lock");
    let (mut child, run, workspace) = code_build_mid_level(&dir);
    child.kill().unwrap();
    child.wait().unwrap();
    // What a git killed with its driver leaves: the index lock, and a ref lock.
    let repo = snapshot_repo(&dir, &workspace);
    std::fs::write(repo.join("index.lock"), "").unwrap();
    std::fs::write(repo.join("HEAD.lock"), "").unwrap();
    let db = dir.join("runs.db");
    let out = baton_db(&db, &["resume", &run, "--script", "scenarios/scripts/code_build.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!repo.join("index.lock").exists() && !repo.join("HEAD.lock").exists());
    let events = events_of(&db, &run);
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let warnings: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "warning")
        .filter_map(|e| e["data"]["message"].as_str())
        .filter(|m| m.contains("removed the stale lock"))
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_process_still_using_the_snapshot_repository_is_waited_for_then_refused_leaving_the_run_resumable()
 {
    let dir = scratch("crash-live-holder");
    let (mut child, run, workspace) = code_build_mid_level(&dir);
    child.kill().unwrap();
    child.wait().unwrap();
    let repo = snapshot_repo(&dir, &workspace);
    std::fs::write(repo.join("index.lock"), "").unwrap();
    // A git that did not die with its driver (one run by hand, say) still has it open.
    // (A shell waiting on its standard input: a builtin, no child to outlive it.)
    let mut holder = Command::new("sh")
        .args(["-c", "read line", "git", "--git-dir", repo.to_str().unwrap(), "add"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let db = dir.join("runs.db");
    let started = Instant::now();
    let out = baton_db(&db, &["resume", &run, "--script", "scenarios/scripts/code_build.yaml"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("still used by process {}", holder.id())), "{stderr}");
    assert!(started.elapsed() >= Duration::from_secs(4), "it waited for the process first");
    assert!(repo.join("index.lock").exists(), "a lock a live process may hold is kept");
    let events = events_of(&db, &run);
    assert!(events.iter().all(|e| e["kind"] != "scenario_finished"), "the run did not end");
    // Once the process is gone the run goes on.
    let out = baton_db(&db, &["resume", &run, "--script", "scenarios/scripts/code_build.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(events_of(&db, &run).last().unwrap()["data"]["status"], "completed");
    let _ = std::fs::remove_dir_all(dir);
}

/// The run list as JSON.
fn runs_json(db: &Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["runs", "--json"];
    args.extend_from_slice(extra);
    let out = baton_db(db, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

#[test]
fn a_run_whose_driver_died_is_listed_interrupted_with_the_command_that_continues_it() {
    let dir = scratch("crash-interrupted");
    let db = dir.join("runs.db");
    let (mut child, run, _workspace) = code_build_mid_level(&dir);
    // While it is driven it is running.
    let listed = runs_json(&db, &[]);
    assert_eq!(listed[0]["status"], "running", "{listed:?}");
    assert!(listed[0].get("continue_with").is_none());
    let out = baton_db(&db, &["runs"]);
    assert!(!text(&out.stdout).contains(" interrupted "), "{}", text(&out.stdout));
    child.kill().unwrap();
    child.wait().unwrap();
    let listed = runs_json(&db, &[]);
    assert_eq!(listed[0]["status"], "interrupted", "{listed:?}");
    assert_eq!(listed[0]["continue_with"], format!("baton resume {run}"));
    let out = baton_db(&db, &["runs"]);
    let shown = text(&out.stdout);
    assert!(shown.contains("interrupted"), "{shown}");
    assert!(shown.contains(&format!("continue it with `baton resume {run}`")), "{shown}");
    assert_eq!(runs_json(&db, &["--status", "interrupted"]).len(), 1);
    assert!(runs_json(&db, &["--status", "running"]).is_empty());
    // Asking did not take the run: it resumes to its end.
    let out = baton_db(&db, &["resume", &run, "--script", "scenarios/scripts/code_build.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(runs_json(&db, &[])[0]["status"], "completed");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn gc_removes_what_no_run_owns_and_never_a_named_workspace_or_anything_in_use() {
    let dir = scratch("gc");
    let db = dir.join("runs.db");
    let (scenarios, script) = one_tool_loop(&dir);
    // A run in a workspace the user named, and one in its own default workspace.
    let named = dir.join("project");
    std::fs::create_dir_all(&named).unwrap();
    std::fs::write(named.join("mine.txt"), "mine\n").unwrap();
    let out = start_edit(&dir, &scenarios, &script, &named).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["--db", db.to_str().unwrap(), "--scenarios", scenarios.to_str().unwrap()])
        .args(["run", "edit", "--input", "it", "--json", "--script", script.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let own: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let own_workspace = dir.join("workspaces").join(own["run_id"].as_str().unwrap());
    assert!(own_workspace.is_dir());
    let kept_snapshots: Vec<_> = std::fs::read_dir(dir.join("snapshots")).unwrap().collect();
    assert_eq!(kept_snapshots.len(), 2);
    // What a run killed before its first commit leaves: its workspace, its snapshot
    // repository and its lock file; the store never heard of it.
    let ghost = "0190a1b2-dead-7e5f-8a9b-0c1d2e3f4a5b";
    let ghost_workspace = dir.join("workspaces").join(ghost);
    std::fs::create_dir_all(&ghost_workspace).unwrap();
    std::fs::write(ghost_workspace.join("half.txt"), "half\n").unwrap();
    let ghost_key =
        baton_workspace::snapshot_key(&std::fs::canonicalize(&ghost_workspace).unwrap());
    let ghost_snapshots = dir.join("snapshots").join(&ghost_key);
    std::fs::create_dir_all(ghost_snapshots.join("git")).unwrap();
    std::fs::write(ghost_snapshots.join("lock"), "").unwrap();
    let locks = dir.join("runs.db.locks");
    std::fs::create_dir_all(&locks).unwrap();
    std::fs::write(locks.join(ghost), "").unwrap();
    // A link in the workspaces directory to a directory elsewhere: the link may go, never
    // what it points to.
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("keep.txt"), "keep\n").unwrap();
    let link = dir.join("workspaces").join("0190a1b2-link-7e5f-8a9b-0c1d2e3f4a5b");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    // A run being started right now (held by another process, not yet in the store): left
    // alone. The holder is another program taking a POSIX lock on the run's byte of
    // `runs.db.holds`, which Baton's own locks conflict with.
    let starting = "0190a1b2-busy-7e5f-8a9b-0c1d2e3f4a5b";
    std::fs::create_dir_all(dir.join("workspaces").join(starting)).unwrap();
    let holds = baton_store::run_holds::RunHolds::beside(&db);
    let byte = baton_store::run_holds::RunHolds::byte_of(starting);
    let mut holder = Command::new("python3")
        .args([
            "-c",
            "import fcntl, sys\nf = open(sys.argv[1], 'a+b')\nfcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(sys.argv[2]), 0)\nsys.stdin.readline()",
            holds.path().to_str().unwrap(),
            &byte.to_string(),
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !holds.is_held(starting).unwrap() {
        assert!(Instant::now() < deadline, "python never took the hold");
        std::thread::sleep(Duration::from_millis(10));
    }

    // Another database beside this one: whose leftovers are whose cannot be told.
    std::fs::create_dir_all(dir.join("other.db.locks")).unwrap();
    let out = baton_db(&db, &["gc", "--dry-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("other.db.locks"), "{}", text(&out.stderr));
    std::fs::remove_dir(dir.join("other.db.locks")).unwrap();
    std::fs::write(dir.join("other.db.holds"), "").unwrap();
    let out = baton_db(&db, &["gc", "--dry-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("other.db.holds"), "{}", text(&out.stderr));
    std::fs::remove_file(dir.join("other.db.holds")).unwrap();

    let out = baton_db(&db, &["gc", "--dry-run"]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}{}", text(&out.stderr));
    for path in [&ghost_workspace, &ghost_snapshots, &locks.join(ghost), &link] {
        assert!(shown.contains(&format!("would remove {}", path.display())), "{shown}");
        assert!(std::fs::symlink_metadata(path).is_ok(), "a dry run removes nothing");
    }
    assert_eq!(shown.lines().count(), 4, "{shown}");

    let out = baton_db(&db, &["gc"]);
    let shown = text(&out.stdout);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(0), "{shown}{}", text(&out.stderr));
    for path in [&ghost_workspace, &ghost_snapshots, &locks.join(ghost), &link] {
        assert!(shown.contains(&format!("removed {}", path.display())), "{shown}");
        assert!(std::fs::symlink_metadata(path).is_err(), "{} is still there", path.display());
    }
    assert_eq!(std::fs::read_to_string(elsewhere.join("keep.txt")).unwrap(), "keep\n");
    assert_eq!(std::fs::read_to_string(named.join("mine.txt")).unwrap(), "mine\n");
    assert!(own_workspace.is_dir(), "a run's own workspace stays");
    assert!(dir.join("workspaces").join(starting).is_dir(), "a workspace in use stays");
    for kept in kept_snapshots {
        assert!(kept.unwrap().path().join("git").is_dir(), "the runs' snapshots stay");
    }
    // Once its holder is gone, what it left goes too; then nothing is left to remove.
    let out = baton_db(&db, &["gc"]);
    let shown = text(&out.stdout);
    let starting_workspace = dir.join("workspaces").join(starting);
    assert!(shown.contains(&format!("removed {}", starting_workspace.display())), "{shown}");
    assert_eq!(text(&baton_db(&db, &["gc"]).stdout).trim(), "nothing to remove");
    let _ = std::fs::remove_dir_all(dir);
}

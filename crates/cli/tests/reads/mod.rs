//! Bounded reads through the `baton` binary: every file a user names is read with a byte
//! cap, and what is not a regular file (a named pipe, `/dev/zero`, a directory, a symlink
//! to one of them) is refused at once with a message naming it, never read or waited on.
//! Every command here runs under a deadline, so a read that blocks fails the test instead
//! of hanging it, and under an address-space limit, so a read that grows without bound
//! fails it too.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{repo, scratch, text};

/// How long a refusal may take; a blocked open or an endless read takes forever.
const DEADLINE: Duration = Duration::from_secs(10);
/// The address space the command may use: far more than it needs to refuse a file, far
/// less than reading `/dev/zero` or a 1 GB file into memory takes.
const ADDRESS_SPACE_MAX: &str = "2147483648";

/// Runs `baton ARGS` (from the repository, with `--db DB`) under [`DEADLINE`] and
/// [`ADDRESS_SPACE_MAX`]; a command still running at the deadline is killed and fails the
/// test.
fn baton_bounded(db: &Path, args: &[&str]) -> Output {
    baton_bounded_in(&repo(), db, args)
}

/// [`baton_bounded`] from the directory `cwd`.
fn baton_bounded_in(cwd: &Path, db: &Path, args: &[&str]) -> Output {
    let dir = db.parent().unwrap();
    let stdout = dir.join("stdout");
    let stderr = dir.join("stderr");
    let mut child = Command::new("prlimit")
        .arg(format!("--as={ADDRESS_SPACE_MAX}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_baton"))
        .arg("--db")
        .arg(db)
        .args(args)
        .current_dir(cwd)
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("BATON_CONFIG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, args, "it blocked on a read");
    Output {
        status,
        stdout: std::fs::read(stdout).unwrap(),
        stderr: std::fs::read(stderr).unwrap(),
    }
}

/// Waits for `child` at most [`DEADLINE`]; one still running then is killed and fails the
/// test, saying `why`.
fn wait_bounded(
    child: &mut std::process::Child,
    args: &[&str],
    why: &str,
) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`baton {}` still ran after {DEADLINE:?}: {why}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes a named pipe at `path` (nobody ever writes to it).
fn fifo(path: &Path) -> PathBuf {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
    path.to_path_buf()
}

/// Asserts that `out` is a refusal (exit 1, no panic) whose message names `path` and says
/// what it is.
fn assert_refused(out: &Output, path: &Path, what: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}{err}", text(&out.stdout));
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(&path.display().to_string()), "the message names the file: {err}");
    assert!(err.contains(what), "the message says `{what}`: {err}");
}

const SCRIPT: &str = "scenarios/scripts/quick_qa.yaml";

#[test]
fn validate_refuses_a_named_pipe_at_once() {
    let dir = scratch("reads-validate-fifo");
    let db = dir.join("baton.db");
    let pipe = fifo(&dir.join("pipe.yaml"));
    let out = baton_bounded(&db, &["validate", pipe.to_str().unwrap()]);
    assert_refused(&out, &pipe, "named pipe (FIFO), not a regular file");
    // In a directory of scenarios, a pipe named like one is an error, not skipped.
    let out = baton_bounded(&db, &["validate", dir.to_str().unwrap()]);
    assert_refused(&out, &pipe, "named pipe (FIFO), not a regular file");
}

#[test]
fn a_prompt_that_is_a_named_pipe_is_refused_at_once() {
    let dir = scratch("reads-prompt-fifo");
    let db = dir.join("baton.db");
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(scenarios.join("prompts")).unwrap();
    std::fs::write(
        scenarios.join("piped.yaml"),
        "id: piped\nversion: 1\nlevels:\n  - id: answer\n    kind: prompt\n    prompt: prompts/p.j2\n    terminal: true\nedges:\n  - {from: answer, to: __end__}\n",
    )
    .unwrap();
    fifo(&scenarios.join("prompts/p.j2"));
    let out = baton_bounded(&db, &["validate", scenarios.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("`prompts/p.j2` is a named pipe (FIFO), not a regular file"), "{err}");
    assert!(err.contains("piped.yaml"), "the message says where it is used: {err}");
}

#[test]
fn an_input_file_linked_to_dev_zero_is_refused_without_reading_it() {
    let dir = scratch("reads-input-zero");
    let db = dir.join("baton.db");
    let link = dir.join("input.txt");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let l = link.to_str().unwrap();
    let out = baton_bounded(&db, &["run", "quick_qa", "--input-file", l, "--script", SCRIPT]);
    assert_refused(&out, &link, "character device, not a regular file");
    assert!(!db.exists(), "nothing was created for a refused input");
}

#[test]
fn a_sparse_gigabyte_input_file_is_refused_as_too_large() {
    let dir = scratch("reads-input-sparse");
    let db = dir.join("baton.db");
    let big = dir.join("input.txt");
    std::fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
    let b = big.to_str().unwrap();
    let out = baton_bounded(&db, &["run", "quick_qa", "--input-file", b, "--script", SCRIPT]);
    assert_refused(&out, &big, "is larger than 4 MiB");
    assert!(!db.exists(), "nothing was created for a refused input");
}

#[test]
fn a_directory_given_as_a_file_is_refused() {
    let dir = scratch("reads-input-dir");
    let db = dir.join("baton.db");
    let d = dir.to_str().unwrap();
    let out = baton_bounded(&db, &["run", "quick_qa", "--input-file", d, "--script", SCRIPT]);
    assert_refused(&out, &dir, "directory, not a regular file");
}

#[test]
fn script_config_cassette_and_state_pipes_are_refused_at_once() {
    let dir = scratch("reads-option-fifos");
    let db = dir.join("baton.db");
    let script = fifo(&dir.join("script.yaml"));
    let s = script.to_str().unwrap();
    let out = baton_bounded(&db, &["run", "quick_qa", "--input", "q", "--script", s]);
    assert_refused(&out, &script, "named pipe (FIFO)");

    let json_script = fifo(&dir.join("script.json"));
    let j = json_script.to_str().unwrap();
    let out = baton_bounded(&db, &["run", "quick_qa", "--input", "q", "--script", j]);
    assert_refused(&out, &json_script, "named pipe (FIFO)");

    let cassette = fifo(&dir.join("cassette.json"));
    let c = cassette.to_str().unwrap();
    let out = baton_bounded(&db, &["run", "quick_qa", "--input", "q", "--cassette", c]);
    assert_refused(&out, &cassette, "named pipe (FIFO)");

    let config = fifo(&dir.join("baton.toml"));
    let t = config.to_str().unwrap();
    let out = baton_bounded(&db, &["--config", t, "run", "quick_qa", "--input", "q"]);
    assert_refused(&out, &config, "named pipe (FIFO)");
    let out = baton_bounded(&db, &["--config", t, "validate"]);
    assert_refused(&out, &config, "named pipe (FIFO)");

    let state = fifo(&dir.join("state.json"));
    let st = state.to_str().unwrap();
    let out = baton_bounded(&db, &["expr", "verdict == 'PASS'", "--state", st]);
    assert_refused(&out, &state, "named pipe (FIFO)");
    assert!(!db.exists(), "no run was created for a refused file");
}

/// Runs `baton --db DB ARGS` with standard output a pipe whose reader is already gone, as
/// in `baton … | head` once `head` has read its lines.
fn baton_into_closed_pipe(db: &Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let dir = db.parent().unwrap();
    let stderr = dir.join("stderr");
    let mut child = super::baton_command()
        .arg("--db")
        .arg(db)
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, args, "with stdout closed");
    Output { status, stdout: Vec::new(), stderr: std::fs::read(stderr).unwrap() }
}

#[test]
fn a_closed_stdout_ends_every_command_quietly_with_its_usual_code() {
    let dir = scratch("reads-closed-stdout");
    let db = dir.join("baton.db");
    let quiet = |args: &[&str], code: i32| {
        let out = baton_into_closed_pipe(&db, args);
        let err = text(&out.stderr);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    };
    // A run whose timeline nobody reads is still driven to its end.
    quiet(&["run", "quick_qa", "--input", "q", "--script", SCRIPT], 0);
    quiet(
        &[
            "run",
            "release_notes",
            "--input",
            "v1",
            "--script",
            "scenarios/scripts/release_notes.yaml",
        ],
        3,
    );
    let listed = super::baton_db(&db, &["runs", "--json"]);
    let runs: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let completed = runs.iter().find(|r| r["status"] == "completed").unwrap();
    let run = completed["run_id"].as_str().unwrap();
    quiet(&["schema"], 0);
    quiet(&["validate"], 0);
    quiet(&["graph", "code_build"], 0);
    quiet(&["runs"], 0);
    quiet(&["runs", "--json"], 0);
    quiet(&["events", run], 0);
    quiet(&["events", run, "--json"], 0);
    quiet(&["events", run, "--follow"], 0);
    quiet(&["cassette", "export", run], 0);
    quiet(&["verify"], 0);
    quiet(&["expr", "1 == 1"], 0);
}

/// The run ids `baton runs --json` lists.
fn stored_runs(db: &Path) -> Vec<String> {
    let out = super::baton_db(db, &["runs", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    runs.as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn a_run_that_cannot_start_prints_no_run_id_and_leaves_no_run() {
    let dir = scratch("reads-no-run");
    let db = dir.join("baton.db");
    // An input that cannot be read: nothing is created at all.
    let out = super::baton_db(
        &db,
        &["run", "quick_qa", "--input-file", "/nonexistent/input.txt", "--script", SCRIPT],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("/nonexistent/input.txt does not exist"));
    assert_eq!(text(&out.stdout), "", "no run id is printed");
    assert!(!db.exists(), "no database was created for a run that never started");

    // A workspace that cannot be opened stops the run before its first event is stored:
    // no run id may be printed for it.
    let not_a_dir = dir.join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let out = super::baton_db(
        &db,
        &[
            "run",
            "code_build",
            "--input",
            "x",
            "--script",
            "scenarios/scripts/code_build.yaml",
            "--workspace",
            not_a_dir.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("workspace"), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("run "), "a run id was printed: {}", text(&out.stdout));
    assert_eq!(stored_runs(&db), Vec::<String>::new());

    // A run that starts prints its id first, and the store holds that run.
    let out = super::baton_db(&db, &["run", "quick_qa", "--input", "q", "--script", SCRIPT]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let printed = stdout.lines().next().and_then(|l| l.strip_prefix("run ")).unwrap();
    assert_eq!(stored_runs(&db), vec![printed.to_owned()]);
}

#[test]
fn a_baton_toml_in_the_working_directory_that_is_a_pipe_is_refused_not_skipped() {
    let dir = scratch("cwd-config-fifo");
    let db = dir.join("runs.db");
    fifo(&dir.join("baton.toml"));
    let config = Path::new("baton.toml");
    let scenarios = repo().join("scenarios");
    let s = scenarios.to_str().unwrap();
    let out = baton_bounded_in(&dir, &db, &["--scenarios", s, "validate"]);
    assert_refused(&out, config, "named pipe (FIFO)");
    let out = baton_bounded_in(&dir, &db, &["--scenarios", s, "run", "quick_qa", "--input", "q"]);
    assert_refused(&out, config, "named pipe (FIFO)");
}

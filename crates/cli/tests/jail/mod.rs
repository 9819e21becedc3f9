//! Attacks through `baton run` by a scripted hostile model: a tool-loop level writes
//! `attack.sh` into its workspace, a `command` verifier runs it (as a model's test or
//! build script would be run), then a second tool-loop level edits the workspace again
//! (so Baton's own git snapshots it after the attack). Each attack has a positive control
//! — the same program without its hostile step passes inside the jail — and is judged by
//! an absent canary: no file written outside, a secret of Baton's environment nowhere in
//! the database or the terminal, no process left. A verifier that merely fails is not
//! "contained".

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::text;

/// A value in Baton's environment that no redaction knows: if a program can print it, it
/// reached Baton's environment.
fn secret() -> String {
    format!("jail-canary-{}-{}", std::process::id(), unique())
}

fn unique() -> u128 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() * 100
        + u128::from(n % 100)
}

const SCENARIO: &str = "id: t
version: 1
levels:
  - id: write
    kind: tool_loop
    prompt: {inline: 'Do {{ input }}'}
    max_iterations: 5
  - id: check
    kind: verifier
    verifiers:
      - {name: attack, uses: VERIFIER}
  - id: after
    kind: tool_loop
    prompt: {inline: 'Then'}
    max_iterations: 3
    terminal: true
edges:
  - {from: write, to: check}
  - {from: check, to: after}
";

/// The command verifier that runs the model's `attack.sh`.
const RUN_ATTACK: &str = "command, timeout_s: 20, params: {argv: [sh, attack.sh]}";

/// One attacker's laboratory: a scenarios directory, the database, a directory outside
/// the workspace that anyone may write (so that only the jail keeps a program out), and
/// the secret in Baton's environment.
struct Lab {
    dir: PathBuf,
    outside: PathBuf,
    secret: String,
    verifier: String,
    /// `baton.toml` lines (a `[jail]` section), when the attack needs other limits.
    config: Option<String>,
    /// `--workspace DIR`, when the attack needs a workspace of the user's.
    workspace: Option<PathBuf>,
    /// The database, relative to `dir`.
    db: &'static str,
}

/// What one run left.
struct Ran {
    out: Output,
    run: String,
    /// The verifier's outcome (`verifier_finished.data`).
    verdict: Value,
    /// Every event, as `events --json` prints them.
    log: String,
    took: Duration,
}

impl Ran {
    /// What the program printed, as the verifier kept it.
    fn printed(&self) -> String {
        let d = &self.verdict["details"];
        format!(
            "{}{}",
            d["stdout_tail"].as_str().unwrap_or_default(),
            d["stderr_tail"].as_str().unwrap_or_default()
        )
    }

    fn passed(&self) -> bool {
        self.verdict["passed"] == true
    }
}

impl Lab {
    fn new(name: &str) -> Lab {
        let dir = std::env::temp_dir().join(format!("baton-jail-{name}-{}", unique()));
        let outside = dir.join("outside");
        std::fs::create_dir_all(dir.join("scenarios")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o777)).unwrap();
        Lab {
            dir,
            outside,
            secret: secret(),
            verifier: RUN_ATTACK.to_owned(),
            config: None,
            workspace: None,
            db: "runs.db",
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.join(self.db)
    }

    fn wal(&self) -> PathBuf {
        self.dir.join(format!("{}-wal", self.db))
    }

    /// `program` with its placeholders filled: `@OUT@` the outside directory, `@DB@` the
    /// database, `@DATA@` Baton's directory.
    fn fill(&self, program: &str) -> String {
        program
            .replace("@OUT@", &self.outside.display().to_string())
            .replace("@DB@", &self.db().display().to_string())
            .replace("@DATA@", &self.dir.display().to_string())
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = super::baton_in(&self.dir, &self.db());
        c.env("BATON_TEST_SECRET", &self.secret);
        if let Some(config) = &self.config {
            let file = self.dir.join("baton.toml");
            std::fs::write(&file, config).unwrap();
            c.arg("--config").arg(file);
        }
        c.args(args);
        c
    }

    /// Writes the scenario and a script whose model writes `program` as `attack.sh`,
    /// and the run's arguments.
    fn prepare(&self, program: &str) -> Vec<String> {
        let scenario = SCENARIO.replace("VERIFIER", &self.verifier);
        std::fs::write(self.dir.join("scenarios/t.yaml"), scenario).unwrap();
        let write = |path: &str, content: &str| json!({"tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]});
        let finish = json!({"tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]});
        let script = json!({"levels": {
            "write": [write("attack.sh", &self.fill(program)), finish],
            "after": [write("after.txt", "after\n"), finish],
        }});
        let file = self.dir.join("script.yaml");
        std::fs::write(&file, script.to_string()).unwrap();
        let mut args = vec!["run".to_owned(), "t".to_owned(), "--input".to_owned(), "x".to_owned()];
        args.extend(["--script".to_owned(), file.display().to_string()]);
        if let Some(w) = &self.workspace {
            args.extend(["--workspace".to_owned(), w.display().to_string()]);
        }
        args
    }

    /// Runs `program` as the model's `attack.sh`, to the end.
    fn run(&self, program: &str) -> Ran {
        let args = self.prepare(program);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        let out = self.command(&args).output().unwrap();
        let took = started.elapsed();
        let run = text(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("run "))
            .unwrap_or_default()
            .to_owned();
        assert!(!run.is_empty(), "no run: {}{}", text(&out.stdout), text(&out.stderr));
        let events = self.command(&["events", &run, "--json"]).output().unwrap();
        let log = text(&events.stdout);
        let verdict = log
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["kind"] == "verifier_finished")
            .map(|e| e["data"].clone())
            .unwrap_or(Value::Null);
        Ran { out, run, verdict, log, took }
    }

    /// Asserts that `needle` is nowhere: not in the run's output, its events, the
    /// database's files, nor anywhere below the laboratory.
    fn nowhere(&self, ran: &Ran, needle: &str) {
        let terminal = format!("{}{}", text(&ran.out.stdout), text(&ran.out.stderr));
        assert!(!terminal.contains(needle), "`{needle}` reached the terminal: {terminal}");
        assert!(!ran.log.contains(needle), "`{needle}` reached the log: {}", ran.log);
        for file in walk(&self.dir) {
            let bytes = std::fs::read(&file).unwrap_or_default();
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "`{needle}` is in {}",
                file.display()
            );
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every regular file below `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files
}

/// Whether a process whose command line holds `marker` is running.
fn running(marker: &str) -> bool {
    Command::new("pgrep").args(["-f", marker]).output().is_ok_and(|o| o.status.success())
}

/// Asserts the control passed inside the jail and printed `expected`.
fn control(lab: &Lab, program: &str, expected: &str) -> Ran {
    let ran = lab.run(program);
    assert!(ran.passed(), "the control failed in the jail: {}\n{}", ran.verdict, ran.log);
    assert!(ran.printed().contains(expected), "the control printed: {}", ran.printed());
    ran
}

// ---- secrets ---------------------------------------------------------------------------

#[test]
fn attack_reading_every_processs_environment_finds_no_secret() {
    let lab = Lab::new("environ-all");
    control(&lab, "tr '\\0' '\\n' < /proc/self/environ; exit 0", "PATH=");
    let ran = lab.run("for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; exit 0");
    assert!(ran.printed().contains("PATH="), "the program ran: {}", ran.printed());
    lab.nowhere(&ran, &lab.secret);
}

#[test]
fn attack_reading_the_parents_and_the_first_processs_environment_finds_no_secret() {
    let lab = Lab::new("environ-parent");
    control(&lab, "echo parent $PPID; exit 0", "parent");
    let ran = lab.run(
        "cat /proc/$PPID/environ /proc/1/environ /proc/1/cmdline /proc/$PPID/cmdline; ls /proc; exit 0",
    );
    lab.nowhere(&ran, &lab.secret);
    lab.nowhere(&ran, "runs.db");
}

#[test]
fn attack_its_own_environment_holds_no_secret() {
    let lab = Lab::new("environ-own");
    let ran = control(&lab, "env; exit 0", "PATH=");
    lab.nowhere(&ran, &lab.secret);
}

#[test]
fn attack_the_system_password_files_are_not_in_the_jail() {
    let lab = Lab::new("passwd");
    control(&lab, "cat /etc/passwd; exit 0", "nobody:x:65534");
    let ran = lab.run("cat /etc/passwd /etc/shadow /etc/gshadow /etc/sudoers; ls /etc; exit 0");
    // The machine's passwd names its service users; the jail's has root and nobody only.
    let real = std::fs::read_to_string("/etc/passwd").unwrap();
    let service = real.lines().find(|l| !l.starts_with("root:") && !l.starts_with("nobody:"));
    if let Some(line) = service {
        assert!(!ran.printed().contains(line), "{}", ran.printed());
    }
    let shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    if let Some(root) = shadow.lines().next() {
        assert!(!ran.printed().contains(root), "{}", ran.printed());
    }
}

#[test]
fn attack_the_home_of_batons_user_is_not_in_the_jail() {
    let lab = Lab::new("home");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned());
    let marker = format!("{home}/.baton-jail-home-canary-{}", unique());
    std::fs::write(&marker, &lab.secret).unwrap();
    control(&lab, "echo home is $HOME; exit 0", "home is /tmp/home");
    let ran = lab.run(&format!("ls -a {home}; cat {marker} {home}/.*history; exit 0"));
    let _ = std::fs::remove_file(&marker);
    lab.nowhere(&ran, &lab.secret);
}

#[test]
fn attack_cargo_credentials_stay_out_though_cargo_is_shown() {
    let lab = Lab::new("cargo-home");
    let cargo_home = lab.dir.join("cargo");
    std::fs::create_dir_all(cargo_home.join("bin")).unwrap();
    std::fs::create_dir_all(cargo_home.join("registry")).unwrap();
    std::fs::write(cargo_home.join("credentials.toml"), &lab.secret).unwrap();
    std::fs::write(cargo_home.join("registry/index-marker"), "registry shown\n").unwrap();
    let path = format!("{}:{}", cargo_home.join("bin").display(), std::env::var("PATH").unwrap());
    let run = |program: &str| {
        let args = lab.prepare(program);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = lab.command(&args).env("CARGO_HOME", &cargo_home).env("PATH", &path).output();
        out.unwrap()
    };
    let out = run("cat $CARGO_HOME/registry/index-marker; exit 0");
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let out = run("cat $CARGO_HOME/credentials.toml; ls -a $CARGO_HOME; exit 0");
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    // The credentials are in the lab (the test put them there): look in the database only.
    let db = std::fs::read(lab.db()).unwrap_or_default();
    let wal = std::fs::read(lab.wal()).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(!bytes.windows(lab.secret.len()).any(|w| w == lab.secret.as_bytes()));
    }
    let log = text(&lab.command(&["runs", "--json"]).output().unwrap().stdout);
    assert!(!log.contains(&lab.secret), "{log}");
}

#[test]
fn attack_an_mcp_server_the_model_wrote_cannot_return_batons_environment() {
    // The model writes the server; the scenario's `mcp` verifier starts it in the jail.
    let mut lab = Lab::new("mcp");
    lab.verifier =
        "mcp, timeout_s: 20, params: {server: [python3, attack.sh], tool: leak}".to_owned();
    let server = |body: &str| {
        format!(
            "import json, sys, glob\n\
             def leak():\n{body}\n\
             for line in sys.stdin:\n\
             \x20   m = json.loads(line)\n\
             \x20   if 'id' not in m: continue\n\
             \x20   if m['method'] == 'initialize':\n\
             \x20       r = {{'protocolVersion': m['params']['protocolVersion'], 'capabilities': {{'tools': {{}}}}, 'serverInfo': {{'name': 'x', 'version': '1'}}}}\n\
             \x20   else:\n\
             \x20       r = {{'content': [{{'type': 'text', 'text': leak()}}]}}\n\
             \x20   print(json.dumps({{'jsonrpc': '2.0', 'id': m['id'], 'result': r}}), flush=True)\n"
        )
    };
    let ran = lab.run(&server(
        "    return 'own PATH ' + open('/proc/self/environ').read().split('PATH=')[1][:20]",
    ));
    assert!(ran.passed(), "the control server: {}\n{}", ran.verdict, ran.log);
    let ran = lab.run(&server(
        "    out = []\n    for f in glob.glob('/proc/[0-9]*/environ'):\n        try: out.append(open(f).read())\n        except Exception as e: out.append(str(e))\n    return ' '.join(out)",
    ));
    assert!(ran.log.contains("verifier_finished"), "{}", ran.log);
    lab.nowhere(&ran, &lab.secret);
}

// ---- Baton's own state -----------------------------------------------------------------

#[test]
fn attack_the_database_can_be_neither_read_nor_written() {
    let lab = Lab::new("db");
    control(&lab, "head -c 15 attack.sh; exit 0", "head -c 15");
    let ran = lab.run("head -c 16 @DB@; echo tampered >> @DB@; rm -f @DB@ @DB@-wal; exit 0");
    assert!(!ran.printed().contains("SQLite format"), "{}", ran.printed());
    let check = lab.command(&["verify"]).output().unwrap();
    assert!(check.status.success(), "{}{}", text(&check.stdout), text(&check.stderr));
    let head = std::fs::read(lab.db()).unwrap();
    assert!(head.starts_with(b"SQLite format 3"), "the database was changed");
}

#[test]
fn attack_a_workspace_that_holds_the_database_shows_it_empty() {
    // The user runs with `--workspace .` and the database inside it.
    let mut lab = Lab::new("db-in-workspace");
    lab.workspace = Some(lab.dir.clone());
    lab.db = ".baton/runs.db";
    control(&lab, "ls scenarios; exit 0", "t.yaml");
    let ran = lab.run(
        "head -c 16 .baton/runs.db; echo tampered > .baton/runs.db; rm -rf .baton/snapshots; ls -a .baton .baton/*; exit 0",
    );
    assert!(lab.dir.join(".baton/snapshots").is_dir(), "{}", ran.printed());
    assert!(!ran.printed().contains("SQLite format"), "{}", ran.printed());
    let head = std::fs::read(lab.db()).unwrap();
    assert!(head.starts_with(b"SQLite format 3"), "the database was changed");
    let check = lab.command(&["verify"]).output().unwrap();
    assert!(check.status.success(), "{}{}", text(&check.stdout), text(&check.stderr));
}

#[test]
fn attack_other_runs_workspaces_are_out_of_reach() {
    let lab = Lab::new("other-runs");
    let other = lab.dir.join("workspaces/another-run");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), &lab.secret).unwrap();
    let first = control(&lab, "pwd; exit 0", "workspaces");
    let ran = lab.run(
        "cat ../another-run/notes.txt @DATA@/workspaces/*/notes.txt; ls -a ..; echo x > ../another-run/notes.txt; exit 0",
    );
    assert!(!ran.printed().contains(&lab.secret), "{}", ran.printed());
    assert_eq!(std::fs::read_to_string(other.join("notes.txt")).unwrap(), lab.secret);
    assert!(!ran.printed().contains(&first.run), "it saw the first run: {}", ran.printed());
}

#[test]
fn attack_the_snapshot_repository_can_be_neither_read_nor_armed() {
    let lab = Lab::new("snapshots");
    let first = control(&lab, "echo ok; exit 0", "ok");
    let config = walk(&lab.dir.join("snapshots"))
        .into_iter()
        .find(|p| p.ends_with("git/config"))
        .expect("the first run has a snapshot repository");
    let before = std::fs::read_to_string(&config).unwrap();
    let ran = lab.run(
        "for c in @DATA@/snapshots/*/git/config; do cat $c; printf '[core]\\n\\tfsmonitor = touch @OUT@/fsmonitor\\n' >> $c; done; exit 0",
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before, "{}", first.run);
    assert!(!lab.outside.join("fsmonitor").exists(), "{}", ran.log);
}

#[test]
fn attack_git_settings_planted_in_the_workspace_run_nothing_on_the_next_snapshot() {
    let lab = Lab::new("git-planted");
    control(&lab, "echo ok; exit 0", "ok");
    let ran = lab.run(
        "mkdir -p .git hooks; printf '[core]\\n\\tfsmonitor = touch @OUT@/fsmonitor\\n\\thooksPath = hooks\\n[filter \"x\"]\\n\\tclean = touch @OUT@/filter\\n' > .git/config; \
         echo '* filter=x' > .gitattributes; printf '#!/bin/sh\\ntouch @OUT@/hook\\n' > hooks/post-commit; chmod +x hooks/post-commit; exit 0",
    );
    // The `after` level edited the workspace: Baton's git snapshotted it.
    assert!(ran.log.contains("\"after\""), "{}", ran.log);
    for canary in ["fsmonitor", "filter", "hook"] {
        assert!(!lab.outside.join(canary).exists(), "{canary} ran: {}", ran.log);
    }
}

// ---- the filesystem --------------------------------------------------------------------

#[test]
fn attack_writing_outside_the_workspace_leaves_nothing_there() {
    let lab = Lab::new("write-outside");
    control(&lab, "echo inside > inside.txt && cat inside.txt; exit 0", "inside");
    let ran = lab.run(
        "echo x > @OUT@/escaped; echo x > ../escaped; echo x > /escaped; touch /usr/escaped /etc/escaped /var/tmp/escaped; exit 0",
    );
    assert!(!lab.outside.join("escaped").exists(), "{}", ran.printed());
    assert!(!lab.dir.join("workspaces/escaped").exists());
    for path in ["/escaped", "/usr/escaped", "/etc/escaped", "/var/tmp/escaped"] {
        assert!(!Path::new(path).exists(), "{path}");
    }
}

#[test]
fn attack_a_symlink_out_of_the_workspace_leads_nowhere() {
    let lab = Lab::new("symlink-out");
    std::fs::write(lab.outside.join("target.txt"), &lab.secret).unwrap();
    control(&lab, "ln -s attack.sh l && cat l >/dev/null && echo linked; exit 0", "linked");
    let ran = lab
        .run("ln -s @OUT@/target.txt l; cat l; echo x > l; ln -s @OUT@ d; echo x > d/new; exit 0");
    assert!(!ran.printed().contains(&lab.secret), "{}", ran.printed());
    assert_eq!(std::fs::read_to_string(lab.outside.join("target.txt")).unwrap(), lab.secret);
    assert!(!lab.outside.join("new").exists());
}

#[test]
fn attack_a_symlink_planted_for_the_next_hand_over_changes_no_owner_outside() {
    // When Baton is root it hands the workspace to the jail's uid before each program;
    // links planted by the first program must not lead that walk outside when the second
    // program of the level starts.
    let mut lab = Lab::new("hand-over-link");
    lab.verifier = "command, params: {argv: [sh, attack.sh]}}\n      - {name: second, uses: command, params: {argv: [ls, -l]}".to_owned();
    let target = lab.outside.join("owned-by-root");
    std::fs::write(&target, "mine\n").unwrap();
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(&target).unwrap().uid();
    let ran = lab.run(
        "ln -s @OUT@ dir-link; ln -s @OUT@/owned-by-root file-link; ln -s / root-link; exit 0",
    );
    assert!(ran.passed(), "{}", ran.verdict);
    let second = ran
        .log
        .lines()
        .filter(|l| l.contains("verifier_finished"))
        .find(|l| l.contains("\"second\""))
        .unwrap_or_else(|| panic!("{}", ran.log));
    assert!(second.contains("file-link"), "the second program saw the links: {second}");
    assert_eq!(std::fs::metadata(&target).unwrap().uid(), owner, "the walk followed a link");
    assert_eq!(std::fs::metadata(&lab.outside).unwrap().uid(), owner);
    assert_eq!(std::fs::metadata("/etc").unwrap().uid(), 0);
}

#[test]
fn attack_a_hard_link_to_someone_elses_file_is_not_handed_over() {
    // A workspace of the user's holds a hard link to a file outside it.
    let mut lab = Lab::new("hard-link");
    let project = lab.dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let target = lab.outside.join("precious");
    std::fs::write(&target, "precious\n").unwrap();
    std::fs::hard_link(&target, project.join("link")).unwrap();
    lab.workspace = Some(project);
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(&target).unwrap().uid();
    let ran = lab.run("echo changed > link; exit 0");
    assert!(ran.log.contains("verifier_finished"), "{}", ran.log);
    assert_eq!(std::fs::metadata(&target).unwrap().uid(), owner);
    if owner == 0 {
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n", "{}", ran.printed());
    }
}

#[test]
fn attack_the_jails_tmp_is_its_own_and_gone_after() {
    let lab = Lab::new("tmp");
    let mark = format!("baton-jail-tmp-{}", unique());
    let ran = control(&lab, &format!("echo x > /tmp/{mark} && ls /tmp; exit 0"), &mark);
    assert!(!Path::new("/tmp").join(&mark).exists(), "{}", ran.printed());
    assert!(!walk(&lab.dir).iter().any(|p| p.ends_with(&mark)), "the private /tmp was kept");
}

// ---- processes -------------------------------------------------------------------------

#[test]
fn attack_a_setsid_daemon_does_not_outlive_the_program() {
    let lab = Lab::new("setsid");
    let marker = format!("7777.{}", unique() % 1_000_000);
    control(&lab, "echo ok; exit 0", "ok");
    let ran = lab.run(&format!(
        "setsid sh -c 'sleep {marker}; touch @OUT@/late' </dev/null >/dev/null 2>&1 & sleep 0.3; exit 0"
    ));
    assert!(ran.passed(), "{}", ran.verdict);
    assert!(!running(&marker), "the daemon outlived the jail");
}

#[test]
fn attack_a_double_fork_does_not_outlive_the_program() {
    let lab = Lab::new("double-fork");
    let marker = format!("7778.{}", unique() % 1_000_000);
    let ran = lab.run(&format!(
        "(nohup sleep {marker} >/dev/null 2>&1 &) ; (sh -c 'sleep {marker} &' &) ; sleep 0.3; exit 0"
    ));
    assert!(ran.passed(), "{}", ran.verdict);
    assert!(!running(&marker), "a grandchild outlived the jail");
}

#[test]
fn attack_a_sigkilled_baton_leaves_no_jailed_process() {
    let lab = Lab::new("sigkill");
    let marker = format!("7779.{}", unique() % 1_000_000);
    let args = lab.prepare(&format!("setsid sleep {marker} & sleep {marker}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = lab.command(&args).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !running(&marker) {
        assert!(Instant::now() < deadline, "the jailed program never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&marker) {
        assert!(Instant::now() < deadline, "a jailed process outlived SIGKILLed Baton");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn attack_signals_reach_no_process_outside_the_jail() {
    let lab = Lab::new("kill-all");
    let marker = format!("7780.{}", unique() % 1_000_000);
    let mut bystander = Command::new("sleep").arg(&marker).spawn().unwrap();
    let ran = lab.run("kill -9 -1; pkill -9 baton; kill -9 1; exit 0");
    assert!(ran.out.status.success(), "{}{}", text(&ran.out.stdout), text(&ran.out.stderr));
    assert!(bystander.try_wait().unwrap().is_none(), "a process outside was killed");
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn attack_a_fork_bomb_stops_at_the_process_limit() {
    let mut lab = Lab::new("fork-bomb");
    // Its own uid, so that the bomb counts against nobody else's processes.
    lab.config = Some("[jail]\nuid = 64999\ngid = 64999\nprocesses = 64\n".to_owned());
    lab.verifier = "command, timeout_s: 5, params: {argv: [sh, attack.sh]}".to_owned();
    control(&lab, "echo ok; exit 0", "ok");
    let ran = lab.run("b() { b | b & }; b; sleep 10");
    assert!(ran.took < Duration::from_secs(60), "{:?}", ran.took);
    assert!(!ran.passed(), "{}", ran.verdict);
    let left = Command::new("pgrep").args(["-u", "64999"]).output().unwrap();
    assert!(!left.status.success(), "processes of the jail's uid are left: {}", text(&left.stdout));
}

#[test]
fn attack_cpu_burners_are_killed_at_the_timeout_with_everything_they_started() {
    let mut lab = Lab::new("cpu");
    lab.verifier = "command, timeout_s: 2, params: {argv: [sh, attack.sh]}".to_owned();
    let marker = format!("7781.{}", unique() % 1_000_000);
    let ran = lab.run(&format!("sleep {marker} & while :; do :; done"));
    assert!(!ran.passed());
    assert!(ran.verdict["reasons"].to_string().contains("timed out"), "{}", ran.verdict);
    assert!(!running(&marker));
}

// ---- limits ----------------------------------------------------------------------------

#[test]
fn attack_one_huge_file_stops_at_the_file_size_limit() {
    let mut lab = Lab::new("big-file");
    lab.config = Some("[jail]\nfile_mib = 4\n".to_owned());
    control(&lab, "head -c 1048576 /dev/zero > small && wc -c < small; exit 0", "1048576");
    let ran = lab.run("head -c 100000000 /dev/zero > big; echo size; wc -c < big; exit 0");
    let printed = ran.printed();
    let size: u64 = printed
        .lines()
        .skip_while(|l| *l != "size")
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(size <= 4 * 1024 * 1024, "{size} bytes");
}

#[test]
fn attack_many_small_files_stop_at_the_new_files_limit() {
    let mut lab = Lab::new("many-files");
    lab.config = Some("[jail]\nnew_files = 300\n".to_owned());
    control(&lab, "for i in 1 2 3 4 5 6 7 8 9 10; do : > f$i; done; echo made; exit 0", "made");
    let ran = lab
        .run("mkdir many; i=0; while [ $i -lt 200000 ]; do : > many/f$i; i=$((i+1)); done; exit 0");
    assert!(!ran.passed());
    let reasons = ran.verdict["reasons"].to_string();
    assert!(reasons.contains("created more than 300 files"), "{reasons}");
}

#[test]
fn attack_filling_the_disk_from_tmp_stops_at_the_new_bytes_limit() {
    let mut lab = Lab::new("fill-disk");
    lab.config = Some("[jail]\nnew_mib = 16\n".to_owned());
    control(&lab, "head -c 1000000 /dev/zero > /tmp/one && echo wrote; exit 0", "wrote");
    let ran = lab.run("i=0; while [ $i -lt 400 ]; do head -c 1000000 /dev/urandom > /tmp/f$i; i=$((i+1)); done; sleep 5; exit 0");
    assert!(!ran.passed());
    let reasons = ran.verdict["reasons"].to_string();
    assert!(reasons.contains("wrote more than 16 MiB"), "{reasons}");
}

#[test]
fn attack_memory_beyond_the_limit_is_refused_to_the_program() {
    let mut lab = Lab::new("memory");
    lab.config = Some("[jail]\nmemory_mib = 256\n".to_owned());
    control(&lab, "python3 -c 'a = bytearray(64 << 20); print(\"got\", len(a))'", "got");
    let ran = lab.run("python3 -c 'a = bytearray(2 << 30); print(\"got\", len(a))'");
    assert!(!ran.passed());
    assert!(ran.printed().contains("MemoryError"), "{}", ran.printed());
}

#[test]
fn attack_output_floods_are_cut_to_the_tail() {
    let lab = Lab::new("flood");
    let ran = lab.run("head -c 50000000 /dev/zero | tr '\\0' a; exit 0");
    assert!(ran.passed());
    let db = std::fs::metadata(lab.db()).map_or(0, |m| m.len())
        + std::fs::metadata(lab.wal()).map_or(0, |m| m.len());
    assert!(db < 5_000_000, "the database holds {db} bytes");
}

// ---- privileges ------------------------------------------------------------------------

#[test]
fn attack_the_program_has_no_capabilities_and_gains_none() {
    let lab = Lab::new("caps");
    let ran =
        control(&lab, "grep -E '^(Cap|NoNewPrivs)' /proc/self/status; id -u; exit 0", "CapEff");
    let printed = ran.printed();
    assert!(printed.contains("CapEff:\t0000000000000000"), "{printed}");
    assert!(printed.contains("CapPrm:\t0000000000000000"), "{printed}");
    assert!(printed.contains("CapInh:\t0000000000000000"), "{printed}");
    assert!(printed.contains("CapAmb:\t0000000000000000"), "{printed}");
    if std::env::var("USER").as_deref() == Ok("root")
        || text(&Command::new("id").arg("-u").output().unwrap().stdout).trim() == "0"
    {
        assert!(printed.contains("CapBnd:\t0000000000000000"), "{printed}");
    }
    assert!(printed.contains("NoNewPrivs:\t1"), "{printed}");
    assert!(!printed.lines().any(|l| l.trim() == "0"), "it runs as root: {printed}");
    // No user namespace of its own, where it would be root: the jail allows none.
    let ran = lab.run(
        "unshare -r sh -c 'echo nested-root; cat /etc/shadow; echo x > /usr/escaped'; unshare -U true && echo nested-user; exit 0",
    );
    assert!(!Path::new("/usr/escaped").exists());
    assert!(!ran.printed().contains("nested-"), "{}", ran.printed());
    assert!(!ran.printed().contains("root:$"), "{}", ran.printed());
}

#[test]
fn attack_setuid_and_file_capability_binaries_raise_nothing() {
    let lab = Lab::new("setuid");
    let ran = lab.run(
        "for b in /usr/bin/su /usr/bin/mount /usr/bin/passwd /usr/bin/newgrp /bin/ping; do [ -x $b ] && $b --help >/dev/null 2>&1; done; \
         su root -c 'echo x > @OUT@/su' </dev/null; mount -t tmpfs x /tmp; id -u; exit 0",
    );
    assert!(!lab.outside.join("su").exists());
    assert!(!ran.printed().lines().any(|l| l.trim() == "0"), "{}", ran.printed());
}

#[test]
fn attack_the_hostname_and_other_namespaces_are_the_jails_own() {
    let lab = Lab::new("uts");
    let real = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let ran = control(&lab, "hostname; cat /proc/sys/kernel/hostname; exit 0", "baton-jail");
    assert!(!ran.printed().contains(real.trim()) || real.trim() == "baton-jail");
    let ran = lab.run("hostname evil; ls /dev; ls /sys 2>&1; exit 0");
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(), real);
    assert!(!ran.printed().contains("vda"), "a real device: {}", ran.printed());
}

#[test]
fn attack_inherited_descriptors_lead_to_nothing_of_batons() {
    let lab = Lab::new("fds");
    let ran = control(&lab, "ls -l /proc/self/fd; exit 0", "0 ->");
    let printed = ran.printed();
    assert!(!printed.contains("runs.db"), "{printed}");
    assert!(!printed.contains("socket"), "{printed}");
    let ran = lab.run("for fd in 3 4 5 6 7 8 9; do head -c 64 <&$fd 2>/dev/null; done; exit 0");
    assert!(!ran.printed().contains("SQLite"), "{}", ran.printed());
}

// ---- the network -----------------------------------------------------------------------

#[test]
fn attack_the_network_is_cut_unless_the_verifier_declares_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!(
        "python3 -c 'import socket; s = socket.create_connection((\"127.0.0.1\", {port}), 3); s.sendall(b\"hello\"); print(\"connected\")'"
    );
    let accepted = || {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            if listener.accept().is_ok() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let lab = Lab::new("network");
    let ran = lab.run(&connect);
    assert!(!ran.passed(), "{}", ran.verdict);
    assert!(!accepted(), "a connection left the jail");
    let ran =
        lab.run("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 5432), 2)'");
    assert!(!ran.passed(), "the database server is reachable: {}", ran.verdict);
    // Positive control: the same program, declared `network: true`, connects.
    let mut open = Lab::new("network-declared");
    open.verifier =
        "command, timeout_s: 20, params: {argv: [sh, attack.sh], network: true}".to_owned();
    let ran = open.run(&connect);
    assert!(ran.passed(), "{}\n{}", ran.verdict, ran.log);
    assert!(accepted(), "the declared network did not work");
}

// ---- the jail itself -------------------------------------------------------------------

#[test]
fn without_bubblewrap_a_run_that_starts_programs_is_refused_and_no_jail_allows_it() {
    let lab = Lab::new("no-bwrap");
    let args = lab.prepare("echo ran; exit 0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out =
        lab.command(&args).env("BATON_BWRAP", lab.dir.join("no-such-bwrap")).output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the jail cannot be set up"), "{stderr}");
    assert!(stderr.contains("--no-jail"), "{stderr}");
    assert!(!text(&out.stdout).contains("run "), "a run was created: {}", text(&out.stdout));
    let mut unjailed = vec!["--no-jail"];
    unjailed.extend(&args);
    let out =
        lab.command(&unjailed).env("BATON_BWRAP", lab.dir.join("no-such-bwrap")).output().unwrap();
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stderr).contains("warning: --no-jail"), "{}", text(&out.stderr));
    let run = text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();
    let log = text(&lab.command(&["events", &run, "--json"]).output().unwrap().stdout);
    assert!(log.contains("\"jail\":\"off\""), "{log}");
}

#[test]
fn a_scenario_without_programs_runs_where_there_is_no_bubblewrap() {
    let lab = Lab::new("no-programs");
    let scenario = "id: t\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'x'}, terminal: true}\n";
    std::fs::write(lab.dir.join("scenarios/t.yaml"), scenario).unwrap();
    std::fs::write(lab.dir.join("script.yaml"), "levels:\n  a:\n    - text: fine\n").unwrap();
    let script = lab.dir.join("script.yaml");
    let out = lab
        .command(&["run", "t", "--input", "x", "--script", script.to_str().unwrap()])
        .env("BATON_BWRAP", lab.dir.join("no-such-bwrap"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
}

#[test]
fn batons_environment_is_unreadable_to_a_sibling_process_of_its_own_uid() {
    // Baton runs as nobody (the jail then uses a user namespace), and a second process of
    // nobody reads its /proc entry while a verifier runs: non-dumpable, Baton's is root's.
    let lab = Lab::new("undumpable");
    use std::os::unix::fs::PermissionsExt as _;
    std::os::unix::fs::chown(&lab.dir, Some(65534), Some(65534)).unwrap();
    for entry in
        walk(&lab.dir).iter().chain([lab.dir.join("scenarios"), lab.outside.clone()].iter())
    {
        std::os::unix::fs::chown(entry, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(&lab.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let marker = format!("7782.{}", unique() % 1_000_000);
    let args = lab.prepare(&format!("sleep {marker}"));
    for file in walk(&lab.dir) {
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
    }
    // Copies of Baton and bubblewrap that nobody can run wherever the checkout lies.
    let bin = lab.dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_baton"), bin.join("baton")).unwrap();
    std::fs::copy(super::bwrap(), bin.join("bwrap")).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = Command::new("setpriv");
    command.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
    let inner = lab.command(&args.iter().map(String::as_str).collect::<Vec<_>>());
    command.arg(bin.join("baton")).args(inner.get_args()).current_dir(&lab.dir);
    command.envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))));
    command.env("BATON_BWRAP", bin.join("bwrap"));
    let mut baton = command.spawn().expect("setpriv starts Baton as nobody");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !running(&marker) {
        if Instant::now() > deadline || baton.try_wait().unwrap().is_some() {
            let out = baton.wait_with_output().unwrap();
            panic!(
                "the jailed program never started as nobody: {}{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let environ = format!("/proc/{}/environ", baton.id());
    let read = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat", &environ])
        .output()
        .unwrap();
    let _ = baton.kill();
    let _ = baton.wait();
    assert!(!read.status.success(), "a sibling of nobody read Baton's environment");
    assert!(!text(&read.stdout).contains(&lab.secret));
    // Positive control: a dumpable process of nobody's is readable by another of nobody's.
    let mut plain = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "30"])
        .env("BATON_TEST_SECRET", &lab.secret)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let read = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(format!("/proc/{}/environ", plain.id()))
        .output()
        .unwrap();
    let _ = plain.kill();
    let _ = plain.wait();
    assert!(text(&read.stdout).contains(&lab.secret), "the control could not read its sibling");
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&marker) {
        assert!(Instant::now() < deadline, "the jailed program outlived Baton");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn real_mcp_servers_run_in_the_jail() {
    // mcp-server-time (Python, in the test venv) and server-filesystem (TypeScript, npm),
    // started by the scenario's verifiers inside the jail, on the model's workspace.
    let repo = super::repo();
    let time = repo.join(".peers/venv/bin/mcp-server-time");
    let files = repo.join(".peers/npm/node_modules/.bin/mcp-server-filesystem");
    assert!(time.exists() && files.exists(), "run scripts/test, which installs the MCP servers");
    let mut lab = Lab::new("mcp-real");
    lab.verifier = format!(
        "mcp, timeout_s: 60, params: {{server: [{}], tool: get_current_time, arguments: {{timezone: Europe/Paris}}, condition: \"result.timezone == 'Europe/Paris'\"}}}}\n      - {{name: files, uses: mcp, timeout_s: 60, params: {{server: [{}, .], tool: read_text_file, arguments: {{path: '{{{{ workspace }}}}/attack.sh'}}}}",
        time.display(),
        files.display()
    );
    let ran = lab.run("echo the model's file");
    let finished: Vec<Value> = ran
        .log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "verifier_finished")
        .collect();
    assert_eq!(finished.len(), 2, "{}", ran.log);
    for f in &finished {
        assert_eq!(f["data"]["passed"], true, "{f}");
    }
    assert!(finished[1]["data"]["details"]["content"].to_string().contains("the model's file"));
}

#[test]
fn attack_moving_batons_directory_aside_uncovers_nothing() {
    // `--workspace .` with the database in ./.baton: the directory is covered, and a cover
    // cannot be moved (a mount point is busy), so the next program finds nothing either.
    let mut lab = Lab::new("rename-data");
    lab.workspace = Some(lab.dir.clone());
    lab.db = ".baton/runs.db";
    lab.verifier = "command, params: {argv: [sh, attack.sh]}}\n      - {name: second, uses: command, params: {argv: [sh, -c, 'head -c 16 .b/runs.db .baton/runs.db; ls -a .b .baton; exit 0']}".to_owned();
    control(&lab, "ls -a .baton; exit 0", ".");
    let ran = lab.run("mv .baton .b; mkdir -p .baton; echo junk > .baton/runs.db-journal; exit 0");
    assert!(!lab.dir.join(".b").exists(), "{}", ran.log);
    assert!(!lab.dir.join(".baton/runs.db-journal").exists());
    assert!(!ran.log.contains("SQLite format"), "{}", ran.log);
    let check = lab.command(&["verify"]).output().unwrap();
    assert!(check.status.success(), "{}{}", text(&check.stdout), text(&check.stderr));
}

#[test]
fn attack_the_workspaces_own_git_and_batons_configuration_stay_as_they_were() {
    let mut lab = Lab::new("dot-git");
    lab.workspace = Some(lab.dir.clone());
    lab.db = ".baton/runs.db";
    lab.config = Some("[jail]\nnew_files = 1000\n".to_owned());
    let git = Command::new("git").args(["init", "-q"]).arg(&lab.dir).output().unwrap();
    assert!(git.status.success(), "{}", text(&git.stderr));
    let before = std::fs::read_to_string(lab.dir.join(".git/config")).unwrap();
    control(
        &lab,
        "cat .git/config baton.toml scenarios/t.yaml >/dev/null && echo readable; exit 0",
        "readable",
    );
    let ran = lab.run(
        "printf '[core]\\n\\tfsmonitor = touch @OUT@/fsmonitor\\n' >> .git/config; echo 'touch @OUT@/hook' > .git/hooks/pre-commit; \
         printf '[jail]\\nbwrap = \"/tmp/evil\"\\n' > baton.toml; echo evil > scenarios/t.yaml; rm -rf scenarios .git; exit 0",
    );
    assert_eq!(
        std::fs::read_to_string(lab.dir.join(".git/config")).unwrap(),
        before,
        "{}",
        ran.printed()
    );
    assert!(!lab.dir.join(".git/hooks/pre-commit").exists());
    assert_eq!(
        std::fs::read_to_string(lab.dir.join("baton.toml")).unwrap(),
        "[jail]\nnew_files = 1000\n"
    );
    let scenario = std::fs::read_to_string(lab.dir.join("scenarios/t.yaml")).unwrap();
    assert!(scenario.starts_with("id: t"), "{scenario}");
}

#[test]
fn attack_directories_deeper_than_the_walk_are_not_a_hiding_place() {
    let lab = Lab::new("deep");
    control(&lab, "mkdir -p a/b/c && echo made; exit 0", "made");
    let ran = lab.run("i=0; while [ $i -lt 300 ]; do mkdir d; cd d; i=$((i+1)); done; head -c 1000000 /dev/zero > f; sleep 5; exit 0");
    assert!(!ran.passed());
    assert!(ran.verdict["reasons"].to_string().contains("cannot count"), "{}", ran.verdict);
}

#[test]
fn attack_dev_takes_no_new_files() {
    let lab = Lab::new("dev");
    control(&lab, "echo x > /dev/null && head -c 4 /dev/urandom | wc -c; exit 0", "4");
    let ran = lab.run(
        "echo x > /dev/newfile; head -c 10000000 /dev/zero > /dev/shm/fill; echo LISTING; ls /dev /dev/shm; exit 0",
    );
    let printed = ran.printed();
    let listing: Vec<&str> = printed.lines().skip_while(|l| *l != "LISTING").collect();
    assert!(listing.len() > 3, "{printed}");
    assert!(!listing.iter().any(|l| l.trim() == "newfile" || l.trim() == "fill"), "{printed}");
}

#[test]
fn attack_an_mcp_server_filling_the_disk_is_stopped() {
    let mut lab = Lab::new("mcp-disk");
    lab.config = Some("[jail]\nnew_files = 300\n".to_owned());
    lab.verifier = "mcp, timeout_s: 30, params: {server: [sh, attack.sh], tool: t}".to_owned();
    let ran = lab.run(
        "mkdir many; i=0; while [ $i -lt 200000 ]; do : > many/f$i; i=$((i+1)); done; sleep 30",
    );
    assert!(!ran.passed(), "{}", ran.verdict);
    assert!(
        ran.verdict["reasons"].to_string().contains("created more than 300 files"),
        "{}",
        ran.verdict
    );
    assert!(ran.took < Duration::from_secs(25), "{:?}", ran.took);
}

#[test]
fn the_jail_bench_measures_programs_in_and_out_of_the_jail() {
    let out = super::baton_command()
        .args(["bench", "--workload", "jail", "--runs", "3", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["true_jailed_ms_p50", "true_unjailed_ms_p50", "python_jailed_ms_p95", "setup_ms"] {
        assert!(report[key].as_f64().is_some_and(|ms| ms > 0.0), "{key}: {report}");
    }
    assert!(report["jail"].as_str().unwrap().starts_with("bubblewrap"), "{report}");
}

#[test]
fn a_second_interrupt_exits_at_once_and_the_run_stays_resumable() {
    let lab = Lab::new("second-interrupt");
    let marker = format!("7783.{}", unique() % 1_000_000);
    let args = lab.prepare(&format!("sleep {marker}; exit 0"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = lab.command(&args).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !running(&marker) {
        assert!(Instant::now() < deadline, "the jailed program never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = child.id().to_string();
    let started = Instant::now();
    for _ in 0..2 {
        Command::new("kill").args(["-INT", &pid]).status().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(matches!(out.status.code(), Some(6 | 130)), "{:?}", out.status);
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&marker) {
        assert!(Instant::now() < deadline, "the jailed program outlived Baton");
        std::thread::sleep(Duration::from_millis(50));
    }
    let run = text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();
    // The resumed run runs the program again to its end: make it quick.
    let workspace = lab.dir.join("workspaces").join(&run);
    std::fs::write(workspace.join("attack.sh"), "exit 0\n").unwrap();
    let resumed = lab.command(&["resume", &run]).output().unwrap();
    assert!(resumed.status.success(), "{}{}", text(&resumed.stdout), text(&resumed.stderr));
}

#[test]
fn batons_own_git_runs_in_the_jail_too() {
    // When Baton is root, what the jail's git writes belongs to the jail's uid: the
    // snapshot repository's objects are nobody's.
    let lab = Lab::new("git-jailed");
    let ran = control(&lab, "echo ok; exit 0", "ok");
    assert!(ran.log.contains("\"after\""), "{}", ran.log);
    let objects: Vec<PathBuf> = walk(&lab.dir.join("snapshots"))
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "objects"))
        .collect();
    assert!(!objects.is_empty(), "no snapshot was taken");
    use std::os::unix::fs::MetadataExt as _;
    let root = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) == 0;
    if root {
        for object in &objects {
            assert_eq!(std::fs::metadata(object).unwrap().uid(), 65534, "{}", object.display());
        }
    }
}

#[test]
fn a_bubblewrap_that_never_answers_is_refused_within_the_probes_deadline() {
    let lab = Lab::new("hung-bwrap");
    let fake = lab.dir.join("bwrap");
    std::fs::write(&fake, "#!/bin/sh\nsleep 60\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let args = lab.prepare("echo ran; exit 0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let out = lab.command(&args).env("BATON_BWRAP", &fake).output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("did not start a program within 5 s"), "{stderr}");
}

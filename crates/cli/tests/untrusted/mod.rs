//! Text from an untrusted model through the binary: what it writes reaches the terminal
//! with its control characters escaped, and secrets the process knows never reach the log,
//! the database file or the terminal.

use std::path::PathBuf;
use std::process::{Command, Output};

use super::text;

/// A directory of the test's own with a scenario `t` and a script for it.
struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str, scenario: &str, script: &str) -> Case {
        let dir = std::env::temp_dir().join(format!(
            "baton-untrusted-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        ));
        std::fs::create_dir_all(dir.join("scenarios")).unwrap();
        std::fs::write(dir.join("scenarios/t.yaml"), scenario).unwrap();
        std::fs::write(dir.join("script.yaml"), script).unwrap();
        Case { dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = super::baton_in(&self.dir, &self.dir.join("runs.db"));
        c.args(args);
        c
    }

    fn baton(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn run(&self) -> (Output, String) {
        let script = self.dir.join("script.yaml");
        let out = self.baton(&["run", "t", "--input", "x", "--script", script.to_str().unwrap()]);
        let run = text(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("run "))
            .unwrap_or_default()
            .to_owned();
        (out, run)
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every byte of a command's output, standard output then standard error.
fn bytes(out: &Output) -> Vec<u8> {
    [out.stdout.as_slice(), out.stderr.as_slice()].concat()
}

/// A tool-loop level that writes a file and finishes with a summary, then a prompt level
/// whose answer is the run's output.
const WRITE_AND_FINISH: &str = "id: t\nversion: 1\nlevels:\n  - id: write\n    kind: tool_loop\n    prompt: {inline: 'Do {{ input }}'}\n    max_iterations: 5\n  - id: report\n    kind: prompt\n    prompt: {inline: 'Report on {{ level.write.output }}'}\n    terminal: true\nedges:\n  - {from: write, to: report}\n";

fn write_and_finish(path: &str, text: &str) -> String {
    format!(
        "levels:\n  write:\n    - tool_calls:\n        - {{name: write_file, arguments: {{path: \"{path}\", content: \"hi\\n\"}}}}\n    - tool_calls:\n        - {{name: finish, arguments: {{summary: \"{text}\"}}}}\n  report:\n    - text: \"{text}\"\n"
    )
}

#[test]
fn control_characters_from_the_model_reach_the_terminal_escaped() {
    // A window-title OSC in a file name; a screen clear, a forged timeline line, a
    // clipboard write and a bidi override in the summary (which is also the run's output).
    let case = Case::new(
        "escape",
        WRITE_AND_FINISH,
        &write_and_finish(
            "a\\u001b]0;pwned\\u0007.txt",
            "done\\u001b[2J\\r#99 forged\\u001b]52;c;aGk=\\u0007 \\u202egnp.exe\\u009b",
        ),
    );
    let (out, run) = case.run();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let timeline = case.baton(&["events", &run]);
    let runs = case.baton(&["runs"]);
    for shown in [&out, &timeline, &runs] {
        let raw = bytes(shown);
        for forbidden in [&b"\x1b"[..], b"\x07", b"\r", "\u{202e}".as_bytes(), "\u{9b}".as_bytes()]
        {
            assert!(
                !raw.windows(forbidden.len()).any(|w| w == forbidden),
                "{forbidden:?} reached the terminal raw: {}",
                text(&raw)
            );
        }
    }
    for shown in [text(&out.stdout), text(&timeline.stdout)] {
        assert!(shown.contains("a\\x1b]0;pwned\\x07.txt"), "{shown}");
        assert!(shown.contains("\\x1b[2J"), "{shown}");
        assert!(!shown.lines().any(|l| l.starts_with("#99")), "a forged line: {shown}");
    }
    // The final output block keeps its lines but escapes the carriage return and the rest.
    let stdout = text(&out.stdout);
    let output = stdout.split("output:\n").nth(1).unwrap();
    assert!(
        output.starts_with("done\\x1b[2J\\r#99 forged\\x1b]52;c;aGk=\\x07 \\u{202e}gnp.exe\\u{9b}"),
        "{output}"
    );
    // The log keeps what the model wrote, byte for byte: only printing escapes.
    let json = case.baton(&["events", &run, "--json"]);
    assert!(text(&json.stdout).contains(r"a\u001b]0;pwned\u0007.txt"), "{}", text(&json.stdout));
}

#[test]
fn ordinary_names_and_summaries_print_unchanged() {
    let case = Case::new(
        "plain",
        WRITE_AND_FINISH,
        &write_and_finish("notes/ünïcode – ok.txt", "Wrote notes/ünïcode – ok.txt."),
    );
    let (out, run) = case.run();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("created   write: notes/ünïcode – ok.txt"), "{stdout}");
    assert!(stdout.contains("output:\nWrote notes/ünïcode – ok.txt."), "{stdout}");
    assert!(!stdout.contains('\\'), "nothing was escaped: {stdout}");
    let timeline = text(&case.baton(&["events", &run]).stdout);
    assert!(timeline.contains("tool      write: write_file notes/ünïcode – ok.txt"), "{timeline}");
}

/// The key the tests configure; it must appear nowhere a run leaves text.
const KEY: &str = "test-key-1f2e3d4c5b6a79880011";

/// Asserts that `needle` is in none of the outputs nor in any byte of the database files.
fn nowhere(case: &Case, needle: &str, outputs: &[&Output]) {
    for out in outputs {
        let raw = bytes(out);
        assert!(
            !raw.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{needle} was printed: {}",
            text(&raw)
        );
    }
    for entry in std::fs::read_dir(&case.dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("runs.db") && path.is_file() {
            let stored = std::fs::read(&path).unwrap();
            assert!(
                !stored.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{needle} is stored in {name}"
            );
        }
    }
}

#[test]
fn a_provider_error_body_holding_the_key_is_redacted_before_it_is_recorded_or_printed() {
    fn echo_the_key(_: usize, stream: &mut std::net::TcpStream) {
        super::faults::respond(
            stream,
            "400 Bad Request",
            &format!(
                r#"{{"error":{{"message":"invalid request for key {KEY}; header was Bearer {KEY}"}}}}"#
            ),
        );
    }
    let server = super::faults::Server::start(echo_the_key);
    let scenario = "id: t\nversion: 1\nlevels:\n  - id: answer\n    kind: prompt\n    prompt: {inline: 'Answer {{ input }}'}\n    model: {allow: ['free:*']}\n    terminal: true\n";
    let case = Case::new("http-key", scenario, "levels: {}\n");
    std::fs::write(
        case.dir.join("baton.toml"),
        format!(
            "[routing]\ndefault = \"free:local/m\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\napi_key_env = \"BATON_UNTRUSTED_TEST_KEY\"\ntier = \"free\"\nstream = false\n\n[[providers.models]]\nname = \"m\"\ninput_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n",
            server.port
        ),
    )
    .unwrap();
    let with_key = |args: &[&str]| {
        case.command(&["--config", case.dir.join("baton.toml").to_str().unwrap()])
            .args(args)
            .env("BATON_UNTRUSTED_TEST_KEY", KEY)
            .output()
            .unwrap()
    };
    let out = with_key(&["run", "t", "--input", "x"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = text(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("run "))
        .unwrap_or_default()
        .to_owned();
    let events = with_key(&["events", &run, "--json"]);
    let timeline = with_key(&["events", &run]);
    nowhere(&case, KEY, &[&out, &events, &timeline]);
    // The error is kept, with the key taken out.
    let log = text(&events.stdout);
    let failed = log.lines().find(|l| l.contains("\"level_finished\"")).unwrap();
    assert!(failed.contains("invalid request for key [redacted]"), "{failed}");
    assert!(failed.contains("Bearer [redacted]"), "{failed}");
    assert!(text(&out.stdout).contains("[redacted]"), "{}", text(&out.stdout));
}

/// Runs a verifier level whose program prints `leaked` (from a file, so the scenario, which
/// the store keeps, holds no key) through `then`, with `OPENAI_API_KEY` set to [`KEY`]; the
/// run's output, its `events --json` and its timeline.
fn leaky_verifier(name: &str, leaked: &str, then: &str) -> (Case, [Output; 3]) {
    let case = Case::new(name, "", "levels: {}\n");
    // The jail shows the program this one directory, besides the system and the workspace.
    let shown = case.dir.join("shown");
    std::fs::create_dir_all(&shown).unwrap();
    let leak = shown.join("leak");
    std::fs::write(&leak, leaked).unwrap();
    let program = then.replace("LEAK", &leak.display().to_string());
    let scenario = format!(
        "id: t\nversion: 1\nlevels:\n  - id: check\n    kind: verifier\n    verifiers:\n      - {{name: leaky, uses: command, params: {{argv: [sh, -c, '{program}']}}}}\n    terminal: true\n"
    );
    std::fs::write(case.dir.join("scenarios/t.yaml"), scenario).unwrap();
    let out = case
        .command(&["run", "t", "--input", "x"])
        .env("OPENAI_API_KEY", KEY)
        .env("BATON_JAIL_READ_ONLY", &shown)
        .output()
        .unwrap();
    assert!(out.status.code().is_some(), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = text(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("run "))
        .unwrap_or_default()
        .to_owned();
    let events = case.baton(&["events", &run, "--json"]);
    let timeline = case.baton(&["events", &run]);
    (case, [out, events, timeline])
}

#[test]
fn secrets_a_verifier_prints_are_redacted_and_its_ordinary_output_kept() {
    // The program prints what it could have read from Baton's environment (a file stands
    // in for `/proc/<pid>/environ`), an `sk-` shaped key nobody configured, and an ordinary
    // line.
    let leaked = format!("OPENAI_API_KEY={KEY}\ntoken sk-ant-api03-abcdefghijklmnopqrstuvwxyz\n");
    let (case, [out, events, timeline]) =
        leaky_verifier("verifier-key", &leaked, "echo ordinary output 42; cat LEAK >&2; exit 1");
    nowhere(&case, KEY, &[&out, &events, &timeline]);
    nowhere(&case, "abcdefghijklmnopqrstuvwxyz", &[&out, &events, &timeline]);
    let log = text(&events.stdout);
    let finished = log.lines().find(|l| l.contains("\"verifier_finished\"")).unwrap();
    assert!(finished.contains("OPENAI_API_KEY=[redacted]"), "{finished}");
    assert!(finished.contains("token [redacted]"), "{finished}");
    // Positive control: what is not a secret is kept as it was.
    assert!(finished.contains("ordinary output 42"), "{finished}");
}

#[test]
fn a_key_cut_by_the_output_tail_leaves_no_piece_of_it() {
    // The program prints the key, then 4086 bytes: the 4 KiB tail the event keeps begins
    // with the key's last ten characters.
    let (case, [out, events, _]) =
        leaky_verifier("tail-cut-key", KEY, "cat LEAK >&2; printf %04086d 0 >&2; exit 1");
    let log = text(&events.stdout);
    let finished = log.lines().find(|l| l.contains("\"verifier_finished\"")).unwrap();
    assert!(finished.contains("00000000"), "the tail is kept: {}", &finished[..200]);
    nowhere(&case, &KEY[KEY.len() - 10..], &[&out, &events]);
}

#[test]
fn a_verifiers_output_reaches_the_terminal_escaped() {
    // `printf` writes the raw bytes; the scenario holds only their octal spelling.
    let scenario = "id: t\nversion: 1\nlevels:\n  - id: check\n    kind: verifier\n    verifiers:\n      - {name: loud, uses: command, params: {argv: [sh, -c, 'printf \"bad\\033]0;pwned\\007\\r#99 forged\\n\" >&2; exit 1']}}\n    terminal: true\n";
    let case = Case::new("verifier-escape", scenario, "levels: {}\n");
    let (out, _) = case.run();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let raw = bytes(&out);
    for forbidden in [b"\x1b", b"\x07", b"\r"] {
        assert!(!raw.windows(1).any(|w| w == forbidden), "{forbidden:?}: {}", text(&raw));
    }
    let stdout = text(&out.stdout);
    // The level's output (the run's) quotes the program's stderr: escaped, its `\r` too.
    assert!(stdout.contains("verifier  check/loud: FAILED"), "{stdout}");
    assert!(stdout.contains("bad\\x1b]0;pwned\\x07\\r#99 forged"), "{stdout}");
    assert!(!stdout.lines().any(|l| l.starts_with("#99")), "a forged line: {stdout}");
}

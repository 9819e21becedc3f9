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
        let mut c = Command::new(env!("CARGO_BIN_EXE_baton"));
        c.arg("--scenarios")
            .arg(self.dir.join("scenarios"))
            .arg("--db")
            .arg(self.dir.join("runs.db"))
            .args(args)
            .current_dir(&self.dir)
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("BATON_CONFIG");
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

//! Live steering through the binary, the real SQLite store and a real OpenAI-compatible
//! server (fakellm): two people steering at once, the driver SIGKILLed after their messages
//! were recorded and before any call used them, a third message while the run goes on —
//! and each message reaches exactly one answered prompt, the replay steered the same.

use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use super::{baton_in, fakellm, text};

const SCENARIO: &str = "id: steered\nversion: 1\nlevels:\n  - {id: draft, kind: prompt, steerable: true, prompt: {inline: 'DRAFT the plan.'}}\n  - {id: polish, kind: prompt, steerable: true, prompt: {inline: 'POLISH the plan.'}}\n  - {id: close, kind: prompt, prompt: {inline: 'CLOSE the plan.'}, terminal: true}\nedges:\n  - {from: draft, to: polish}\n  - {from: polish, to: close}\n  - {from: close, to: __end__}\n";

struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str) -> Case {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir()
            .join(format!("baton-steering-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(dir.join("scenarios")).unwrap();
        std::fs::write(dir.join("scenarios/steered.yaml"), SCENARIO).unwrap();
        Case { dir }
    }

    fn db(&self) -> PathBuf {
        self.dir.join("runs.db")
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = baton_in(&self.dir, &self.db());
        c.arg("--config").arg(self.dir.join("baton.toml")).args(args);
        c
    }

    fn baton(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn log(&self, run: &str) -> Vec<serde_json::Value> {
        let out = self.baton(&["events", run, "--json"]);
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// The only run of the database, once there is one.
    fn the_run(&self) -> String {
        wait_for("a run", || {
            let out = self.baton(&["runs", "--json"]);
            let runs: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            runs.as_array()?.first()?["run_id"].as_str().map(str::to_owned)
        })
    }

    /// Waits until the run's log holds `count` events matching `what`.
    fn wait_until(&self, run: &str, count: usize, what: impl Fn(&serde_json::Value) -> bool) {
        wait_for("the events awaited", || {
            (self.log(run).iter().filter(|e| what(e)).count() >= count).then_some(())
        });
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "waited 60 s for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sent_by(e: &serde_json::Value, level: &str) -> bool {
    e["kind"] == "prompt_sent" && e["level_id"] == level
}

/// The prompts whose call was answered (a `model_response` with the same request hash
/// after it), by level.
fn answered_prompts(log: &[serde_json::Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, e) in log.iter().enumerate() {
        if e["kind"] != "prompt_sent" {
            continue;
        }
        let hash = &e["data"]["request_hash"];
        let answered = log[i + 1..]
            .iter()
            .take_while(|n| n["kind"] != "prompt_sent")
            .any(|n| n["kind"] == "model_response" && &n["data"]["request_hash"] == hash);
        if answered {
            out.push((
                e["level_id"].as_str().unwrap().to_owned(),
                e["data"]["prompt"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

fn spawn_quiet(mut c: std::process::Command) -> Child {
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
}

#[test]
fn each_steering_message_reaches_exactly_one_answered_prompt_through_concurrent_steers_and_a_sigkill()
 {
    let case = Case::new("once");
    // Each level's answer streams a word every 10 ms: 300 words take 3 s.
    let words = vec!["step"; 300].join(" ");
    std::fs::write(
        case.dir.join("rules.yaml"),
        format!(
            "version: 1\nrules:\n  - name: draft\n    when: {{messages_contain: DRAFT}}\n    respond: {{content: 'draft {words}'}}\n  - name: polish\n    when: {{messages_contain: POLISH}}\n    respond: {{content: 'polish {words}'}}\n  - name: close\n    when: {{messages_contain: CLOSE}}\n    respond: {{content: 'closed'}}\n"
        ),
    )
    .unwrap();
    let server = fakellm(&case.dir.join("rules.yaml"));
    let config = server_config(server.1);
    std::fs::write(case.dir.join("baton.toml"), config).unwrap();

    // The run's first call is under way when two people steer it at once.
    let mut driver = spawn_quiet(case.command(&["run", "steered", "--input", "x", "--json"]));
    let run = case.the_run();
    case.wait_until(&run, 1, |e| sent_by(e, "draft"));
    let steers: Vec<Child> = [("ana", "M-ONE keep it short"), ("bo", "M-TWO mention the risks")]
        .into_iter()
        .map(|(by, message)| {
            spawn_quiet(case.command(&["steer", &run, "--message", message, "--by", by]))
        })
        .collect();
    for steer in steers {
        let out = steer.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains("recorded steering message steer-"));
    }
    // Recorded, not yet used: the driver dies before any call takes them.
    driver.kill().unwrap();
    driver.wait().unwrap();
    let log = case.log(&run);
    assert_eq!(log.iter().filter(|e| e["kind"] == "steering_received").count(), 2);
    assert!(!log.iter().any(|e| e["kind"] == "steering_delivered"), "none used yet");

    // Resumed: the draft's call made again takes both; a third message sent while it
    // streams goes to the next call, the polish's, and the draft's work is kept.
    let resume = spawn_quiet(case.command(&["resume", &run, "--json"]));
    case.wait_until(&run, 2, |e| sent_by(e, "draft"));
    let third = case.baton(&["steer", &run, "--message", "M-THREE add a summary", "--by", "cy"]);
    assert_eq!(third.status.code(), Some(0), "{}", text(&third.stderr));
    let out = resume.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed", "{result}");

    let log = case.log(&run);
    let answered = answered_prompts(&log);
    for (marker, level) in [("M-ONE", "draft"), ("M-TWO", "draft"), ("M-THREE", "polish")] {
        let reached: Vec<&String> =
            answered.iter().filter(|(_, p)| p.contains(marker)).map(|(l, _)| l).collect();
        assert_eq!(reached, [level], "{marker} reaches exactly one answered prompt: {answered:?}");
    }
    let delivered: Vec<(String, Vec<String>)> = log
        .iter()
        .filter(|e| e["kind"] == "steering_delivered")
        .map(|e| {
            let ids = e["data"]["ids"].as_array().unwrap();
            (
                e["level_id"].as_str().unwrap().to_owned(),
                ids.iter().map(|i| i.as_str().unwrap().to_owned()).collect(),
            )
        })
        .collect();
    assert_eq!(
        delivered,
        [
            ("draft".to_owned(), vec!["steer-1".to_owned(), "steer-2".to_owned()]),
            ("polish".to_owned(), vec!["steer-3".to_owned()])
        ]
    );
    // The third message did not cost the draft its call: one answer per level.
    let responses = log.iter().filter(|e| e["kind"] == "model_response").count();
    assert_eq!(responses, 3, "one answer per level");
    // The senders are recorded, and the close level (not steerable) got nothing.
    let by: Vec<&str> = log
        .iter()
        .filter(|e| e["kind"] == "steering_received")
        .map(|e| e["data"]["by"].as_str().unwrap())
        .collect();
    assert_eq!(by.len(), 3);
    assert!(by.contains(&"ana") && by.contains(&"bo") && by.contains(&"cy"), "{by:?}");
    assert!(answered.iter().any(|(l, p)| l == "close" && !p.contains("M-")));

    // After the end, steering is refused with nothing written.
    let late = case.baton(&["steer", &run, "--message", "too late", "--by", "ana"]);
    assert_eq!(late.status.code(), Some(1));
    assert!(text(&late.stderr).contains("has ended (completed)"), "{}", text(&late.stderr));
    assert_eq!(case.log(&run).len(), log.len());

    // The replay, without the server, is steered as the recording was.
    drop(server);
    let replay = case.baton(&["replay", &run, "--json"]);
    assert_eq!(replay.status.code(), Some(0), "{}{}", text(&replay.stdout), text(&replay.stderr));
    let replayed: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    assert_eq!(
        (&replayed["status"], &replayed["matches"]),
        (&"completed".into(), &true.into()),
        "{replayed}"
    );
    let again = answered_prompts(&case.log(replayed["replay_run_id"].as_str().unwrap()));
    assert_eq!(again, answered, "the replay's answered prompts are the recording's");
}

#[test]
fn steering_is_refused_where_no_steerable_level_is_running_or_ahead_and_past_sixteen_waiting() {
    let case = Case::new("refused");
    std::fs::write(
        case.dir.join("scenarios/plain.yaml"),
        "id: plain\nversion: 1\nlevels:\n  - {id: ask, kind: human_approval, prompt: {inline: 'Go?'}}\n  - {id: a, kind: prompt, prompt: {inline: A}}\nedges:\n  - {from: ask, to: a}\n  - {from: a, to: __end__}\n",
    )
    .unwrap();
    std::fs::write(
        case.dir.join("scenarios/gated.yaml"),
        "id: gated\nversion: 1\nlevels:\n  - {id: ask, kind: human_approval, prompt: {inline: 'Go?'}}\n  - {id: a, kind: prompt, steerable: true, prompt: {inline: A}}\nedges:\n  - {from: ask, to: a}\n  - {from: a, to: __end__}\n",
    )
    .unwrap();
    std::fs::write(case.dir.join("script.yaml"), "levels:\n  a: [{text: done}]\n").unwrap();
    std::fs::write(case.dir.join("baton.toml"), "").unwrap();
    let start = |scenario: &str| {
        let script = case.dir.join("script.yaml");
        let out =
            case.baton(&["run", scenario, "--input", "x", "--script", path(&script), "--json"]);
        let result: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out.stderr)));
        assert_eq!(result["status"], "paused", "{result}");
        result["run_id"].as_str().unwrap().to_owned()
    };
    let plain = start("plain");
    let refused = case.baton(&["steer", &plain, "--message", "hi", "--by", "ana"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("no steerable level is running or ahead"),
        "{}",
        text(&refused.stderr)
    );

    // Paused before a steerable level: taken, up to sixteen waiting.
    let gated = start("gated");
    for n in 1..=16 {
        let out = case.baton(&["steer", &gated, "--message", &format!("note {n}"), "--by", "ana"]);
        assert_eq!(out.status.code(), Some(0), "{n}: {}", text(&out.stderr));
    }
    let full = case.baton(&["steer", &gated, "--message", "one more", "--by", "ana"]);
    assert_eq!(full.status.code(), Some(1));
    assert!(text(&full.stderr).contains("16 steering messages"), "{}", text(&full.stderr));
    let big = "x".repeat(8 * 1024 + 1);
    let oversized = case.baton(&["steer", &gated, "--message", &big, "--by", "ana"]);
    assert_eq!(oversized.status.code(), Some(1));
    assert!(text(&oversized.stderr).contains("at most 8192"), "{}", text(&oversized.stderr));

    // Approved and driven on: the steerable level's one call takes all sixteen, in order.
    let script = case.dir.join("script.yaml");
    let approved = case.baton(&["approve", &gated, "--by", "ana", "--script", path(&script)]);
    assert_eq!(approved.status.code(), Some(0), "{}", text(&approved.stderr));
    let log = case.log(&gated);
    let delivered: Vec<&serde_json::Value> =
        log.iter().filter(|e| e["kind"] == "steering_delivered").collect();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    let ids: Vec<String> = (1..=16).map(|n| format!("steer-{n}")).collect();
    assert_eq!(delivered[0]["data"]["ids"], serde_json::json!(ids));
    let prompt = log.iter().find(|e| sent_by(e, "a")).unwrap()["data"]["prompt"].clone();
    let prompt = prompt.as_str().unwrap();
    assert!(prompt.starts_with("A\n\n## Steering"), "{prompt}");
    assert!(prompt.find("\"note 1\"").unwrap() < prompt.find("\"note 16\"").unwrap());
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A `baton.toml` whose default model is fakellm's on `port`.
fn server_config(port: u16) -> String {
    format!(
        "[routing]\ndefault = \"free:local/fake-model\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\ntier = \"free\"\n[[providers.models]]\nname = \"fake-model\"\n"
    )
}

//! A failed attempt routed by its level's edges, through the binary and the real SQLite
//! store: a provider that refuses a request (a real OpenAI-compatible server answering
//! 400), an answer cut at `max_tokens`, a refusal — each read by gates as
//! `level.X.failed` / `level.X.error.kind` / `attempt`, each gate-driven retry recorded
//! as `retry_attempted`; only when no edge takes the failure does the run fail.

use std::path::PathBuf;
use std::process::Output;

use super::{baton, fakellm, text};

/// A scenario directory and a database of their own, removed when dropped.
struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str, scenario: &str) -> Case {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir()
            .join(format!("baton-routing-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(dir.join("scenarios")).unwrap();
        std::fs::write(dir.join("scenarios/t.yaml"), scenario).unwrap();
        Case { dir }
    }

    fn baton(&self, args: &[&str]) -> Output {
        let scenarios = self.dir.join("scenarios");
        let db = self.dir.join("runs.db");
        let mut all =
            vec!["--scenarios", scenarios.to_str().unwrap(), "--db", db.to_str().unwrap()];
        all.extend_from_slice(args);
        baton(&all)
    }

    /// Runs `t` with `args` after `run t`; the command's output and the run's log.
    fn run(&self, args: &[&str]) -> (Output, Vec<serde_json::Value>) {
        let mut all = vec!["run", "t", "--input", "x", "--json"];
        all.extend_from_slice(args);
        let out = self.baton(&all);
        let result: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}{}", text(&out.stdout), text(&out.stderr)));
        let run = result["run_id"].as_str().unwrap().to_owned();
        let events = self.baton(&["events", &run, "--json"]);
        let log = text(&events.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        (out, log)
    }

    /// Runs `t` on a script.
    fn scripted(&self, script: &str) -> (serde_json::Value, Vec<serde_json::Value>) {
        let path = self.dir.join("script.yaml");
        std::fs::write(&path, script).unwrap();
        let (out, log) = self.run(&["--script", path.to_str().unwrap()]);
        (serde_json::from_slice(&out.stdout).unwrap(), log)
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn of_kind<'a>(log: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    log.iter().filter(|e| e["kind"] == kind).collect()
}

/// The levels started, in order.
fn path(log: &[serde_json::Value]) -> Vec<String> {
    of_kind(log, "level_started")
        .iter()
        .map(|e| e["level_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_provider_answering_400_twice_is_retried_by_the_gate_and_the_run_completes() {
    let case = Case::new(
        "provider",
        "id: t\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'Name the capital of France.'}}\nedges:\n  - {from: a, to: a, when: attempt < 3}\n  - {from: a, to: __end__}\n",
    );
    std::fs::write(
        case.dir.join("rules.yaml"),
        "version: 1\nrules:\n  - name: refuse\n    when: {turn_in: [1, 2]}\n    respond: {status: 400, error: 'bad request'}\n  - name: answer\n    when: {messages_contain: capital}\n    respond: {content: Paris}\n",
    )
    .unwrap();
    let server = fakellm(&case.dir.join("rules.yaml"));
    // fakellm streams a mock answer where it would refuse: this provider does not stream.
    let config = server.config().replace("tier = \"free\"\n", "tier = \"free\"\nstream = false\n");
    std::fs::write(case.dir.join("baton.toml"), config).unwrap();
    let config = case.dir.join("baton.toml");
    let (out, log) = case.run(&["--config", config.to_str().unwrap()]);
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed", "{}", text(&out.stderr));
    assert_eq!(result["final_output"], "Paris");
    assert_eq!(path(&log), ["a", "a", "a"]);
    assert_eq!(of_kind(&log, "model_call_failed").len(), 2, "{log:#?}");
    let failed: Vec<_> = of_kind(&log, "level_finished")
        .into_iter()
        .map(|e| e["data"]["error_kind"].as_str().unwrap_or("none").to_owned())
        .collect();
    assert_eq!(failed, ["provider", "provider", "none"]);
    let retries: Vec<_> =
        of_kind(&log, "retry_attempted").into_iter().map(|e| &e["data"]).collect();
    assert_eq!(retries.len(), 2, "{retries:?}");
    for (n, retry) in retries.iter().enumerate() {
        assert_eq!(retry["level"], "a");
        assert_eq!(retry["attempt"], n + 2);
        let reason = retry["reason"].as_str().unwrap();
        assert!(reason.starts_with("provider: ") && reason.contains("400"), "{reason}");
    }
    // The timeline says how each attempt failed.
    let timeline = case.baton(&["events", result["run_id"].as_str().unwrap()]);
    let timeline = text(&timeline.stdout);
    assert!(timeline.contains("failed    a (provider)"), "{timeline}");
    assert!(timeline.contains("retry     a attempt 3"), "{timeline}");
}

#[test]
fn an_answer_cut_at_max_tokens_is_routed_to_the_escalation_level() {
    let case = Case::new(
        "truncated",
        "id: t\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: A}}\n  - {id: lead, kind: prompt, prompt: {inline: L}, terminal: true}\nedges:\n  - {from: a, to: lead, when: \"level.a.error.kind == 'truncated'\"}\n  - {from: a, to: __fail__, when: level.a.failed}\n  - {from: a, to: __end__}\n  - {from: lead, to: __end__}\n",
    );
    let (result, log) = case.scripted(
        "levels:\n  a: [{text: 'half an ans', stop_reason: max_tokens}]\n  lead: [{text: 'the lead answers'}]\n",
    );
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["final_output"], "the lead answers");
    assert_eq!(path(&log), ["a", "lead"]);
    let a = of_kind(&log, "level_finished")[0];
    assert_eq!(a["data"]["error_kind"], "truncated", "{a}");
    let gate = of_kind(&log, "gate_decision")[0];
    assert_eq!(gate["data"]["target"], "lead");
    assert_eq!(gate["data"]["readings"][0]["value"], "truncated", "{gate}");
    assert!(of_kind(&log, "retry_attempted").is_empty(), "an escalation is no retry");
}

#[test]
fn a_refusal_is_routed_and_a_failure_no_edge_takes_fails_the_run() {
    let scenario = "id: t\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: A}}\n  - {id: b, kind: prompt, prompt: {inline: B}, terminal: true}\nedges:\n  - {from: a, to: b, when: \"level.a.error.kind == 'refused'\"}\n  - {from: a, to: b, when: verdict == 'PASS'}\n  - {from: a, to: b}\n";
    let case = Case::new("refused", scenario);
    let (result, log) =
        case.scripted("levels:\n  a: [{refusal: 'not this'}]\n  b: [{text: 'handled'}]\n");
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(path(&log), ["a", "b"]);
    assert_eq!(of_kind(&log, "level_finished")[0]["data"]["error_kind"], "refused");
    // A provider error: the refusal's edge is false for it, and the edges that do not read
    // how `a` ended (a verdict, no gate) never carry a failed attempt on — the run fails.
    let (result, log) =
        case.scripted("levels:\n  a: [{error: 'HTTP 400: bad request'}]\n  b: [{text: 'no'}]\n");
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(path(&log), ["a"]);
    let finished = of_kind(&log, "scenario_finished")[0];
    assert!(
        finished["data"]["aborted_reason"].as_str().unwrap().contains("bad request"),
        "{finished}"
    );
}

#[test]
fn a_loop_on_a_failure_that_never_passes_is_bounded_by_max_level_runs() {
    let case = Case::new(
        "bounded",
        "id: t\nversion: 1\nbudget: {max_level_runs: 4}\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: A}}\nedges:\n  - {from: a, to: a, when: level.a.failed}\n  - {from: a, to: __end__}\n",
    );
    let (result, log) = case.scripted("levels:\n  a: [{error: 'HTTP 400: always'}]\n");
    assert_eq!(result["status"], "aborted", "{result}");
    assert_eq!(path(&log).len(), 4);
    assert_eq!(of_kind(&log, "retry_attempted").len(), 3);
}

#[test]
fn validate_knows_the_error_kinds_and_warns_of_failures_no_edge_takes() {
    let case = Case::new(
        "validate",
        "id: t\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: A}, response: verdict}\nedges:\n  - {from: a, to: a, when: \"level.a.error.kind == 'truncated' && attempt < 3\"}\n  - {from: a, to: __end__}\n",
    );
    let out = case.baton(&["validate"]);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("uncovered-failure"), "{said}");
    // The ones no edge takes: the hard errors other than truncation. An answer that does
    // not read is routed by every edge, the unconditional one too.
    assert!(said.contains("`provider`, `refused`"), "{said}");
    assert!(!said.contains("`invalid`"), "{said}");
    std::fs::write(
        case.dir.join("scenarios/t.yaml"),
        "id: t\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: A}}\nedges:\n  - {from: a, to: __fail__, when: \"level.a.error.kind == 'providr'\"}\n",
    )
    .unwrap();
    let out = case.baton(&["validate"]);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("'providr' never matches"), "{said}");
    assert!(said.contains("did you mean 'provider'"), "{said}");
    // A gate on `failed` that takes every kind: no warning.
    std::fs::write(
        case.dir.join("scenarios/t.yaml"),
        "id: t\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: A}}\nedges:\n  - {from: a, to: a, when: level.a.failed && attempt < 3}\n  - {from: a, to: __end__}\n",
    )
    .unwrap();
    let out = case.baton(&["validate"]);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(!said.contains("uncovered-failure"), "{said}");
}

#[test]
fn a_classifier_whose_call_fails_lands_the_job_in_quick_qa_saying_why() {
    // The bundled scenarios and selection: a `task` job is classified by intent_classifier,
    // whose own model call fails for good.
    let dir = std::env::temp_dir().join(format!("baton-routing-classifier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("script.yaml");
    std::fs::write(
        &script,
        "scenarios:\n  intent_classifier:\n    levels:\n      classify: [{error: 'the classifier provider is down for good'}]\n  quick_qa:\n    levels:\n      answer: [{text: '{\"answer\": \"Paris\", \"confidence\": 0.97, \"sources\": []}'}]\n",
    )
    .unwrap();
    let db = dir.join("runs.db");
    let scenarios = super::repo().join("scenarios");
    let out = baton(&[
        "--scenarios",
        scenarios.to_str().unwrap(),
        "--db",
        db.to_str().unwrap(),
        "run",
        "--kind",
        "task",
        "--script",
        script.to_str().unwrap(),
        "--input",
        "What is the capital of France?",
        "--json",
    ]);
    let result: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}{}", text(&out.stdout), text(&out.stderr)));
    assert_eq!(result["status"], "completed", "{result}{}", text(&out.stderr));
    assert!(result["final_output"].as_str().unwrap().contains("Paris"), "{result}");
    let run = result["run_id"].as_str().unwrap();
    let events = baton(&["--db", db.to_str().unwrap(), "events", run, "--tree", "--json"]);
    let log: Vec<serde_json::Value> =
        text(&events.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let chained = of_kind(&log, "scenario_chained");
    assert_eq!(chained.len(), 1, "{log:#?}");
    assert_eq!(chained[0]["data"]["to"], "quick_qa", "{}", chained[0]);
    let warning = chained[0]["data"]["warning"].as_str().unwrap();
    assert!(
        warning.contains("the classifier ended failed")
            && warning.contains("the classifier provider is down for good"),
        "{warning}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

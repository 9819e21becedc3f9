//! A level's `timeout_s` through the binary and the real SQLite store: every kind's attempt
//! is cut at its deadline, recorded as `level_timed_out`, routed on by a gate
//! (`level.X.timed_out`), and leaves nothing running or writing after it.

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use super::{baton, text};

/// A name no other test of this process uses.
fn unique() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// A scenario directory and a database of their own, removed when dropped.
struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str, scenario: &str, script: &str) -> Case {
        let dir = std::env::temp_dir().join(format!(
            "baton-timeouts-{name}-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(dir.join("scenarios")).unwrap();
        std::fs::write(dir.join("scenarios/s.yaml"), scenario).unwrap();
        std::fs::write(dir.join("script.yaml"), script).unwrap();
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

    /// Runs scenario `t` on the script; the run's id and how long the command took.
    fn run(&self) -> (Output, String, Duration) {
        self.run_with(&[])
    }

    /// Runs `t` with `extra` global flags (such as `--no-jail`).
    fn run_with(&self, extra: &[&str]) -> (Output, String, Duration) {
        let script = self.dir.join("script.yaml");
        let t = Instant::now();
        let mut args = extra.to_vec();
        args.extend(["run", "t", "--script", script.to_str().unwrap(), "--input", "x"]);
        let out = self.baton(&args);
        let took = t.elapsed();
        let o = text(&out.stdout);
        let run = o.lines().find_map(|l| l.strip_prefix("run ")).unwrap_or_default().to_owned();
        (out, run, took)
    }

    fn events(&self, run: &str) -> Vec<serde_json::Value> {
        let out = self.baton(&["events", run, "--json"]);
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn kinds_of(events: &[serde_json::Value], level: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["level_id"] == level)
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// The run's log, and that it does not grow once its command has returned.
fn settled_log(case: &Case, run: &str, wait: Duration) -> Vec<serde_json::Value> {
    let before = case.events(run);
    std::thread::sleep(wait);
    let after = case.events(run);
    assert_eq!(before.len(), after.len(), "events were appended after the run ended");
    after
}

fn assert_completed(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
}

/// The gate that routes a timed-out level to `handled`, and its end.
const ROUTES: &str = "
  - {id: handled, kind: prompt, prompt: {inline: H}, terminal: true}
edges:
  - {from: slow, to: handled, when: level.slow.timed_out}
  - {from: slow, to: __end__}
  - {from: handled, to: __end__}
";

#[test]
fn a_prompt_level_is_cut_at_its_timeout_and_a_gate_routes_on_it() {
    let scenario = format!(
        "id: t\nversion: 1\nlevels:\n  - {{id: slow, kind: prompt, prompt: {{inline: S}}, timeout_s: 1}}\n{ROUTES}"
    );
    let case = Case::new(
        "prompt",
        &scenario,
        "levels:\n  slow: [{text: late, delay_ms: 3000}]\n  handled: [{text: handled}]\n",
    );
    let (out, run, took) = case.run();
    assert_completed(&out);
    assert!(took < Duration::from_millis(2800), "the 3 s answer was waited for: {took:?}");
    let log = settled_log(&case, &run, Duration::from_millis(2500));
    let slow = kinds_of(&log, "slow");
    assert!(slow.contains(&"level_timed_out".to_owned()), "{slow:?}");
    assert!(!slow.contains(&"model_response".to_owned()), "the cut call answered: {slow:?}");
    let finished = log.iter().find(|e| e["level_id"] == "slow" && e["kind"] == "level_finished");
    let finished = &finished.unwrap()["data"];
    assert_eq!(finished["ok"], false, "{finished}");
    assert_eq!(finished["conflict"], "timed_out:slow", "{finished}");
    assert!(kinds_of(&log, "handled").contains(&"level_finished".to_owned()), "not routed");
}

#[test]
fn a_timeout_counts_on_the_escalation_tracker() {
    let scenario = "
id: t
version: 1
defaults: {max_attempts_per_conflict: 2}
levels:
  - {id: slow, kind: prompt, prompt: {inline: S}, timeout_s: 0.5}
  - {id: lead, kind: prompt, prompt: {inline: L}, terminal: true}
edges:
  - {from: slow, to: lead, when: escalate_now}
  - {from: slow, to: slow, when: level.slow.timed_out}
  - {from: slow, to: __end__}
  - {from: lead, to: __end__}
";
    let case = Case::new(
        "escalate",
        scenario,
        "levels:\n  slow: [{text: a, delay_ms: 3000}, {text: b, delay_ms: 3000}]\n  lead: [{text: took over}]\n",
    );
    let (out, run, _) = case.run();
    assert_completed(&out);
    let log = case.events(&run);
    let timeouts = kinds_of(&log, "slow").iter().filter(|k| *k == "level_timed_out").count();
    assert_eq!(timeouts, 2, "{log:?}");
    assert!(kinds_of(&log, "lead").contains(&"level_finished".to_owned()), "not escalated");
}

#[test]
fn a_verifier_level_is_cut_and_its_process_killed() {
    let marker_dir = std::env::temp_dir().join(format!("baton-timeouts-marker-{}", unique()));
    std::fs::create_dir_all(&marker_dir).unwrap();
    let marker = marker_dir.join("written");
    let scenario = format!(
        r#"id: t
version: 1
levels:
  - id: slow
    kind: verifier
    timeout_s: 1
    verifiers:
      - name: sleeper
        uses: command
        timeout_s: 30
        params: {{argv: ["sh", "-c", "sleep 3; touch {}"]}}
{ROUTES}"#,
        marker.display()
    );
    let case = Case::new("verifier", &scenario, "levels:\n  handled: [{text: handled}]\n");
    let (out, run, took) = case.run();
    assert_completed(&out);
    assert!(took < Duration::from_millis(2800), "the sleeping verifier was waited for: {took:?}");
    let log = settled_log(&case, &run, Duration::from_millis(3500));
    assert!(kinds_of(&log, "slow").contains(&"level_timed_out".to_owned()), "{log:?}");
    assert!(!marker.exists(), "the verifier's process outlived the timeout");
    let _ = std::fs::remove_dir_all(&marker_dir);
}

#[test]
fn a_fan_out_child_is_cut_at_its_own_timeout() {
    let scenario = "
id: t
version: 1
levels:
  - {id: f, kind: fan_out, fan_out: [slow, quick], fan_in: {aggregator: all_pass}}
  - {id: slow, kind: prompt, prompt: {inline: S}, timeout_s: 1}
  - {id: quick, kind: prompt, prompt: {inline: Q}}
  - {id: handled, kind: prompt, prompt: {inline: H}, terminal: true}
edges:
  - {from: f, to: handled, when: level.slow.timed_out}
  - {from: f, to: __end__}
  - {from: handled, to: __end__}
";
    let case = Case::new(
        "fanout",
        scenario,
        "levels:\n  slow: [{text: late, delay_ms: 3000}]\n  quick: [{text: fine}]\n  handled: [{text: handled}]\n",
    );
    let (out, run, took) = case.run();
    assert_completed(&out);
    assert!(took < Duration::from_millis(2800), "the slow child was waited for: {took:?}");
    let log = settled_log(&case, &run, Duration::from_millis(2500));
    assert!(kinds_of(&log, "slow").contains(&"level_timed_out".to_owned()), "{log:?}");
    assert!(kinds_of(&log, "quick").contains(&"model_response".to_owned()), "{log:?}");
    assert!(kinds_of(&log, "handled").contains(&"level_finished".to_owned()), "not routed");
}

#[test]
fn a_tool_loop_attempt_is_cut_at_its_timeout() {
    let scenario = format!(
        "id: t\nversion: 1\nlevels:\n  - {{id: slow, kind: tool_loop, prompt: {{inline: S}}, max_iterations: 10, timeout_s: 1.5}}\n{ROUTES}"
    );
    let turn = "{tool_calls: [{name: list_dir, arguments: {}}], delay_ms: 700}";
    let script = format!(
        "levels:\n  slow: [{turn}, {turn}, {turn}, {turn}, {turn}, {{tool_calls: [{{name: finish, arguments: {{summary: done}}}}]}}]\n  handled: [{{text: handled}}]\n"
    );
    let case = Case::new("toolloop", &scenario, &script);
    let (out, run, took) = case.run();
    assert_completed(&out);
    assert!(took < Duration::from_millis(3200), "the loop ran on: {took:?}");
    let log = settled_log(&case, &run, Duration::from_millis(1500));
    let slow = kinds_of(&log, "slow");
    assert!(slow.contains(&"level_timed_out".to_owned()), "{slow:?}");
    assert!(kinds_of(&log, "handled").contains(&"level_finished".to_owned()), "not routed");
}

#[test]
fn max_duration_s_stops_a_run_during_a_step() {
    let scenario = "
id: t
version: 1
budget: {max_duration_s: 1}
levels:
  - {id: slow, kind: prompt, prompt: {inline: S}, terminal: true}
";
    let case = Case::new("duration", scenario, "levels:\n  slow: [{text: late, delay_ms: 3000}]\n");
    let (out, run, took) = case.run();
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(took < Duration::from_millis(2800), "the step ran past the budget: {took:?}");
    let log = settled_log(&case, &run, Duration::from_millis(2500));
    let exceeded = log.iter().find(|e| e["kind"] == "budget_exceeded").expect("no budget_exceeded");
    assert_eq!(exceeded["data"]["limit_kind"], "duration", "{exceeded}");
    let end = &log.last().unwrap()["data"];
    assert_eq!(end["status"], "aborted", "{end}");
    assert!(
        !kinds_of(&log, "slow").contains(&"model_response".to_owned()),
        "the cut call answered"
    );
}

#[test]
fn the_wait_for_an_approval_does_not_count_against_max_duration_s() {
    let scenario = "
id: t
version: 1
budget: {max_duration_s: 1}
levels:
  - {id: ask, kind: human_approval}
  - {id: work, kind: prompt, prompt: {inline: W}, terminal: true}
edges:
  - {from: ask, to: work}
";
    let case = Case::new("idle", scenario, "levels:\n  work: [{text: done, delay_ms: 400}]\n");
    let (out, run, _) = case.run();
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    std::thread::sleep(Duration::from_millis(1500));
    let out = case.baton(&["approve", &run, "--by", "ann"]);
    assert_completed(&out);
    let log = case.events(&run);
    let end = &log.last().unwrap()["data"];
    assert_eq!(end["status"], "completed", "{end}");
    let worked = end["totals"]["duration_ms"].as_u64().unwrap();
    assert!(worked < 1000, "the wait for a person was counted: {worked} ms");
}

#[test]
fn a_process_that_keeps_a_verifiers_output_open_does_not_stretch_its_timeout() {
    // The program exits at once, but a grandchild in a session of its own (out of the
    // process group Baton kills) holds its stdout for 20 s.
    let marker = format!("baton-timeouts-setsid-{}", unique());
    let scenario = format!(
        r#"id: t
version: 1
levels:
  - id: slow
    kind: verifier
    verifiers:
      - name: daemonizes
        uses: command
        timeout_s: 2
        params: {{argv: ["sh", "-c", "setsid sh -c 'sleep 20; echo {marker}' & sleep 0.5; exit 0"]}}
    terminal: true
"#
    );
    let alive = || {
        std::process::Command::new("pgrep")
            .args(["-f", &format!("echo {marker}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    // In the jail, the program's exit ends its PID namespace: the kernel kills the
    // grandchild, setsid or not, and the verifier passes at once.
    let case = Case::new("setsid", &scenario, "levels: {}\n");
    let (out, run, took) = case.run();
    assert!(took < Duration::from_secs(10), "the readers waited for the grandchild: {took:?}");
    let log = case.events(&run);
    let verdict = log.iter().find(|e| e["kind"] == "verifier_finished").unwrap();
    assert_eq!(verdict["data"]["passed"], true, "{}", text(&out.stdout));
    assert!(!alive(), "the grandchild outlived the jail");

    // Without the jail (`--no-jail`) the grandchild escapes the group; the readers still
    // end with the timeout, and the verifier fails saying why.
    let case = Case::new("setsid-unjailed", &scenario, "levels: {}\n");
    let (out, run, took) = case.run_with(&["--no-jail"]);
    assert!(took < Duration::from_secs(10), "the readers waited for the grandchild: {took:?}");
    assert!(text(&out.stderr).contains("warning: --no-jail"), "{}", text(&out.stderr));
    let log = case.events(&run);
    let verdict = log.iter().find(|e| e["kind"] == "verifier_finished").unwrap();
    assert_eq!(verdict["data"]["passed"], false, "{}", text(&out.stdout));
    assert_eq!(verdict["data"]["details"]["jail"], "off", "{verdict}");
    let reasons = verdict["data"]["reasons"].to_string();
    assert!(reasons.contains("kept its output open"), "{reasons}");
    // That grandchild is outside Baton's reach: end it here.
    let _ = std::process::Command::new("pkill").args(["-f", &marker]).status();
}

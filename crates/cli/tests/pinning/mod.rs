//! Runs keep the scenario version they started with, through the `baton` binary on a real
//! SQLite file: a paused run finishes on its own prompts and YAML however the files
//! changed; `resume --upgrade` moves it to the current files (recorded, refused when a
//! level it ran is gone); a version's texts are stored once; a run from before versions
//! were stored resumes from the directory while its files are unchanged.

use std::path::PathBuf;

use rusqlite::Connection;

use super::{baton_db, repo, text};

/// A directory with a copy of the bundled `release_notes` scenario and its prompts, and
/// the database path beside it.
struct Place {
    dir: PathBuf,
    scenarios: PathBuf,
    db: PathBuf,
}

impl Place {
    fn new(name: &str) -> Place {
        let dir = std::env::temp_dir().join(format!("baton-pinning-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let scenarios = dir.join("scenarios");
        let prompts = scenarios.join("prompts/release_notes");
        std::fs::create_dir_all(&prompts).unwrap();
        let bundled = repo().join("scenarios");
        std::fs::copy(bundled.join("release_notes.yaml"), scenarios.join("release_notes.yaml"))
            .unwrap();
        for file in ["draft.j2", "review.j2", "sign_off.j2", "publish.j2"] {
            std::fs::copy(bundled.join("prompts/release_notes").join(file), prompts.join(file))
                .unwrap();
        }
        let db = dir.join("runs.db");
        Place { dir, scenarios, db }
    }

    fn baton(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec!["--scenarios", self.scenarios.to_str().unwrap()];
        all.extend_from_slice(args);
        baton_db(&self.db, &all)
    }

    /// Starts a run; it pauses for the sign-off. Returns its id.
    fn paused_run(&self) -> String {
        let out = self.baton(&[
            "run",
            "release_notes",
            "--script",
            "scenarios/scripts/release_notes.yaml",
            "--input",
            "PR 1: CSV export",
        ]);
        assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned()
    }

    /// Edits the publish prompt and the YAML (a new version number).
    fn edit(&self) {
        let prompt = self.scenarios.join("prompts/release_notes/publish.j2");
        std::fs::write(&prompt, "NEW PUBLISH PROMPT\n{{ level.draft.output }}\n").unwrap();
        let yaml = self.scenarios.join("release_notes.yaml");
        let text = std::fs::read_to_string(&yaml).unwrap().replace("version: 1", "version: 2");
        std::fs::write(&yaml, text).unwrap();
    }

    /// Rewrites the YAML without the `review` level (draft goes straight to the sign-off).
    fn remove_review(&self) {
        let yaml = self.scenarios.join("release_notes.yaml");
        let text = std::fs::read_to_string(&yaml).unwrap();
        let start = text.find("  - id: review").unwrap();
        let end = text.find("  - id: sign_off").unwrap();
        let mut text = format!("{}{}", &text[..start], &text[end..]);
        for edge in [
            "  - {from: draft, to: review}\n",
            "  - {from: review, to: sign_off, when: \"verdict == 'PASS'\"}\n",
            "  - {from: review, to: sign_off, when: escalate_now}\n",
            "  - {from: review, to: draft}\n",
        ] {
            assert!(text.contains(edge), "{edge}");
            text = text.replace(edge, "");
        }
        text = text.replace("edges:\n", "edges:\n  - {from: draft, to: sign_off}\n");
        std::fs::write(&yaml, text.replace("version: 1", "version: 3")).unwrap();
    }

    fn events(&self, run: &str) -> Vec<serde_json::Value> {
        let out = self.baton(&["events", run, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// The prompt sent to the `publish` level, and every event kind, of a run.
    fn publish_prompt(&self, run: &str) -> String {
        let events = self.events(run);
        let sent: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["kind"] == "prompt_sent" && e["level_id"] == "publish")
            .collect();
        assert_eq!(sent.len(), 1, "{events:#?}");
        sent[0]["data"]["prompt"].as_str().unwrap().to_owned()
    }

    fn kinds(&self, run: &str) -> Vec<String> {
        self.events(run).iter().map(|e| e["kind"].as_str().unwrap().to_owned()).collect()
    }

    /// How many scenario versions the database keeps texts for.
    fn versions_kept(&self) -> i64 {
        let conn = Connection::open(&self.db).unwrap();
        conn.query_row("SELECT COUNT(*) FROM scenario_texts", [], |r| r.get(0)).unwrap()
    }

    /// Makes the database look like one from before versions were kept.
    fn forget_versions(&self) {
        let conn = Connection::open(&self.db).unwrap();
        conn.execute("DELETE FROM scenario_texts", []).unwrap();
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn assert_code(out: &std::process::Output, code: i32) {
    assert_eq!(out.status.code(), Some(code), "{}{}", text(&out.stdout), text(&out.stderr));
}

const OLD_PROMPT: &str = "Format these approved release notes as Markdown";

#[test]
fn a_paused_run_finishes_on_the_version_it_started_with_whatever_happened_to_its_files() {
    let place = Place::new("keep");
    let by_approve = place.paused_run();
    let by_resume = place.paused_run();
    assert_eq!(place.versions_kept(), 1, "two runs of one version keep one copy of its texts");
    place.edit();

    // `approve` continues the run on its own version.
    let out = place.baton(&["approve", &by_approve, "--by", "ann"]);
    assert_code(&out, 0);
    assert!(text(&out.stdout).contains("finished  completed"), "{}", text(&out.stdout));
    let prompt = place.publish_prompt(&by_approve);
    assert!(prompt.starts_with(OLD_PROMPT) && !prompt.contains("NEW"), "{prompt}");

    // So does `resume` after a decision recorded without continuing.
    assert_code(&place.baton(&["approve", &by_resume, "--no-resume"]), 0);
    let out = place.baton(&["resume", &by_resume, "--json"]);
    assert_code(&out, 0);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "completed");
    let prompt = place.publish_prompt(&by_resume);
    assert!(prompt.starts_with(OLD_PROMPT) && !prompt.contains("NEW"), "{prompt}");
    assert!(!place.kinds(&by_resume).contains(&"scenario_upgraded".to_owned()));

    // A run started on the edited files is a new version, kept beside the first.
    let fresh = place.paused_run();
    assert_eq!(place.versions_kept(), 2);
    assert_code(&place.baton(&["approve", &fresh]), 0);
    assert!(place.publish_prompt(&fresh).starts_with("NEW PUBLISH PROMPT"));
}

#[test]
fn resume_upgrade_moves_a_paused_run_to_the_current_files_and_records_it() {
    let place = Place::new("upgrade");
    let run = place.paused_run();
    place.edit();
    assert_code(&place.baton(&["approve", &run, "--no-resume"]), 0);
    let out = place.baton(&["resume", &run, "--upgrade"]);
    assert_code(&out, 0);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("upgraded  v1") && stdout.contains("→ v2"), "{stdout}");
    assert!(stdout.contains("finished  completed"), "{stdout}");
    let prompt = place.publish_prompt(&run);
    assert!(prompt.starts_with("NEW PUBLISH PROMPT"), "{prompt}");
    let events = place.events(&run);
    let upgraded: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["kind"] == "scenario_upgraded").collect();
    assert_eq!(upgraded.len(), 1);
    assert_eq!(upgraded[0]["data"]["from_version"], 1);
    assert_eq!(upgraded[0]["data"]["version"], 2);
    assert_eq!(upgraded[0]["data"]["from_checksum"], events[0]["data"]["checksum"]);
    assert_eq!(place.versions_kept(), 2, "the new version's texts are kept too");
}

#[test]
fn resume_upgrade_is_refused_when_a_level_the_run_ran_is_gone() {
    let place = Place::new("refused");
    let run = place.paused_run();
    place.remove_review();
    let before = place.events(&run).len();
    let out = place.baton(&["resume", &run, "--upgrade"]);
    assert_code(&out, 1);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("run {run}")) && stderr.contains("no level `review`"),
        "{stderr}"
    );
    assert_eq!(place.events(&run).len(), before, "nothing was recorded");
    // The run still finishes on its own version.
    let out = place.baton(&["approve", &run]);
    assert_code(&out, 0);
    assert!(place.publish_prompt(&run).starts_with(OLD_PROMPT));
}

#[test]
fn a_run_from_before_versions_were_kept_resumes_from_unchanged_files_else_says_what_to_do() {
    let place = Place::new("legacy");
    let unchanged = place.paused_run();
    let changed = place.paused_run();
    place.forget_versions();

    // Its files are as it started: it continues from them, and keeps them from then on.
    assert_code(&place.baton(&["approve", &unchanged]), 0);
    assert!(place.publish_prompt(&unchanged).starts_with(OLD_PROMPT));
    assert_eq!(place.versions_kept(), 1);
    place.forget_versions();

    // Its files changed: the decision is recorded, the run is not continued, and the
    // message says why and what to do.
    place.edit();
    let out = place.baton(&["approve", &changed]);
    assert_code(&out, 0);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("started before Baton kept scenario versions")
            && stderr.contains("has changed since")
            && stderr.contains(&format!("baton resume {changed} --upgrade")),
        "{stderr}"
    );
    let out = place.baton(&["resume", &changed]);
    assert_code(&out, 1);
    assert!(text(&out.stderr).contains("has changed since"), "{}", text(&out.stderr));
    // Moving it to the current files is the way on.
    assert_code(&place.baton(&["resume", &changed, "--upgrade"]), 0);
    assert!(place.publish_prompt(&changed).starts_with("NEW PUBLISH PROMPT"));
}

#[test]
fn stored_texts_that_no_longer_hash_to_the_run_are_refused() {
    let place = Place::new("tampered");
    let run = place.paused_run();
    let conn = Connection::open(&place.db).unwrap();
    let texts: String =
        conn.query_row("SELECT texts FROM scenario_texts", [], |r| r.get(0)).unwrap();
    let edited = texts.replace("Format these approved", "Format these edited");
    assert_ne!(edited, texts);
    conn.execute("UPDATE scenario_texts SET texts = ?1", [&edited]).unwrap();
    drop(conn);
    assert_code(&place.baton(&["approve", &run, "--no-resume"]), 0);
    let out = place.baton(&["resume", &run]);
    assert_code(&out, 1);
    assert!(text(&out.stderr).contains("not to the run's checksum"), "{}", text(&out.stderr));
}

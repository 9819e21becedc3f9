//! Webhooks end to end: deliveries written with their events by CLI runs while no server
//! runs, sent by `baton serve` to a receiver that is down for three first backoffs — one
//! server SIGKILLed meanwhile, the next taking over — and arriving once each at a real
//! receiver that verifies every signature with PyPI `standardwebhooks`; a rotation whose
//! old and new secrets both sign; the API's webhooks, scoped to the tenant's admins.

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::serve::{bearer, http, serve, token};
use super::{baton_in, repo, scratch, text};

/// The first backoff the test configures: attempts at 0, 1, 3, 7, 15 … seconds.
const FIRST_BACKOFF_S: f64 = 1.0;

struct Receiver(Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn receiver(dir: &Path, port: u16) -> Receiver {
    let python = repo().join(".peers/venv/bin/python");
    let child = Command::new(python)
        .arg(repo().join("crates/cli/tests/webhooks/receiver.py"))
        .arg(port.to_string())
        .arg(dir.join("secrets"))
        .arg(dir.join("received.jsonl"))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the receiver did not start (is standardwebhooks installed? run scripts/test)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Receiver(child)
}

fn received(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("received.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn baton(dir: &Path, db: &Path, args: &[&str]) -> Output {
    baton_in(dir, db).arg("--config").arg(dir.join("baton.toml")).args(args).output().unwrap()
}

fn ok(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

fn deliveries(dir: &Path, db: &Path, id: &str) -> Vec<Value> {
    let out = baton(dir, db, &["webhook", "deliveries", id, "--tenant", "acme", "--json"]);
    serde_json::from_str::<Value>(&ok(&out)).unwrap().as_array().unwrap().clone()
}

fn wait_until<T>(what: &str, seconds: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "waited {seconds} s for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn time(v: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap()
}

#[test]
fn a_receiver_down_for_three_backoffs_gets_every_delivery_once_signed_and_a_restart_loses_none() {
    let dir = scratch("webhooks");
    super::replay::copy_scenarios(&dir);
    let db = dir.join("runs.db");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    // Without `allow_private`, a loopback receiver is refused before anything is kept.
    std::fs::write(dir.join("baton.toml"), "").unwrap();
    let refused = baton(&dir, &db, &["webhook", "add", "--tenant", "acme", "--url", &url]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("is loopback"), "{}", text(&refused.stderr));
    std::fs::write(
        dir.join("baton.toml"),
        format!(
            "[egress]\nallow_private = true\n\n[webhooks]\nfirst_backoff_s = {FIRST_BACKOFF_S}\n"
        ),
    )
    .unwrap();
    let added = ok(&baton(
        &dir,
        &db,
        &[
            "webhook",
            "add",
            "--tenant",
            "acme",
            "--url",
            &url,
            "--events",
            "run.completed,approval.requested",
        ],
    ));
    let field = |name: &str, from: &str| {
        from.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().trim().to_owned()
    };
    let (id, secret) = (field("webhook", &added), field("secret", &added));
    assert!(secret.starts_with("whsec_"), "{added}");
    std::fs::write(dir.join("secrets"), format!("{secret}\n")).unwrap();
    let listed = ok(&baton(&dir, &db, &["webhook", "list", "--tenant", "acme", "--json"]));
    assert!(listed.contains(&id) && !listed.contains(&secret), "never the secret: {listed}");

    // Runs of the tenant, by the CLI alone: their deliveries wait in the outbox.
    let script = |name: &str| repo().join("scenarios/scripts").join(name).display().to_string();
    let mut runs = Vec::new();
    for (scenario, status) in
        [("quick_qa", "completed"), ("quick_qa", "completed"), ("release_notes", "paused")]
    {
        // A paused run exits 3.
        let out = text(
            &baton(
                &dir,
                &db,
                &[
                    "run",
                    scenario,
                    "--tenant",
                    "acme",
                    "--input",
                    "What is the capital of France?",
                    "--script",
                    &script(&format!("{scenario}.yaml")),
                    "--json",
                ],
            )
            .stdout,
        );
        let result: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(result["status"], status, "{result}");
        runs.push(result["run_id"].as_str().unwrap().to_owned());
    }
    let pending = deliveries(&dir, &db, &id);
    assert_eq!(pending.len(), 3, "{pending:?}");
    assert!(pending.iter().all(|d| d["state"] == "pending" && d["attempts"] == 0));

    // A server sends while the receiver is down, and is killed; the next one goes on.
    let first = serve(&dir, &db, &["--config", dir.join("baton.toml").to_str().unwrap()]);
    wait_until("a failed attempt of every delivery", 30, || {
        deliveries(&dir, &db, &id).iter().all(|d| d["attempts"].as_u64() >= Some(1)).then_some(())
    });
    drop(first);
    let admin = bearer(&token(&dir, &db, "acme", "admin", "ada"));
    let operator = bearer(&token(&dir, &db, "acme", "operator", "olga"));
    let stranger = bearer(&token(&dir, &db, "globex", "admin", "gil"));
    let second = serve(&dir, &db, &["--config", dir.join("baton.toml").to_str().unwrap()]);
    std::thread::sleep(Duration::from_secs_f64(3.0 * FIRST_BACKOFF_S));
    // Back once it listens (a send while it starts fails like one while it is down).
    let receiver = receiver(&dir, port);
    let up = chrono::Utc::now();
    wait_until("every delivery", 40, || {
        let got = received(&dir);
        (got.iter().filter(|e| e["first"] == true).count() >= 3).then_some(())
    });

    // Each arrived once (after deduplication on its id), verified by the reference library,
    // at the first attempt after the receiver came back.
    let got = received(&dir);
    assert!(got.iter().all(|e| e["rejected"].is_null()), "{got:?}");
    let firsts: Vec<&Value> = got.iter().filter(|e| e["first"] == true).collect();
    assert_eq!(firsts.len(), 3);
    let mut ids: Vec<&str> = firsts.iter().map(|e| e["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    assert!(firsts.iter().all(|e| e["verified"] == json!([0])), "{firsts:?}");
    let mut kinds: Vec<(String, String)> = firsts
        .iter()
        .map(|e| {
            (
                e["body"]["type"].as_str().unwrap().to_owned(),
                e["body"]["data"]["run_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    kinds.sort();
    let mut expected = vec![
        ("approval.requested".to_owned(), runs[2].clone()),
        ("run.completed".to_owned(), runs[0].clone()),
        ("run.completed".to_owned(), runs[1].clone()),
    ];
    expected.sort();
    assert_eq!(kinds, expected);
    for d in deliveries(&dir, &db, &id) {
        assert_eq!(d["state"], "delivered", "{d}");
        let attempts = d["attempts_made"].as_array().unwrap();
        let (failed, last) = attempts.split_at(attempts.len() - 1);
        assert!(!failed.is_empty(), "the receiver was down at first: {d}");
        assert!(failed.iter().all(|a| a["status"].is_null() && a["error"].is_string()), "{d}");
        assert_eq!(last[0]["status"], 204, "{d}");
        // The success is the first attempt after the receiver's return: it comes one
        // backoff step after the last failure, which was before the return.
        let (before, at) = (time(&failed[failed.len() - 1]["at"]), time(&last[0]["at"]));
        assert!(before < up, "the last failure was while the receiver was down: {d}");
        let step = FIRST_BACKOFF_S * 2f64.powi(i32::try_from(failed.len()).unwrap() - 1);
        let waited = (at - before).num_milliseconds() as f64 / 1000.0;
        assert!(waited <= step.min(3600.0) + 1.5, "waited {waited} s, one step is {step} s: {d}");
    }

    // The API: the tenant's admins see its webhooks, an operator does not, nor another
    // tenant's admin.
    let addr = second.addr.as_str();
    let listed = http(addr, "GET", "/webhooks", &[("Authorization", &admin)], None);
    assert_eq!(listed.status, 200, "{listed:?}");
    assert_eq!(listed.json()["webhooks"][0]["id"], id.as_str());
    assert!(!listed.body.contains(&secret), "never the secret");
    assert_eq!(http(addr, "GET", "/webhooks", &[("Authorization", &operator)], None).status, 403);
    let theirs = http(
        addr,
        "GET",
        &format!("/webhooks/{id}/deliveries"),
        &[("Authorization", &stranger)],
        None,
    );
    assert_eq!(theirs.status, 404, "{theirs:?}");
    assert_eq!(
        http(addr, "GET", "/webhooks", &[("Authorization", &stranger)], None).json()["webhooks"],
        json!([])
    );
    let made = http(
        addr,
        "POST",
        "/webhooks",
        &[("Authorization", &admin)],
        Some(
            &json!({"url": "http://169.254.169.254/latest", "events": ["run.failed"]}).to_string(),
        ),
    );
    assert_eq!(made.status, 409, "the metadata address is never called: {made:?}");

    // Rotated: both secrets sign the next delivery, for 24 hours.
    let rotated = ok(&baton(&dir, &db, &["webhook", "rotate", &id, "--tenant", "acme"]));
    let new_secret = field("secret", &rotated);
    assert_ne!(new_secret, secret);
    std::fs::write(dir.join("secrets"), format!("{secret}\n{new_secret}\n")).unwrap();
    ok(&baton(
        &dir,
        &db,
        &["approve", &runs[2], "--by", "ada", "--script", &script("release_notes.yaml")],
    ));
    let finished = wait_until("the approved run's delivery", 30, || {
        received(&dir).into_iter().find(|e| {
            e["body"]["type"] == "run.completed" && e["body"]["data"]["run_id"] == runs[2].as_str()
        })
    });
    assert_eq!(finished["verified"], json!([0, 1]), "both secrets sign: {finished}");

    // Removed: nothing more is sent.
    ok(&baton(&dir, &db, &["webhook", "rm", &id, "--tenant", "acme"]));
    let before = deliveries(&dir, &db, &id).len();
    ok(&baton(
        &dir,
        &db,
        &[
            "run",
            "quick_qa",
            "--tenant",
            "acme",
            "--input",
            "What is the capital of France?",
            "--script",
            &script("quick_qa.yaml"),
        ],
    ));
    assert_eq!(deliveries(&dir, &db, &id).len(), before);
    drop(second);
    drop(receiver);
    let _ = std::fs::remove_dir_all(dir);
}

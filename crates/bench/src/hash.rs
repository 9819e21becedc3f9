//! `baton bench --workload hash`: what the hash chain costs per event on this machine.

use std::time::Instant;

use serde_json::json;

/// `hash`: what the hash chain costs per event on this machine — `chain::link` (SHA-256
/// over an event's envelope and its payload's encoding) for payloads of 200 to 2 000
/// bytes, as payload bytes per second and nanoseconds per event — with the CPU it ran on
/// and whether it has the SHA extensions the hash uses.
pub(crate) fn hash_cost() -> serde_json::Value {
    use baton_engine::chain::{Fields, GENESIS, Payload, link};
    let mut sizes = Vec::new();
    for size in [200usize, 500, 1000, 2000] {
        let payload = vec![b'x'; size];
        let fields = Fields {
            seq: 7,
            at_us: 1_700_000_000_000_000,
            kind: "model_response",
            version: baton_engine::event::VERSION,
            level_id: Some("draft"),
            attempt: Some(1),
            payload: Payload::Encoded(&payload),
        };
        // About 200 MB of payload hashed, chained as a run's events are.
        let rounds = 200_000_000 / size;
        let mut head = GENESIS;
        let started = Instant::now();
        for _ in 0..rounds {
            head = link(&head, &fields);
        }
        let took = started.elapsed();
        std::hint::black_box(head);
        sizes.push(json!({
            "payload_bytes": size,
            "mb_per_s": (size * rounds) as f64 / took.as_secs_f64() / 1e6,
            "ns_per_event": took.as_secs_f64() * 1e9 / rounds as f64,
        }));
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split(':').nth(1)))
        .map_or("unknown", str::trim);
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags").and_then(|r| r.split(':').nth(1)))
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default();
    json!({
        "workload": "hash",
        "algorithm": "sha256",
        "cpu": model,
        "sha_ni": flags.contains(&"sha_ni"),
        "avx2": flags.contains(&"avx2"),
        "sizes": sizes,
    })
}

//! What a bench measures beside wall time: the process's CPU time and the share of it
//! spent in the kernel, its memory, the disk's fsync floor under a durable figure, and
//! percentiles of the latencies taken.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use baton_store::SqliteStore;
use serde_json::json;

/// CPU time of this process so far, every thread's user and system time together, to the
/// nanosecond (`CLOCK_PROCESS_CPUTIME_ID`; /proc's 10 ms ticks would blur a short loop).
pub(crate) fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// The share of this process's CPU time so far spent in the kernel, from /proc's ticks
/// (coarse, but over a whole bench enough to tell a store that waits in syscalls).
pub(crate) fn system_share() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name and state.
    let (user, system) = (ticks(11), ticks(12));
    if user + system == 0 { 0.0 } else { system as f64 / (user + system) as f64 }
}

/// Syncs the floor is measured over, each of one 4 KiB page appended to a file.
const FSYNC_PROBES: usize = 64;

/// The disk's own floor under a durable figure, measured in the same run beside the
/// database: how long appending one 4 KiB page and `fdatasync`ing it takes (p50 and p99, in
/// milliseconds) — no commit can be faster, so a slow disk is told from a slow Baton.
pub(crate) fn fsync_floor(dir: &Path) -> anyhow::Result<(f64, f64)> {
    use std::io::Write as _;
    let path = dir.join(format!("fsync-probe-{}", uuid_like()));
    let mut file =
        std::fs::OpenOptions::new().create_new(true).append(true).open(&path).with_context(
            || format!("cannot measure the disk's fsync floor in {}", dir.display()),
        )?;
    let page = [0u8; 4096];
    let mut took = Vec::with_capacity(FSYNC_PROBES);
    for _ in 0..FSYNC_PROBES {
        let t = Instant::now();
        file.write_all(&page)?;
        file.sync_data()?;
        took.push(t.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    took.sort_unstable();
    Ok((percentile(&took, 50.0).as_secs_f64() * 1e3, percentile(&took, 99.0).as_secs_f64() * 1e3))
}

/// What a durable figure stood on, printed beside it: the store's durability setting and
/// the disk's fsync floor measured now, next to the database.
pub(crate) fn durability(
    report: &mut serde_json::Value,
    sqlite: Option<&SqliteStore>,
) -> anyhow::Result<()> {
    let Some(s) = sqlite else { return Ok(()) };
    let dir = s.path().parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let (p50, p99) = fsync_floor(&dir)?;
    if let Some(map) = report.as_object_mut() {
        map.insert("sqlite_synchronous".to_owned(), json!("FULL"));
        map.insert("fsync_floor_p50_ms".to_owned(), json!(p50));
        map.insert("fsync_floor_p99_ms".to_owned(), json!(p99));
    }
    Ok(())
}

pub(crate) fn peak_rss_kib() -> u64 {
    status_kib("VmHWM:")
}

/// A size this process's `/proc/self/status` gives in KiB (`VmRSS:`, `VmHWM:`); 0 where it
/// cannot be read.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub(crate) fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

pub(crate) fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ u128::from(std::process::id())
    )
}

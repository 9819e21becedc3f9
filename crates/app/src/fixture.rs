//! Golden fixtures on disk: `SCENARIOS/fixtures/<scenario>/<case>/`, one recorded job each.
//!
//! A fixture holds four files, all JSON so that a review reads them:
//! - `job.json` — what the job started with (scenario, input, metadata, tenant), the run
//!   it was recorded from and the event schema its log was written with;
//! - `cassette.json` — every model answer of the job's runs (`--live` adds to it);
//! - `log.jsonl` — the job's logs, one event per line, each with its run's links in the
//!   tree: the outside decisions a replay makes again come from here, and a replay is
//!   compared with it event by event;
//! - `expected.json` — the [`Summary`] a replay is judged against.
//!
//! Every file is read through the capped reader; a fixture that does not read whole is an
//! error naming the file and what to do.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use baton_engine::cassette::Cassette;
use baton_engine::event::{Event, EventData, VERSION};
use baton_engine::replay::{Summary, Tree, TreeRun};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Version of the fixture layout.
pub const FORMAT: u32 = 1;

/// The largest `job.json` or `expected.json` read.
const SMALL_FILE_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// `job.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub format: u32,
    pub scenario: String,
    pub case: String,
    pub input: String,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The run the fixture was recorded from.
    pub recorded_run: String,
    /// The checksum of the scenario version it ran.
    pub recorded_checksum: String,
    /// The event schema version of `log.jsonl`.
    pub event_schema: u16,
}

/// One line of `log.jsonl`.
#[derive(Debug, Serialize, Deserialize)]
struct LogLine {
    links: Vec<String>,
    run_id: String,
    seq: u64,
    at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    level_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    kind: String,
    data: Value,
}

/// A fixture read from its directory.
#[derive(Debug)]
pub struct Fixture {
    pub dir: PathBuf,
    pub job: Job,
    pub cassette: Cassette,
    pub tree: Tree,
    pub expected: Summary,
}

impl Fixture {
    /// `scenario/case`, as reports name it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.job.scenario, self.job.case)
    }
}

/// Where the fixtures of a scenarios directory live.
pub fn root(scenarios: &Path) -> PathBuf {
    scenarios.join("fixtures")
}

/// Checks a scenario id or case name used as a directory name.
pub fn check_name(what: &str, name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !name.starts_with('-');
    if !ok {
        bail!(
            "{what} {name:?} cannot name a fixture directory: use 1 to 64 letters, digits, '_' and '-'"
        );
    }
    Ok(())
}

/// Writes a fixture directory (created when missing; each file replaced atomically).
pub fn write(
    dir: &Path,
    job: &Job,
    cassette: &Cassette,
    tree: &Tree,
    expected: &Summary,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the fixture directory {}", dir.display()))?;
    let mut log = String::new();
    for run in &tree.runs {
        for e in &run.events {
            let line = LogLine {
                links: run.links.clone(),
                run_id: run.run_id.clone(),
                seq: e.seq,
                at: e.at,
                level_id: e.level_id.clone(),
                attempt: e.attempt,
                kind: e.data.kind().to_owned(),
                data: e.data.payload(),
            };
            log.push_str(&serde_json::to_string(&line)?);
            log.push('\n');
        }
    }
    replace(&dir.join("job.json"), &pretty(job)?)?;
    replace(&dir.join("cassette.json"), &pretty(cassette)?)?;
    replace(&dir.join("log.jsonl"), &log)?;
    replace(&dir.join("expected.json"), &pretty(expected)?)?;
    Ok(())
}

fn pretty<T: Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(format!("{}\n", serde_json::to_string_pretty(value)?))
}

fn replace(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Reads the fixture in `dir`.
pub fn read(dir: &Path) -> anyhow::Result<Fixture> {
    let small = |name: &str| -> anyhow::Result<String> {
        let path = dir.join(name);
        baton_scenario::capped::read_text(&path, SMALL_FILE_BYTES_MAX)
            .map_err(|e| anyhow::anyhow!("fixture {}: {e}", dir.display()))
    };
    let job: Job = serde_json::from_str(&small("job.json")?)
        .with_context(|| format!("fixture {}: job.json is not valid", dir.display()))?;
    if job.format != FORMAT {
        bail!(
            "fixture {}: job.json has format {}; this build reads {FORMAT} (record it again with `baton fixture record`)",
            dir.display(),
            job.format
        );
    }
    if job.event_schema == 0 || job.event_schema > VERSION {
        bail!(
            "fixture {}: its log was written with event schema {}; this build reads 1 to {VERSION}",
            dir.display(),
            job.event_schema
        );
    }
    let expected: Summary = serde_json::from_str(&small("expected.json")?)
        .with_context(|| format!("fixture {}: expected.json is not valid", dir.display()))?;
    let cassette = baton_providers::cassette_file::load(&dir.join("cassette.json"))
        .map_err(|e| anyhow::anyhow!("fixture {}: {e}", dir.display()))?;
    let log_path = dir.join("log.jsonl");
    let log =
        baton_scenario::capped::read_text(&log_path, baton_engine::limits::CASSETTE_BYTES_MAX)
            .map_err(|e| anyhow::anyhow!("fixture {}: {e}", dir.display()))?;
    let mut tree = Tree::default();
    for (i, text) in log.lines().enumerate() {
        let at = || format!("{}:{}", log_path.display(), i + 1);
        let line: LogLine =
            serde_json::from_str(text).with_context(|| format!("{}: not an event line", at()))?;
        let data = EventData::decode_str(&line.kind, job.event_schema, &line.data.to_string())
            .with_context(at)?;
        let event = Event {
            seq: line.seq,
            at: line.at,
            level_id: line.level_id,
            attempt: line.attempt,
            data,
        };
        match tree.runs.iter_mut().find(|r| r.links == line.links) {
            Some(run) => {
                if run.run_id != line.run_id || event.seq != run.events.len() as u64 + 1 {
                    bail!(
                        "{}: event {} of run {} does not follow the run's event {}",
                        at(),
                        event.seq,
                        line.run_id,
                        run.events.len()
                    );
                }
                run.events.push(event);
            }
            None => {
                if event.seq != 1 || (tree.runs.is_empty() != line.links.is_empty()) {
                    bail!("{}: a run's log must start at event 1, the root's first", at());
                }
                tree.runs.push(TreeRun {
                    links: line.links,
                    run_id: line.run_id,
                    events: vec![event],
                });
            }
        }
    }
    if tree.runs.is_empty() {
        bail!("fixture {}: log.jsonl holds no event", dir.display());
    }
    Ok(Fixture { dir: dir.to_path_buf(), job, cassette, tree, expected })
}

/// The fixture directories under `root`, for the given scenarios (all when empty), in
/// name order: `root/SCENARIO/CASE/`.
pub fn find(root: &Path, scenarios: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !root.exists() {
        return Ok(out);
    }
    for scenario in subdirectories(root)? {
        let name =
            scenario.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !scenarios.is_empty() && !scenarios.contains(&name) {
            continue;
        }
        out.extend(subdirectories(&scenario)?);
    }
    Ok(out)
}

/// The directories in `dir` (a scenario's cases), in name order.
pub fn subdirectories(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

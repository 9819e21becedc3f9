//! Replays: a recorded job re-executed from its own logs, and how two recordings compare.
//!
//! A recording is a [`Tree`]: a job's runs, each with its log and its place in the tree
//! (the root has no links, a child its parent's links and its own). From it come the model
//! answers ([`Tree::cassette`]), the outside decisions in the order they were made
//! ([`Tree::decisions`]) and the verifier outcomes a `trust_validation` replay uses instead
//! of running verifiers ([`Tree::trusted`]). [`compare`] says where two trees' logs differ,
//! event by event, with exactly what [`IGNORED_KEYS`] and [`IGNORED_KINDS`] name left out,
//! the fields a recording predates ([`ADDED_LATER`]) compared only where it has them, and
//! the ids that come from time ([`Ids`]) read as their place in the tree. [`Summary`]
//! is what a fixture expects of a run (status, level path, verdicts, verifier outcomes,
//! output, cost, tokens), and [`Summary::changes`] judges a replay's against the
//! scenario's regression thresholds.
//!
//! Pure: no I/O, no clock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use baton_scenario::model::RegressionThresholds;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cassette::{self, Cassette};
pub use crate::event::Strategy;
use crate::event::{ApprovalDecided, Event, EventData, VerifierFinished};
pub use crate::verifier::Trusted;
use crate::verifier::VerifierKey;

/// Event kinds a comparison leaves out: a heartbeat says only that time passed, and a
/// replay's own record exists only in the replay. A steering message is recorded where it
/// arrived, which a replay cannot know: the replay records it where a call took it, and
/// the deliveries (`steering_delivered`) and the prompts that carry it are compared.
pub const IGNORED_KINDS: &[&str] = &["heartbeat", "run_replayed", "steering_received"];

/// Payload fields a comparison leaves out, wherever they are nested: times and durations,
/// and the process that drove. `at` is every event's time; `deadline` an approval's (its
/// request's time plus the level's timeout); `wait_ms` a provider retry's jittered wait;
/// `process` the driver a `run_resumed` names, `resumes` how many it counts (lost drivers
/// included).
pub const IGNORED_KEYS: &[&str] = &[
    "process",
    "resumes",
    "at",
    "deadline",
    "duration_ms",
    "total_duration_ms",
    "elapsed_ms",
    "waiting_ms",
    "waited_ms",
    "wait_ms",
];

/// Payload fields later versions added to an event kind: a recording made before one
/// existed (the field absent, or null where it was an empty option) is compared without
/// it (its replay records it; the recording never could).
pub const ADDED_LATER: &[(&str, &str)] = &[
    ("prompt_sent", "request_hash"),
    ("prompt_sent", "worst_case_usd"),
    ("level_finished", "error_kind"),
    ("wave_planned", "reports_required"),
    ("wave_planned", "max_parallel"),
    ("level_started", "model_constraint_allow"),
    ("run_resumed", "by"),
];

/// Whether an event records the life of a driver rather than of the run: an interruption,
/// a lost driver and its takeover, and the pause and resumption they are. Where a process stopped or died
/// is not a fact a replay makes again; a comparison leaves them out (and `resumes`, which
/// counts them).
pub fn driver_life(e: &Event) -> bool {
    match &e.data {
        EventData::RunInterrupted(_) | EventData::RunTakenOver(_) => true,
        EventData::RunPaused(p) => {
            p.reason == crate::event::PAUSE_INTERRUPTED
                || p.reason == crate::event::PAUSE_DRIVER_LOST
        }
        EventData::RunResumed(r) => match r.by.as_deref() {
            None => true,
            Some(by) => {
                by == crate::event::RESUMED_BY_DRIVER || by == crate::event::RESUMED_BY_TAKEOVER
            }
        },
        _ => false,
    }
}

/// Whether an event is one of the pauses and resumptions a recording made before they were
/// recorded cannot hold (`run_paused`, and the `run_resumed` naming who ended a pause).
fn pause_record(e: &Event) -> bool {
    match &e.data {
        EventData::RunPaused(_) => true,
        EventData::RunResumed(r) => r.by.is_some(),
        _ => false,
    }
}

/// Takes out of `replayed` the fields `recorded` lacks because it predates them.
fn without_later_fields(recorded: &Value, replayed: &mut Value) {
    let kind = recorded["kind"].as_str().unwrap_or_default();
    let Some(data) = replayed.get_mut("data").and_then(Value::as_object_mut) else { return };
    for (k, field) in ADDED_LATER {
        if *k == kind && recorded["data"].get(field).is_none_or(Value::is_null) {
            data.remove(*field);
        }
    }
}

/// One run of a recorded job.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRun {
    /// The child links from the job's root to this run (empty for the root).
    pub links: Vec<String>,
    pub run_id: String,
    pub events: Vec<Event>,
}

impl TreeRun {
    /// Where the run hangs in its tree, for people: `root`, or its links joined by ` > `.
    pub fn place(&self) -> String {
        place(&self.links)
    }

    /// The child runs this run started, with their links, in the order it started them.
    pub fn children(&self) -> impl Iterator<Item = (&str, &str)> {
        self.events.iter().filter_map(|e| match &e.data {
            EventData::ChildRunStarted(c) => Some((c.child_run_id.as_str(), c.link.as_str())),
            _ => None,
        })
    }
}

/// The place of a run given its links.
pub fn place(links: &[String]) -> String {
    if links.is_empty() { "root".to_owned() } else { links.join(" > ") }
}

/// A recorded job: its runs, the root first, each parent before its children.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tree {
    pub runs: Vec<TreeRun>,
}

/// An outside decision a recording holds, to be made again at the same pause.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Approval { links: Vec<String>, decided: ApprovalDecided },
    Answer { links: Vec<String>, call_id: String, answer: Value },
}

impl Tree {
    /// The root run.
    pub fn root(&self) -> Option<&TreeRun> {
        self.runs.first()
    }

    /// The model answers of every run, as one cassette (a request asked in two runs is
    /// kept once per run; the replayer picks the one whose request matches).
    pub fn cassette(&self) -> Cassette {
        let mut all = Cassette { format: cassette::FORMAT, ..Cassette::default() };
        for run in &self.runs {
            let one = cassette::from_events(&run.events);
            all.entries.extend(one.entries);
            all.tools.extend(one.tools);
            for tool in one.listed {
                if !all.listed.iter().any(|t| t.name == tool.name) {
                    all.listed.push(tool);
                }
            }
        }
        all
    }

    /// The approvals and answers people gave, in the order they were recorded. An
    /// approval the driver recorded as timed out is not a person's decision and is left out.
    pub fn decisions(&self) -> Vec<Decision> {
        let mut found: Vec<(chrono::DateTime<chrono::Utc>, usize, u64, Decision)> = Vec::new();
        for (i, run) in self.runs.iter().enumerate() {
            for e in &run.events {
                let decision = match &e.data {
                    EventData::ApprovalDecided(d) if !d.timed_out => {
                        Decision::Approval { links: run.links.clone(), decided: d.clone() }
                    }
                    EventData::UserAnswered(a) => Decision::Answer {
                        links: run.links.clone(),
                        call_id: a.call_id.clone(),
                        answer: a.answer.clone(),
                    },
                    _ => continue,
                };
                found.push((e.at, i, e.seq, decision));
            }
        }
        found.sort_by_key(|x| (x.0, x.1, x.2));
        found.into_iter().map(|(_, _, _, d)| d).collect()
    }

    /// What a replay cannot make again: an outside cancel (when it landed is not a fact a
    /// replay can reproduce) or an approval that timed out (its deadline is the recording's
    /// time). `None` when the recording can be replayed.
    pub fn unreplayable(&self) -> Option<String> {
        for run in &self.runs {
            for e in &run.events {
                match &e.data {
                    EventData::CancelRequested(c) => {
                        return Some(format!(
                            "run {} ({}) was cancelled by {} at event {}: where a cancel lands is not a fact a replay can make again",
                            run.run_id,
                            run.place(),
                            c.by.as_deref().unwrap_or("someone"),
                            e.seq
                        ));
                    }
                    EventData::ApprovalDecided(d) if d.timed_out => {
                        return Some(format!(
                            "run {} ({}): approval {} timed out at event {}; a replay would wait for a deadline of its own",
                            run.run_id,
                            run.place(),
                            d.request_id,
                            e.seq
                        ));
                    }
                    _ => {}
                }
            }
        }
        None
    }

    /// The recorded verifier outcomes, keyed by the runs of a replay whose root is
    /// `new_root` (a child's id is derived from its parent's and its link, so the replay's
    /// ids are known before it starts).
    pub fn trusted(&self, new_root: &str) -> Trusted {
        let ids = self.new_ids(new_root);
        let mut by: BTreeMap<VerifierKey, VecDeque<VerifierFinished>> = BTreeMap::new();
        for run in &self.runs {
            let Some(new_id) = ids.get(&run.links) else { continue };
            for e in &run.events {
                if let EventData::VerifierFinished(v) = &e.data {
                    let key = (
                        new_id.clone(),
                        e.level_id.clone().unwrap_or_default(),
                        e.attempt.unwrap_or(0),
                        v.name.clone(),
                    );
                    by.entry(key).or_default().push_back(v.clone());
                }
            }
        }
        Trusted { by: Mutex::new(by) }
    }

    /// The ids the runs of a replay whose root is `new_root` get, by links.
    pub fn new_ids(&self, new_root: &str) -> BTreeMap<Vec<String>, String> {
        let mut ids: BTreeMap<Vec<String>, String> = BTreeMap::new();
        for run in &self.runs {
            let id = match run.links.split_last() {
                None => new_root.to_owned(),
                Some((link, parent)) => match ids.get(parent) {
                    Some(p) => crate::run_ids::child_run_id(p, link),
                    None => continue,
                },
            };
            ids.insert(run.links.clone(), id);
        }
        ids
    }
}

/// The order a recording settled each run's children in, for the runs of a replay: a
/// wave's workers run concurrently, and the order they end in is the log's order. A replay
/// drives a parent's children group by group — a group being the children the recording
/// may have settled in one commit: one right after another, nothing between, in the order
/// they were started — and settles a group only once all of it has ended, so the parent's
/// log is the recording's.
#[derive(Debug, Default)]
pub struct SettleOrder {
    by_parent: BTreeMap<String, Vec<Vec<String>>>,
}

impl SettleOrder {
    /// The group of `child` among its parent's, by index, when the recording settled it.
    pub fn group_of(&self, parent: &str, child: &str) -> Option<usize> {
        self.by_parent.get(parent)?.iter().position(|g| g.iter().any(|c| c == child))
    }

    /// The children of `parent` in group `index`.
    pub fn group(&self, parent: &str, index: usize) -> &[String] {
        self.by_parent.get(parent).and_then(|g| g.get(index)).map_or(&[], Vec::as_slice)
    }
}

impl Tree {
    /// The settle order of a replay whose root is `new_root`.
    pub fn settle_order(&self, new_root: &str) -> SettleOrder {
        let ids = self.new_ids(new_root);
        let mut by_parent = BTreeMap::new();
        for run in &self.runs {
            let Some(parent) = ids.get(&run.links) else { continue };
            // One commit settles the children that ended in the order they were started,
            // so settles one right after another in that order may have been one commit,
            // and one out of that order began a commit of its own.
            let started: Vec<&str> = run.children().map(|(_, link)| link).collect();
            let rank = |link: &str| started.iter().position(|l| *l == link);
            let mut groups: Vec<Vec<String>> = Vec::new();
            let mut last: Option<Option<usize>> = None;
            for e in run.events.iter().filter(|e| !IGNORED_KINDS.contains(&e.data.kind())) {
                if let EventData::ChildRunSettled(c) = &e.data {
                    let child = crate::run_ids::child_run_id(parent, &c.link);
                    let r = rank(&c.link);
                    match groups.last_mut() {
                        Some(g) if last.is_some_and(|prev| prev < r) => g.push(child),
                        _ => groups.push(vec![child]),
                    }
                    last = Some(r);
                } else {
                    last = None;
                }
            }
            if !groups.is_empty() {
                by_parent.insert(parent.clone(), groups);
            }
        }
        SettleOrder { by_parent }
    }
}

/// The ids of a tree that come from time or from where it ran, read as their place:
/// run ids (UUID v7, or derived from one), workspace directories (named by run id),
/// workspace snapshots (git commits, which hold their time) and the idempotency keys of
/// tool calls (derived from the run id).
#[derive(Debug, Default)]
pub struct Ids {
    /// Longest first, so that an id inside another (a run id in a directory) is
    /// replaced after the longer one.
    names: Vec<(String, String)>,
}

impl Ids {
    /// The ids of `tree`.
    pub fn of(tree: &Tree) -> Ids {
        let mut names = Vec::new();
        let mut snapshots = 0usize;
        let mut keys = 0usize;
        for run in &tree.runs {
            let place = run.place();
            names.push((run.run_id.clone(), format!("<run {place}>")));
            for e in &run.events {
                let mut snapshot = |id: &str, names: &mut Vec<(String, String)>| {
                    if !id.is_empty() && !names.iter().any(|(k, _)| k == id) {
                        snapshots += 1;
                        names.push((id.to_owned(), format!("<snapshot {snapshots}>")));
                    }
                };
                match &e.data {
                    EventData::ScenarioStarted(s) => {
                        if let Some(w) = &s.workspace {
                            names.push((w.dir.clone(), format!("<workspace {place}>")));
                            snapshot(&w.base, &mut names);
                        }
                    }
                    EventData::LevelFinished(f) => {
                        if let Some(s) = &f.snapshot {
                            snapshot(s, &mut names);
                        }
                    }
                    EventData::ToolCallFinished(f) => {
                        if let Some(s) = &f.snapshot {
                            snapshot(s, &mut names);
                        }
                    }
                    EventData::ToolCallStarted(s) if !names.iter().any(|(k, _)| k == &s.key) => {
                        keys += 1;
                        names.push((s.key.clone(), format!("<key {keys}>")));
                    }
                    _ => {}
                }
            }
        }
        names.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        Ids { names }
    }

    /// Reads `id` as `name` too, before every other id (it is not inside one).
    fn read_as(&mut self, id: String, name: String) {
        self.names.insert(0, (id, name));
    }

    fn rename(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (id, name) in &self.names {
            if out.contains(id.as_str()) {
                out = out.replace(id.as_str(), name);
            }
        }
        out
    }
}

/// One event as a comparison sees it: kind, level, attempt and payload, with the ignored
/// keys taken out and the tree's ids read as their places.
pub fn normalized(e: &Event, ids: &Ids) -> Value {
    let mut data = e.data.payload();
    strip(&mut data, ids);
    serde_json::json!({
        "kind": e.data.kind(),
        "level_id": e.level_id,
        "attempt": e.attempt,
        "data": data,
    })
}

fn strip(v: &mut Value, ids: &Ids) {
    match v {
        Value::Object(map) => {
            map.retain(|k, _| !IGNORED_KEYS.contains(&k.as_str()));
            for value in map.values_mut() {
                strip(value, ids);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| strip(i, ids)),
        Value::String(s) => *s = ids.rename(s),
        _ => {}
    }
}

/// Where two recordings differ.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Mismatch {
    /// The run's place in its tree.
    pub run: String,
    /// The recording's event (its seq), or the replay's when the recording has no more.
    pub seq: Option<u64>,
    pub replay_seq: Option<u64>,
    pub message: String,
}

/// Where `replay` differs from `recorded`, run by run (matched by place) and event by event
/// (in order, the ignored kinds left out): the first difference of each run, with the
/// JSON pointer of the first field that differs, and every run only one of them has. A
/// replay that declares it ran another version of the root's scenario has that version's
/// checksum read as the recording's.
pub fn compare(recorded: &Tree, replay: &Tree) -> Vec<Mismatch> {
    let old_ids = Ids::of(recorded);
    let mut new_ids = Ids::of(replay);
    // A replay on another version of the scenario says so (`run_replayed`): its checksum
    // reads as the recording's, and what the new version changed shows where it acts.
    if let Some(root) = replay.root() {
        let declared = root.events.iter().find_map(|e| match &e.data {
            EventData::RunReplayed(r) => r.recorded_checksum.clone(),
            _ => None,
        });
        let own = root.events.iter().find_map(|e| match &e.data {
            EventData::ScenarioStarted(s) => Some(s.checksum.clone()),
            _ => None,
        });
        if let (Some(recorded), Some(own)) = (declared, own) {
            new_ids.read_as(own, recorded);
        }
    }
    let kept = |run: &TreeRun, ids: &Ids, without_pauses: bool| -> Vec<(u64, Value)> {
        let compared: Vec<&Event> =
            run.events.iter().filter(|e| !IGNORED_KINDS.contains(&e.data.kind())).collect();
        compared
            .iter()
            .enumerate()
            // A call whose driver was lost before its answer was never made as far as the
            // run goes (it is made again): its prompt is left out with the driver's life.
            .filter(|(i, e)| {
                !(matches!(e.data, EventData::PromptSent(_))
                    && compared.get(i + 1).is_some_and(|next| driver_life(next)))
            })
            .map(|(_, e)| *e)
            .filter(|e| !driver_life(e))
            .filter(|e| !(without_pauses && pause_record(e)))
            .map(|e| (e.seq, normalized(e, ids)))
            .collect()
    };
    let mut out = Vec::new();
    for old in &recorded.runs {
        let Some(new) = replay.runs.iter().find(|r| r.links == old.links) else {
            out.push(Mismatch {
                run: old.place(),
                seq: None,
                replay_seq: None,
                message: "the replay has no such run".to_owned(),
            });
            continue;
        };
        // A recording that predates pauses in the log is compared without them.
        let predates_pauses = !old.events.iter().any(pause_record);
        let (a, mut b) = (kept(old, &old_ids, false), kept(new, &new_ids, predates_pauses));
        for ((_, x), (_, y)) in a.iter().zip(b.iter_mut()) {
            without_later_fields(x, y);
        }
        let first = a.iter().zip(&b).position(|((_, x), (_, y))| x != y);
        match first {
            Some(i) => {
                let (pointer, was, is) = first_difference(&a[i].1, &b[i].1, String::new());
                out.push(Mismatch {
                    run: old.place(),
                    seq: Some(a[i].0),
                    replay_seq: Some(b[i].0),
                    message: format!(
                        "`{}` differs at {}: recorded {}, replayed {}",
                        a[i].1["kind"].as_str().unwrap_or("?"),
                        if pointer.is_empty() { "/" } else { &pointer },
                        excerpt(&was),
                        excerpt(&is)
                    ),
                });
            }
            None if a.len() != b.len() => {
                let n = a.len().min(b.len());
                let (longer, which) =
                    if a.len() > b.len() { (&a, "recording") } else { (&b, "replay") };
                out.push(Mismatch {
                    run: old.place(),
                    seq: a.get(n).map(|x| x.0),
                    replay_seq: b.get(n).map(|x| x.0),
                    message: format!(
                        "the {which} goes on with {} more event(s), from `{}`",
                        longer.len() - n,
                        longer[n].1["kind"].as_str().unwrap_or("?")
                    ),
                });
            }
            None => {}
        }
    }
    for new in &replay.runs {
        if !recorded.runs.iter().any(|r| r.links == new.links) {
            out.push(Mismatch {
                run: new.place(),
                seq: None,
                replay_seq: None,
                message: "the recording has no such run".to_owned(),
            });
        }
    }
    out
}

fn first_difference(a: &Value, b: &Value, at: String) -> (String, Value, Value) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) if w == v => {}
                    Some(w) => return first_difference(v, w, format!("{at}/{k}")),
                    None => return (format!("{at}/{k}"), v.clone(), Value::Null),
                }
            }
            match y.iter().find(|(k, _)| !x.contains_key(*k)) {
                Some((k, w)) => (format!("{at}/{k}"), Value::Null, w.clone()),
                None => (at, a.clone(), b.clone()),
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            match x.iter().zip(y).position(|(v, w)| v != w) {
                Some(i) => first_difference(&x[i], &y[i], format!("{at}/{i}")),
                None => (at, a.clone(), b.clone()),
            }
        }
        _ => (at, a.clone(), b.clone()),
    }
}

fn excerpt(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() <= 120 {
        text
    } else {
        format!("{}…", text.chars().take(120).collect::<String>())
    }
}

/// What a fixture expects of a job, and what a replay is judged by.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The root's final status (`completed`, `failed`, …), or `paused` / `running`.
    pub status: String,
    /// Every level started, in order, as `LEVEL#ATTEMPT`; a child's prefixed with its
    /// links (`wave:build:1:a > l1_brief#1`).
    pub path: Vec<String>,
    /// Each attempt's verdict (`PASS`, `FAIL`, …; `ok` for a level without one, `error`
    /// for one that did not reach a result), by `LEVEL#ATTEMPT` as in `path`.
    pub verdicts: BTreeMap<String, String>,
    /// Each verifier's last outcome, by `LEVEL/NAME` (prefixed like `path`).
    pub verifiers: BTreeMap<String, VerifierMark>,
    /// The root's final output.
    pub output: Option<String>,
    /// What the whole tree spent.
    pub cost_usd: f64,
    pub tokens: u64,
}

/// A verifier's outcome as a summary keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VerifierMark {
    pub passed: bool,
    pub score: Option<f64>,
}

impl Summary {
    /// The summary of a recorded job (ids that come from time in its output read as their
    /// places, as [`compare`] reads them).
    pub fn of(tree: &Tree) -> Summary {
        let ids = Ids::of(tree);
        let mut s = Summary::default();
        for run in &tree.runs {
            let prefix = |name: String| {
                if run.links.is_empty() { name } else { format!("{} > {name}", run.place()) }
            };
            let mut state = crate::state::RunState::default();
            for e in &run.events {
                state.apply(e);
                let level = e.level_id.clone().unwrap_or_default();
                let attempt = e.attempt.unwrap_or(0);
                match &e.data {
                    EventData::LevelStarted(_) => s.path.push(prefix(format!("{level}#{attempt}"))),
                    EventData::LevelFinished(f) => {
                        let verdict = match (&f.verdict, f.ok, f.skipped) {
                            (Some(v), _, _) => v.clone(),
                            (None, _, true) => "skipped".to_owned(),
                            (None, true, false) => "ok".to_owned(),
                            (None, false, false) => "error".to_owned(),
                        };
                        s.verdicts.insert(prefix(format!("{level}#{attempt}")), verdict);
                    }
                    // A verifier that did not run has no outcome to keep.
                    EventData::VerifierFinished(v) if !v.not_run() => {
                        s.verifiers.insert(
                            prefix(format!("{level}/{}", v.name)),
                            VerifierMark { passed: v.passed, score: v.score },
                        );
                    }
                    _ => {}
                }
            }
            if run.links.is_empty() {
                s.status = state.status.as_str().to_owned();
                // An output naming a run or a workspace names it by its place.
                s.output = state.session.final_output.as_deref().map(|o| ids.rename(o));
                let totals = state.tree_totals();
                s.cost_usd = totals.cost_usd;
                s.tokens = totals.tokens;
            }
        }
        s
    }

    /// How `replay` differs from this expected summary, each change judged against
    /// `limits` (see [`Change::fails`]).
    pub fn changes(&self, replay: &Summary, limits: &RegressionThresholds) -> Vec<Change> {
        let mut out = Vec::new();
        let mut push = |what: &'static str, level: Option<String>, detail: String, fails: bool| {
            out.push(Change { what, level, detail, fails });
        };
        if self.status != replay.status {
            push(
                "status",
                None,
                format!("the job ended {}, expected {}", replay.status, self.status),
                true,
            );
        }
        if self.path != replay.path {
            let at = self.path.iter().zip(&replay.path).position(|(a, b)| a != b);
            let i = at.unwrap_or_else(|| self.path.len().min(replay.path.len()));
            let level = self.path.get(i).or_else(|| replay.path.get(i)).cloned();
            push(
                "path",
                level,
                format!(
                    "the level path differs from step {}: expected {}, replayed {}",
                    i + 1,
                    tail(&self.path[i.min(self.path.len())..]),
                    tail(&replay.path[i.min(replay.path.len())..])
                ),
                !limits.path_changes_allowed,
            );
        }
        for (level, expected) in &self.verdicts {
            match replay.verdicts.get(level) {
                Some(got) if got != expected => push(
                    "verdict",
                    Some(level.clone()),
                    format!("verdict {got}, expected {expected}"),
                    !limits.verdict_changes_allowed,
                ),
                None if replay.path.contains(level) => push(
                    "verdict",
                    Some(level.clone()),
                    format!("no verdict, expected {expected}"),
                    !limits.verdict_changes_allowed,
                ),
                _ => {}
            }
        }
        for (name, expected) in &self.verifiers {
            let Some(got) = replay.verifiers.get(name) else { continue };
            if let (Some(a), Some(b), Some(max)) =
                (expected.score, got.score, limits.score_drop_max)
                && a - b > max + 1e-9
            {
                push(
                    "score",
                    Some(name.clone()),
                    format!("score {b:.3}, expected {a:.3}: dropped {:.3}, over {max}", a - b),
                    true,
                );
            }
        }
        let rate = |s: &Summary| -> Option<f64> {
            let marks: Vec<_> = s.verifiers.values().collect();
            (!marks.is_empty())
                .then(|| marks.iter().filter(|m| m.passed).count() as f64 / marks.len() as f64)
        };
        if let (Some(a), Some(b)) = (rate(self), rate(replay))
            && a > b + 1e-9
        {
            let fails = limits.pass_rate_drop_max.is_some_and(|max| a - b > max + 1e-9);
            push(
                "pass_rate",
                None,
                format!("verifiers passing {:.0} %, expected {:.0} %", b * 100.0, a * 100.0),
                fails,
            );
        }
        if self.output != replay.output {
            push(
                "output",
                None,
                crate::textdiff::lines(
                    self.output.as_deref().unwrap_or(""),
                    replay.output.as_deref().unwrap_or(""),
                ),
                !limits.output_changes_allowed,
            );
        }
        let increase = |a: f64, b: f64| {
            if a > 0.0 {
                (b - a) / a
            } else if b > 0.0 {
                1.0
            } else {
                0.0
            }
        };
        if (replay.cost_usd - self.cost_usd).abs() > 1e-12 {
            let up = increase(self.cost_usd, replay.cost_usd);
            push(
                "cost",
                None,
                format!(
                    "cost ${:.6}, expected ${:.6} ({:+.1} %)",
                    replay.cost_usd,
                    self.cost_usd,
                    up * 100.0
                ),
                limits.cost_increase_max.is_some_and(|max| up > max + 1e-9),
            );
        }
        if replay.tokens != self.tokens {
            let up = increase(self.tokens as f64, replay.tokens as f64);
            push(
                "tokens",
                None,
                format!(
                    "{} tokens, expected {} ({:+.1} %)",
                    replay.tokens,
                    self.tokens,
                    up * 100.0
                ),
                limits.token_increase_max.is_some_and(|max| up > max + 1e-9),
            );
        }
        out
    }
}

fn tail(path: &[String]) -> String {
    if path.is_empty() {
        return "(the end)".to_owned();
    }
    let shown: Vec<&str> = path.iter().take(4).map(String::as_str).collect();
    let more = if path.len() > 4 { " …" } else { "" };
    format!("{}{more}", shown.join(", "))
}

/// One way a replay differs from what its fixture expects.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// `status`, `path`, `verdict`, `score`, `pass_rate`, `output`, `cost` or `tokens`.
    pub what: &'static str,
    /// The level (`LEVEL#ATTEMPT`) or verifier (`LEVEL/NAME`) it is about, when one.
    pub level: Option<String>,
    pub detail: String,
    /// Whether it crosses the scenario's regression thresholds: a status change always
    /// does; a path, verdict or output change unless the scenario allows it; a cost, token,
    /// score or pass-rate change when it is over its limit.
    pub fails: bool,
}

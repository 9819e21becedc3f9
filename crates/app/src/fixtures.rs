//! Fixtures at work: recording one from a job, replaying every fixture and judging each
//! against what it expects (`baton test`, reported as JSON or JUnit XML too), accepting a
//! replay as the new fixture, and comparing two recorded jobs (`baton diff`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use baton_engine::Decision as ApprovalDecision;
use baton_engine::cassette::Miss;
use baton_engine::exec::{Engine, Outcome};
use baton_engine::job::{JobRequest, Start};
use baton_engine::model::ModelProvider;
use baton_engine::replay::{self, Change, Mismatch, Summary, Tree};
use baton_scenario::{Registry, Scenario};
use serde_json::{Value, json};

use crate::engines::WaveDrive;
use crate::fixture::{self, Fixture};
use crate::place::Place;
use crate::replay::{
    ReplaySource, Replayed, Scratch, first_state, replay_job, status_of, strategy,
};

/// Two recorded jobs side by side: their summaries, every difference (none judged), each
/// level's cost and tokens where they differ, and where the logs first diverge.
#[derive(Debug)]
pub struct Diff {
    pub a_summary: Summary,
    pub b_summary: Summary,
    pub changes: Vec<Change>,
    /// Level (by its place in the tree), and its cost and tokens in each job.
    pub levels: Vec<LevelCosts>,
    pub mismatches: Vec<Mismatch>,
}

/// A level's cost and tokens in two jobs (summed over attempts): none where it did not run.
pub type LevelCosts = (String, Option<(f64, u64)>, Option<(f64, u64)>);

/// `baton diff RUN_A RUN_B`: where two jobs' paths, verdicts, outputs and costs diverge.
pub async fn diff(place: &Place, a: &str, b: &str) -> anyhow::Result<Diff> {
    let store = crate::place::open_existing_store(place).await?;
    let probe = crate::engines::probe_engine(place, &store, &Registry::default());
    let (ta, tb) = (probe.recorded_tree(a).await?, probe.recorded_tree(b).await?);
    let (sa, sb) = (Summary::of(&ta), Summary::of(&tb));
    // Every difference, none of them judged: a diff is a report, not a gate.
    let lenient = baton_scenario::model::RegressionThresholds {
        path_changes_allowed: true,
        verdict_changes_allowed: true,
        output_changes_allowed: true,
        ..Default::default()
    };
    Ok(Diff {
        changes: sa.changes(&sb, &lenient),
        levels: level_costs(&ta, &tb),
        mismatches: replay::compare(&ta, &tb),
        a_summary: sa,
        b_summary: sb,
    })
}

/// Each level's cost and tokens in two jobs (summed over attempts), where they differ.
fn level_costs(a: &Tree, b: &Tree) -> Vec<LevelCosts> {
    let costs = |t: &Tree| {
        let mut by: std::collections::BTreeMap<String, (f64, u64)> = Default::default();
        for run in &t.runs {
            for e in &run.events {
                if let baton_engine::event::EventData::LevelFinished(f) = &e.data {
                    let level = e.level_id.clone().unwrap_or_default();
                    let key = if run.links.is_empty() {
                        level
                    } else {
                        format!("{} > {level}", run.place())
                    };
                    let slot = by.entry(key).or_default();
                    slot.0 += f.cost_usd;
                    slot.1 += f.tokens;
                }
            }
        }
        by
    };
    let (ca, cb) = (costs(a), costs(b));
    let mut keys: Vec<&String> = ca.keys().chain(cb.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| ca.get(*k) != cb.get(*k))
        .map(|k| (k.clone(), ca.get(k).copied(), cb.get(k).copied()))
        .collect()
}

/// What `baton fixture record` runs when it records a new job.
#[derive(Debug)]
pub struct RecordArgs {
    pub scenario: String,
    pub case: String,
    pub from_run: Option<String>,
    pub script: Option<PathBuf>,
    pub input: Option<String>,
    pub meta: Vec<(String, String)>,
    pub tenant: Option<String>,
    /// The decisions its pauses get, in order: `approve`, `reject[:COMMENT]`,
    /// `answer:JSON`.
    pub decide: Vec<String>,
    pub force: bool,
}

/// A fixture recorded: from which run, where, and what it expects.
#[derive(Debug)]
pub struct Recorded {
    pub run_id: String,
    /// Said about the new job's run (the jail is off).
    pub jail_warning: Option<String>,
    pub dir: PathBuf,
    pub summary: Summary,
}

/// `baton fixture record SCENARIO CASE (--from-run RUN | --script F | live providers)`:
/// a new job run for it (its pauses decided as `decide` says), or a run that ended, kept
/// as a fixture.
pub async fn record(place: &Place, args: RecordArgs) -> anyhow::Result<Recorded> {
    fixture::check_name("scenario", &args.scenario)?;
    fixture::check_name("case", &args.case)?;
    let dir = fixture::root(&place.scenarios).join(&args.scenario).join(&args.case);
    if dir.exists() && !args.force {
        bail!(
            "fixture {} exists; `baton fixture accept {} {}` records it again from a replay, or pass --force to record it anew",
            dir.display(),
            args.scenario,
            args.case
        );
    }
    let registry = Arc::new(crate::scenarios::registry(place)?);
    let scenario = crate::scenarios::find_scenario(&registry, &args.scenario, place)?;
    let mut jail_warning = None;
    let run_id = match &args.from_run {
        Some(run) => {
            if args.script.is_some() || args.input.is_some() || !args.decide.is_empty() {
                bail!(
                    "--from-run takes the run as it is: leave out --script, --input and --decide"
                );
            }
            run.clone()
        }
        None => {
            let (run_id, warning) = record_new(place, &registry, &scenario, &args).await?;
            jail_warning = warning;
            run_id
        }
    };
    let store = crate::place::open_existing_store(place).await?;
    let probe = crate::engines::probe_engine(place, &store, &registry);
    let tree = probe.recorded_tree(&run_id).await?;
    let state = probe.state(&run_id).await?;
    if state.scenario_id != args.scenario {
        bail!("run {run_id} ran scenario `{}`, not `{}`", state.scenario_id, args.scenario);
    }
    if state.parent.is_some() {
        bail!("run {run_id} is a child run; record its job's root");
    }
    if !state.status.is_final() {
        bail!(
            "run {run_id} has not ended ({}): a fixture records a whole job; decide or resume it first",
            state.status.as_str()
        );
    }
    if let Some(why) = tree.unreplayable() {
        bail!("run {run_id} cannot be a fixture: {why}");
    }
    let job = fixture::Job {
        format: fixture::FORMAT,
        scenario: args.scenario.clone(),
        case: args.case.clone(),
        input: state.session.input.clone(),
        metadata: state.session.metadata.clone(),
        tenant: state.tenant.clone(),
        recorded_run: run_id.clone(),
        recorded_checksum: state.checksum.clone(),
        event_schema: baton_engine::event::VERSION,
    };
    let summary = Summary::of(&tree);
    fixture::write(&dir, &job, &tree.cassette(), &tree, &summary)?;
    Ok(Recorded { run_id, jail_warning, dir, summary })
}

/// Runs a new job of `scenario` for a fixture, making the given decisions at its pauses;
/// returns its root's id, and the warning to say when the jail is off.
async fn record_new(
    place: &Place,
    registry: &Arc<Registry>,
    scenario: &Arc<Scenario>,
    args: &RecordArgs,
) -> anyhow::Result<(String, Option<String>)> {
    let Some(input) = &args.input else {
        bail!("--input is required to record a new job (or take an existing one with --from-run)");
    };
    let decisions: Vec<Decide> =
        args.decide.iter().map(|d| Decide::parse(d)).collect::<Result<_, _>>()?;
    let jail_warning = crate::jail::check_jail(place, registry, scenario)?;
    let (model, source) =
        crate::models::load_model(args.script.as_deref(), place.config.as_deref(), Some(scenario))?;
    let store = crate::place::open_store(place).await?;
    let jobs = crate::engines::jobs(place, Arc::clone(registry), None, WaveDrive::default())?;
    let engine = crate::engines::engine(
        store,
        model,
        registry,
        crate::engines::workspace_setup(place, None, None),
        crate::engines::redactor(place),
        &crate::jail::jail(place),
        Some(Arc::new(jobs)),
        None,
        Some(crate::engines::live_tools(place)),
    );
    let (_, selected) = baton_engine::job::select(
        registry,
        &Default::default(),
        &JobRequest { pin: Some(scenario.id.clone()), intent: None, kind: None },
        true,
    )
    .map_err(anyhow::Error::msg)?;
    let metadata = args.meta.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    let run_id = Engine::new_run_id();
    let start = Start {
        input: input.clone(),
        metadata,
        model_source: source,
        selected: Some(selected),
        tenant: args.tenant.clone(),
        ..Start::default()
    };
    let mut outcome = engine.run_job(&run_id, scenario, start).await?;
    let mut decisions = decisions.into_iter();
    while outcome == Outcome::Paused {
        let Some(decision) = decisions.next() else {
            bail!(
                "run {run_id} paused for a person and no --decide is left; give one more (`approve`, `reject:COMMENT`, `answer:JSON`), or decide it and record it with --from-run"
            );
        };
        let waiting = paused_run(&engine, &run_id).await?;
        match decision {
            Decide::Approve(approved, comment) => {
                engine
                    .decide(
                        &waiting,
                        ApprovalDecision {
                            request_id: None,
                            approved,
                            comment,
                            by: Some("fixture".to_owned()),
                            data: None,
                        },
                    )
                    .await?;
            }
            Decide::Answer(answer) => engine.answer(&waiting, answer).await?,
        }
        outcome = engine.drive_tree(&run_id, scenario).await?;
    }
    if decisions.next().is_some() {
        bail!("run {run_id} ended ({}) with --decide left over", status_of(&outcome));
    }
    Ok((run_id, jail_warning))
}

/// The run of a job that waits for a person: the root, or the first of its runs that does.
async fn paused_run(engine: &Engine, root: &str) -> anyhow::Result<String> {
    let tree = engine.recorded_tree(root).await?;
    for run in &tree.runs {
        if engine.state(&run.run_id).await?.awaiting_person() {
            return Ok(run.run_id.clone());
        }
    }
    bail!("job {root} is paused but none of its runs waits for a person")
}

enum Decide {
    Approve(bool, Option<String>),
    Answer(Value),
}

impl Decide {
    fn parse(text: &str) -> anyhow::Result<Decide> {
        let (verb, rest) = text.split_once(':').map_or((text, None), |(v, r)| (v, Some(r)));
        match (verb, rest) {
            ("approve", None) => Ok(Decide::Approve(true, None)),
            ("approve", Some(c)) => Ok(Decide::Approve(true, Some(c.to_owned()))),
            ("reject", c) => Ok(Decide::Approve(false, c.map(str::to_owned))),
            ("answer", Some(json)) => serde_json::from_str(json)
                .map(Decide::Answer)
                .with_context(|| format!("--decide {text:?}: the answer is not JSON")),
            _ => bail!(
                "--decide {text:?}: use `approve`, `approve:COMMENT`, `reject`, `reject:COMMENT` or `answer:JSON`"
            ),
        }
    }
}

/// Which fixtures `baton test` and `baton fixture accept` replay, and how.
#[derive(Debug)]
pub struct Cases {
    pub scenarios: Vec<String>,
    pub case: Option<String>,
    /// Requests a cassette does not hold go to the configured providers and are recorded.
    pub live: bool,
    pub trust_validation: bool,
}

/// One fixture's result.
#[derive(Debug)]
pub struct CaseResult {
    pub name: String,
    pub scenario: String,
    pub case: String,
    pub seconds: f64,
    /// Why the case could not be replayed at all.
    pub error: Option<String>,
    pub changes: Vec<Change>,
    pub misses: Vec<Miss>,
    /// Calls `--live` answered and added to the cassette.
    pub rerecorded: usize,
    pub replayed: Option<Replayed>,
}

impl CaseResult {
    /// Whether the replay met its fixture.
    pub fn passed(&self) -> bool {
        self.error.is_none()
            && !self.changes.iter().any(|c| c.fails)
            && (self.misses.is_empty() || self.rerecorded == self.misses.len())
    }
}

/// Replays one fixture into `target` (a scratch database) and judges it.
async fn test_case(
    place: &Place,
    target: &Place,
    registry: &Arc<Registry>,
    f: &Fixture,
    args: &Cases,
    live: Option<Arc<dyn ModelProvider>>,
) -> CaseResult {
    let started = Instant::now();
    let mut result = CaseResult {
        name: f.name(),
        scenario: f.job.scenario.clone(),
        case: f.job.case.clone(),
        seconds: 0.0,
        error: None,
        changes: Vec::new(),
        misses: Vec::new(),
        rerecorded: 0,
        replayed: None,
    };
    let Some(scenario) = registry.get(&f.job.scenario).cloned() else {
        result.error = Some(format!(
            "no scenario `{}` in {}: the fixture's scenario was removed or renamed",
            f.job.scenario,
            place.scenarios.display()
        ));
        return result;
    };
    let replayed = replay_job(
        target,
        Arc::clone(registry),
        Arc::clone(&scenario),
        ReplaySource {
            recorded: &f.tree,
            cassette: f.cassette.clone(),
            strategy: strategy(args.trust_validation),
            source: format!("fixture:{}", f.dir.display()),
            live,
        },
    )
    .await;
    result.seconds = started.elapsed().as_secs_f64();
    match replayed {
        Err(e) => result.error = Some(format!("{e:#}")),
        Ok(r) => {
            let summary = Summary::of(&r.tree);
            result.changes = f.expected.changes(&summary, &scenario.regression);
            result.misses.clone_from(&r.misses);
            result.rerecorded = r.live_entries.len();
            result.replayed = Some(r);
        }
    }
    result
}

/// Replays each fixture `args` names into one scratch database; `accepting` leaves their
/// cassettes as they are (an accept writes each whole).
pub async fn run_cases(
    place: &Place,
    args: &Cases,
    accepting: bool,
) -> anyhow::Result<(Vec<CaseResult>, Instant)> {
    let started = Instant::now();
    let registry = Arc::new(crate::scenarios::registry(place)?);
    for s in &args.scenarios {
        if registry.get(s).is_none() {
            crate::scenarios::find_scenario(&registry, s, place)?;
        }
    }
    let mut dirs = fixture::find(&fixture::root(&place.scenarios), &args.scenarios)?;
    if let Some(case) = &args.case {
        dirs.retain(|d| d.file_name().is_some_and(|n| n.to_string_lossy() == case.as_str()));
    }
    if dirs.is_empty() {
        bail!(
            "no fixtures under {}{}; record one with `baton fixture record SCENARIO CASE`",
            fixture::root(&place.scenarios).display(),
            if args.scenarios.is_empty() {
                String::new()
            } else {
                format!(" for {}", args.scenarios.join(", "))
            }
        );
    }
    let live = if args.live {
        Some(crate::models::load_model(None, place.config.as_deref(), None)?.0)
    } else {
        None
    };
    // One scratch database for every case: the jail is set up once per process, for the
    // database it first serves, and hides that database's directory from what it runs.
    let scratch = Scratch::new("test")?;
    let target = scratch.place(place);
    let mut results = Vec::new();
    for dir in dirs {
        let f = match fixture::read(&dir) {
            Ok(f) => f,
            Err(e) => {
                results.push(CaseResult {
                    name: dir.display().to_string(),
                    scenario: String::new(),
                    case: String::new(),
                    seconds: 0.0,
                    error: Some(format!("{e:#}")),
                    changes: Vec::new(),
                    misses: Vec::new(),
                    rerecorded: 0,
                    replayed: None,
                });
                continue;
            }
        };
        let r = test_case(place, &target, &registry, &f, args, live.clone()).await;
        // `--live` keeps what it recorded in the fixture's cassette (accept rewrites it
        // whole).
        if !accepting
            && let Some(replayed) = &r.replayed
            && !replayed.live_entries.is_empty()
        {
            let mut cassette = f.cassette.clone();
            cassette.entries.extend(replayed.live_entries.iter().cloned());
            baton_providers::cassette_file::save(&cassette, &dir.join("cassette.json"))
                .map_err(anyhow::Error::msg)?;
        }
        results.push(r);
    }
    Ok((results, started))
}

/// Writes fixture `dir` again from the replay of result `r`: its job (recorded from the
/// replay's run and version), cassette, log and expected summary.
pub fn accept(dir: &std::path::Path, replayed: &Replayed) -> anyhow::Result<Summary> {
    let f = fixture::read(dir)?;
    let summary = Summary::of(&replayed.tree);
    let job = fixture::Job {
        recorded_run: replayed.new_root.clone(),
        recorded_checksum: replayed
            .tree
            .root()
            .and_then(|root| first_state(root).map(|s| s.checksum))
            .unwrap_or_default(),
        event_schema: baton_engine::event::VERSION,
        ..f.job
    };
    fixture::write(dir, &job, &replayed.tree.cassette(), &replayed.tree, &summary)?;
    Ok(summary)
}

/// One case of `baton test --format json`.
fn case_json(r: &CaseResult) -> Value {
    json!({
        "fixture": r.name,
        "scenario": r.scenario,
        "case": r.case,
        "passed": r.passed(),
        "seconds": r.seconds,
        "error": r.error,
        "changes": r.changes,
        "misses": r.misses,
        "rerecorded": r.rerecorded,
        "status": r.replayed.as_ref().map(|x| status_of(&x.outcome)),
    })
}

/// The results as `baton test --format json` reports them.
pub fn json_report(results: &[CaseResult]) -> Value {
    let passed = results.iter().filter(|r| r.passed()).count();
    json!({
        "fixtures": results.len(),
        "passed": passed,
        "failed": results.len() - passed,
        "cases": results.iter().map(case_json).collect::<Vec<_>>(),
    })
}

/// The results as JUnit XML: one test suite per scenario, one test case per fixture.
pub fn junit(results: &[CaseResult]) -> String {
    let mut by: std::collections::BTreeMap<&str, Vec<&CaseResult>> = Default::default();
    for r in results {
        by.entry(r.scenario.as_str()).or_default().push(r);
    }
    let failures = results.iter().filter(|r| !r.passed()).count();
    let total: f64 = results.iter().map(|r| r.seconds).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites name=\"baton test\" tests=\"{}\" failures=\"{failures}\" time=\"{total:.3}\">",
        results.len()
    );
    for (scenario, cases) in by {
        let failed = cases.iter().filter(|r| !r.passed()).count();
        let time: f64 = cases.iter().map(|r| r.seconds).sum();
        let _ = writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" time=\"{time:.3}\">",
            xml(scenario),
            cases.len()
        );
        for r in cases {
            let _ = write!(
                x,
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
                xml(scenario),
                xml(&r.case),
                r.seconds
            );
            if r.passed() {
                x.push_str("/>\n");
                continue;
            }
            let mut details = String::new();
            if let Some(e) = &r.error {
                let _ = writeln!(details, "error: {e}");
            }
            // A request the cassette lacks comes first: the changes follow from it.
            for m in &r.misses {
                let _ = writeln!(details, "{}", m.message());
            }
            for c in r.changes.iter().filter(|c| c.fails) {
                let _ = writeln!(
                    details,
                    "{}{}: {}",
                    c.what,
                    c.level.as_deref().map(|l| format!(" {l}")).unwrap_or_default(),
                    c.detail
                );
            }
            let first = details.lines().next().unwrap_or("failed").to_owned();
            let _ = writeln!(
                x,
                ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                xml(&first),
                xml(&details)
            );
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

/// Text as XML character data or an attribute value: markup characters escaped, and the
/// characters XML 1.0 cannot hold at all (most C0 controls) written as `\u{..}`.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

//! Forecasts from recorded jobs — fixtures, or the store's history — and the guard a job
//! start passes with a cost limit (`baton run --max-forecast-usd`).

use std::path::PathBuf;

use anyhow::bail;
use baton_engine::forecast::{Forecast, JobSpend, P90_SAMPLE_MIN};
use baton_engine::replay::Tree;
use baton_scenario::Scenario;

use crate::fixture;
use crate::place::Place;

/// How many ended jobs of the store a forecast reads by default, newest first.
pub const RUNS_DEFAULT: usize = 50;
/// The most it reads.
pub const RUNS_MAX: usize = 10_000;

/// Where a forecast's jobs come from.
#[derive(Debug)]
pub enum Source {
    /// The fixtures in this directory (`SCENARIOS/fixtures/SCENARIO` by default).
    Fixtures(Option<PathBuf>),
    /// The store's last N ended jobs of the scenario.
    Runs(usize),
}

/// The recorded jobs of `scenario` from `source`, with each one's input, and what they are.
pub async fn sample(
    place: &Place,
    scenario: &str,
    source: &Source,
) -> anyhow::Result<(Vec<(String, Tree)>, String)> {
    match source {
        Source::Fixtures(dir) => {
            let dir = dir.clone().unwrap_or_else(|| fixture::root(&place.scenarios).join(scenario));
            if !dir.is_dir() {
                bail!("no fixtures of `{scenario}`: {} is not a directory", dir.display());
            }
            let mut jobs = Vec::new();
            for case in fixture::subdirectories(&dir)? {
                let f = fixture::read(&case)?;
                if f.job.scenario == scenario {
                    jobs.push((f.job.input.clone(), f.tree));
                }
            }
            Ok((jobs, format!("the fixtures in {}", dir.display())))
        }
        Source::Runs(n) => {
            if !(1..=RUNS_MAX).contains(n) {
                bail!("--runs must be 1 to {RUNS_MAX}, not {n}");
            }
            if !place.db_exists() {
                return Ok((Vec::new(), format!("the store {} (none yet)", place.db_shown())));
            }
            let store = crate::place::open_existing_store(place).await?;
            let mut records: Vec<_> = store
                .runs(None)
                .await?
                .into_iter()
                .filter(|r| r.scenario_id == scenario && r.parent_run_id.is_none())
                .filter(|r| {
                    baton_engine::state::Status::from_name(&r.status)
                        .is_some_and(baton_engine::state::Status::is_final)
                })
                .collect();
            records.sort_by_key(|r| std::cmp::Reverse(r.created_at));
            // A replay answers from a recording and spends nothing: it is not a job to
            // forecast from. The newest N others are, looking at no more than RUNS_MAX.
            records.truncate(RUNS_MAX);
            let probe =
                crate::engines::probe_engine(place, &store, &baton_scenario::Registry::default());
            let mut jobs = Vec::new();
            let mut replays = 0;
            for r in records {
                if jobs.len() == *n {
                    break;
                }
                let state = probe.state(&r.run_id).await?;
                if state.replay_of.is_some() {
                    replays += 1;
                    continue;
                }
                let tree = probe.recorded_tree(&r.run_id).await?;
                jobs.push((state.session.input, tree));
            }
            let left_out = match replays {
                0 => String::new(),
                n => format!(" ({n} replay(s) left out)"),
            };
            Ok((jobs, format!("the last ended jobs in {}{left_out}", place.db_shown())))
        }
    }
}

/// The jobs whose input is about as long as `input` (half to twice its length), when
/// there are enough of them for a p90; else all, said in the note.
pub fn like_input(jobs: Vec<(String, Tree)>, input: Option<&str>) -> (Vec<(String, Tree)>, String) {
    let Some(input) = input else { return (jobs, String::new()) };
    let len = input.chars().count().max(1);
    let near = |other: &str| {
        let l = other.chars().count().max(1);
        l * 2 >= len && l <= len * 2
    };
    let close = jobs.iter().filter(|(i, _)| near(i)).count();
    if close >= P90_SAMPLE_MIN {
        let kept = jobs.into_iter().filter(|(i, _)| near(i)).collect();
        (
            kept,
            format!(
                "; {close} of them with an input of {} to {} characters, like this one",
                len / 2,
                len * 2
            ),
        )
    } else {
        (
            jobs,
            format!(
                "; only {close} with an input about as long as this one ({len} characters), so all of them count"
            ),
        )
    }
}

/// `baton run --max-forecast-usd X`: refuses to start a job of `scenario` whose forecast
/// p90 cost (from the store's last jobs and the scenario's fixtures) is over `max`, or
/// that has no p90 to compare.
pub async fn guard(place: &Place, scenario: &Scenario, max: f64) -> anyhow::Result<()> {
    if !max.is_finite() || max <= 0.0 {
        bail!("--max-forecast-usd must be a positive amount of US dollars, not {max}");
    }
    let (mut jobs, _) = sample(place, &scenario.id, &Source::Runs(RUNS_DEFAULT)).await?;
    if fixture::root(&place.scenarios).join(&scenario.id).is_dir() {
        jobs.extend(sample(place, &scenario.id, &Source::Fixtures(None)).await?.0);
    }
    let spends: Vec<JobSpend> = jobs.iter().map(|(_, t)| JobSpend::of(t)).collect();
    let p90 =
        Forecast::of(&scenario.id, &spends, &scenario.budget).and_then(|f| f.total.cost_usd.p90);
    match p90 {
        None => bail!(
            "--max-forecast-usd: scenario `{}` has {} recorded job(s) (the store's and its fixtures); a forecast's p90 needs {P90_SAMPLE_MIN}, so the run was not started (see `baton forecast {}`, or leave the flag out)",
            scenario.id,
            spends.len(),
            scenario.id
        ),
        Some(p90) if p90 > max => bail!(
            "--max-forecast-usd {max}: a job of scenario `{}` costs ${p90:.6} at p90 (from {} recorded jobs), over the limit; the run was not started (see `baton forecast {}`)",
            scenario.id,
            spends.len(),
            scenario.id
        ),
        Some(_) => Ok(()),
    }
}

/// A forecast made (`baton forecast`): the figures, each job's spend, where the jobs came
/// from and how they were narrowed to the input.
#[derive(Debug)]
pub struct Made {
    pub forecast: Forecast,
    pub spends: Vec<JobSpend>,
    pub from: String,
    pub note: String,
}

/// What a job of `scenario_id` costs, from the jobs of `source` (like `input`, when given).
pub async fn forecast(
    place: &Place,
    scenario_id: &str,
    input: Option<&str>,
    source: Source,
) -> anyhow::Result<Made> {
    let registry = crate::scenarios::registry(place)?;
    let scenario = crate::scenarios::find_scenario(&registry, scenario_id, place)?;
    let (jobs, from) = sample(place, scenario_id, &source).await?;
    let (jobs, note) = like_input(jobs, input);
    let spends: Vec<JobSpend> = jobs.iter().map(|(_, t)| JobSpend::of(t)).collect();
    let Some(forecast) = Forecast::of(scenario_id, &spends, &scenario.budget) else {
        bail!(
            "no recorded job of scenario `{scenario_id}` in {from}; run it, or record fixtures (`baton fixture record`) and use --fixtures"
        );
    };
    Ok(Made { forecast, spends, from, note })
}

impl Made {
    /// The forecast as `baton forecast --json` reports it.
    pub fn to_json(&self, scenario_id: &str) -> serde_json::Value {
        let f = &self.forecast;
        serde_json::json!({
            "scenario": scenario_id,
            "sample": f.sample,
            "from": self.from,
            "note": self.note.trim_start_matches("; "),
            "p90_needs": P90_SAMPLE_MIN,
            "total": f.total,
            "levels": f.levels.iter().map(|(l, s)| serde_json::json!({"level": l, "spread": s})).collect::<Vec<_>>(),
            "crossings": f.crossings,
            "jobs": self.spends,
        })
    }
}

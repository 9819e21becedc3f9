//! Cost forecasts: from recorded jobs of a scenario, the distribution of cost, tokens and
//! duration per level and in total, and how often a job crossed the scenario's budget.
//!
//! Percentiles are nearest-rank over the sample (p50 of 1, 2, 3, 4 is 2): a figure is
//! always one a recorded job reached. A p90 needs [`P90_SAMPLE_MIN`] jobs: from fewer, the
//! forecast gives none and says how many it has. Pure: no I/O, no clock.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::event::EventData;
use crate::replay::Tree;

/// The fewest jobs a p90 is given from.
pub const P90_SAMPLE_MIN: usize = 10;

/// What one recorded job spent, in total and per level.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobSpend {
    pub run_id: String,
    pub status: String,
    pub cost_usd: f64,
    pub tokens: u64,
    /// The time drivers worked on the job (waits for people left out).
    pub duration_ms: u64,
    /// Per level (`LEVEL`, a child's prefixed with its links): all attempts together.
    pub levels: BTreeMap<String, LevelSpend>,
    /// The job ended on a budget cap (`budget_exceeded`).
    pub over_budget: bool,
}

/// What one level spent in one job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LevelSpend {
    pub cost_usd: f64,
    pub tokens: u64,
    pub duration_ms: u64,
}

impl JobSpend {
    /// What a recorded job spent.
    pub fn of(tree: &Tree) -> JobSpend {
        let mut spend = JobSpend::default();
        for run in &tree.runs {
            let mut state = crate::state::RunState::default();
            for e in &run.events {
                state.apply(e);
                match &e.data {
                    EventData::LevelFinished(f) => {
                        let level = e.level_id.clone().unwrap_or_default();
                        let key = if run.links.is_empty() {
                            level
                        } else {
                            format!("{} > {level}", run.place())
                        };
                        let slot = spend.levels.entry(key).or_default();
                        slot.cost_usd += f.cost_usd;
                        slot.tokens += f.tokens;
                        slot.duration_ms += f.duration_ms;
                    }
                    EventData::BudgetExceeded(_) => spend.over_budget = true,
                    _ => {}
                }
            }
            if run.links.is_empty() {
                spend.run_id.clone_from(&run.run_id);
                spend.status = state.status.as_str().to_owned();
                let totals = state.tree_totals();
                spend.cost_usd = totals.cost_usd;
                spend.tokens = totals.tokens;
                spend.duration_ms = totals.duration_ms;
            }
        }
        spend
    }
}

/// A distribution's figures.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Figures {
    /// How many jobs it comes from.
    pub n: usize,
    pub p50: f64,
    /// `None` from fewer than [`P90_SAMPLE_MIN`] jobs.
    pub p90: Option<f64>,
    pub max: f64,
}

impl Figures {
    /// The figures of `values` (not empty).
    pub fn of(values: &[f64]) -> Option<Figures> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Figures {
            n: sorted.len(),
            p50: nearest_rank(&sorted, 50),
            p90: (sorted.len() >= P90_SAMPLE_MIN).then(|| nearest_rank(&sorted, 90)),
            max: sorted[sorted.len() - 1],
        })
    }
}

/// The nearest-rank percentile of sorted values: the smallest value with at least `p` %
/// of the values at or below it.
fn nearest_rank(sorted: &[f64], p: usize) -> f64 {
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// Cost, tokens and duration figures.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub cost_usd: Figures,
    pub tokens: Figures,
    pub duration_s: Figures,
}

impl Spread {
    fn of(points: &[(f64, u64, u64)]) -> Option<Spread> {
        let cost: Vec<f64> = points.iter().map(|p| p.0).collect();
        let tokens: Vec<f64> = points.iter().map(|p| p.1 as f64).collect();
        let secs: Vec<f64> = points.iter().map(|p| p.2 as f64 / 1000.0).collect();
        Some(Spread {
            cost_usd: Figures::of(&cost)?,
            tokens: Figures::of(&tokens)?,
            duration_s: Figures::of(&secs)?,
        })
    }
}

/// How often the recorded jobs crossed a cap of the scenario's budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Crossing {
    /// `max_cost_usd`, `max_tokens`, `max_duration_s`, or `any` (any cap, or a job that
    /// ended on one).
    pub cap: String,
    pub limit: Option<f64>,
    /// Jobs at or over it, of `n`.
    pub crossed: usize,
    pub n: usize,
    /// `crossed / n`.
    pub probability: f64,
}

/// A scenario's forecast.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Forecast {
    pub scenario_id: String,
    /// How many jobs it comes from.
    pub sample: usize,
    pub total: Spread,
    /// Per level, in the order levels first appear in the jobs; a level's figures come
    /// from the jobs that ran it (its own `n`).
    pub levels: Vec<(String, Spread)>,
    pub crossings: Vec<Crossing>,
}

impl Forecast {
    /// The forecast of `jobs` (none when there are no jobs) under `budget`.
    pub fn of(
        scenario_id: &str,
        jobs: &[JobSpend],
        budget: &baton_scenario::model::Budget,
    ) -> Option<Forecast> {
        let totals: Vec<(f64, u64, u64)> =
            jobs.iter().map(|j| (j.cost_usd, j.tokens, j.duration_ms)).collect();
        let total = Spread::of(&totals)?;
        let mut order: Vec<&String> = Vec::new();
        for j in jobs {
            for level in j.levels.keys() {
                if !order.contains(&level) {
                    order.push(level);
                }
            }
        }
        let levels = order
            .into_iter()
            .filter_map(|level| {
                let points: Vec<(f64, u64, u64)> = jobs
                    .iter()
                    .filter_map(|j| j.levels.get(level))
                    .map(|l| (l.cost_usd, l.tokens, l.duration_ms))
                    .collect();
                Some((level.clone(), Spread::of(&points)?))
            })
            .collect();
        let n = jobs.len();
        let crossing = |cap: &str, limit: Option<f64>, over: &dyn Fn(&JobSpend) -> bool| {
            let crossed = jobs.iter().filter(|j| over(j)).count();
            Crossing {
                cap: cap.to_owned(),
                limit,
                crossed,
                n,
                probability: crossed as f64 / n as f64,
            }
        };
        let mut crossings = Vec::new();
        if let Some(max) = budget.max_cost_usd {
            crossings.push(crossing("max_cost_usd", Some(max), &|j| j.cost_usd >= max));
        }
        if let Some(max) = budget.max_tokens {
            crossings.push(crossing("max_tokens", Some(max as f64), &|j| j.tokens >= max));
        }
        if let Some(max) = budget.max_duration_s {
            crossings.push(crossing("max_duration_s", Some(max), &|j| {
                j.duration_ms as f64 / 1000.0 >= max
            }));
        }
        crossings.push(crossing("any", None, &|j| {
            j.over_budget
                || budget.max_cost_usd.is_some_and(|m| j.cost_usd >= m)
                || budget.max_tokens.is_some_and(|m| j.tokens >= m)
                || budget.max_duration_s.is_some_and(|m| j.duration_ms as f64 / 1000.0 >= m)
        }));
        Some(Forecast { scenario_id: scenario_id.to_owned(), sample: n, total, levels, crossings })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_p90_needs_ten_values() {
        let f = Figures::of(&[4.0, 1.0, 3.0, 2.0]).unwrap_or_else(|| unreachable!());
        assert_eq!((f.n, f.p50, f.p90, f.max), (4, 2.0, None, 4.0));
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        let f = Figures::of(&ten).unwrap_or_else(|| unreachable!());
        assert_eq!((f.p50, f.p90, f.max), (5.0, Some(9.0), 10.0));
        let eleven: Vec<f64> = (1..=11).map(f64::from).collect();
        let f = Figures::of(&eleven).unwrap_or_else(|| unreachable!());
        assert_eq!((f.p50, f.p90), (6.0, Some(10.0)));
        assert!(Figures::of(&[]).is_none());
    }
}

//! `baton forecast SCENARIO`: what a job of a scenario costs, from recorded jobs —
//! fixtures, or the store's history (the application layer's `forecast`) — with the
//! figures the engine's `forecast` module computes.

use std::process::ExitCode;

use anyhow::bail;
use baton_app::forecast::{Source, like_input, sample};
use baton_app::place::Place;
use baton_engine::forecast::{Figures, Forecast, JobSpend, P90_SAMPLE_MIN};
use serde_json::json;

use crate::escape::one_line;
use crate::out::outln;

/// `baton forecast SCENARIO`.
pub(crate) async fn forecast(
    place: &Place,
    scenario_id: &str,
    input: Option<&str>,
    source: Source,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let registry = baton_app::scenarios::registry(place)?;
    let scenario = baton_app::scenarios::find_scenario(&registry, scenario_id, place)?;
    let (jobs, from) = sample(place, scenario_id, &source).await?;
    let (jobs, note) = like_input(jobs, input);
    let spends: Vec<JobSpend> = jobs.iter().map(|(_, t)| JobSpend::of(t)).collect();
    let Some(f) = Forecast::of(scenario_id, &spends, &scenario.budget) else {
        bail!(
            "no recorded job of scenario `{scenario_id}` in {from}; run it, or record fixtures (`baton fixture record`) and use --fixtures"
        );
    };
    if json {
        outln!(
            "{}",
            json!({
                "scenario": scenario_id,
                "sample": f.sample,
                "from": from,
                "note": note.trim_start_matches("; "),
                "p90_needs": P90_SAMPLE_MIN,
                "total": f.total,
                "levels": f.levels.iter().map(|(l, s)| json!({"level": l, "spread": s})).collect::<Vec<_>>(),
                "crossings": f.crossings,
                "jobs": spends,
            })
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!("forecast for {scenario_id} from {} recorded job(s): {from}{note}", f.sample)?;
    if f.sample < P90_SAMPLE_MIN {
        outln!(
            "no p90: a p90 needs {P90_SAMPLE_MIN} jobs and there are {}; p50 and max are shown",
            f.sample
        )?;
    }
    outln!(
        "{:<36} {:>32} {:>26} {:>26}",
        "",
        "cost USD (p50 / p90 / max)",
        "tokens (p50 / p90 / max)",
        "seconds (p50 / p90 / max)"
    )?;
    let row = |name: &str, s: &baton_engine::forecast::Spread| {
        format!(
            "{:<36} {:>32} {:>26} {:>26}",
            one_line(name),
            figures(&s.cost_usd, |v| format!("{v:.6}")),
            figures(&s.tokens, |v| format!("{v:.0}")),
            figures(&s.duration_s, |v| format!("{v:.2}")),
        )
    };
    outln!("{}", row("total", &f.total))?;
    for (level, spread) in &f.levels {
        let name = if spread.cost_usd.n < f.sample {
            format!("{level} ({} jobs)", spread.cost_usd.n)
        } else {
            level.clone()
        };
        outln!("{}", row(&name, spread))?;
    }
    for c in &f.crossings {
        let what = match (c.cap.as_str(), c.limit) {
            ("any", _) => "any budget cap".to_owned(),
            (cap, Some(limit)) => format!("{cap} {limit}"),
            (cap, None) => cap.to_owned(),
        };
        outln!(
            "{what}: crossed by {} of {} jobs (probability {:.2})",
            c.crossed,
            c.n,
            c.probability
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn figures(f: &Figures, show: impl Fn(f64) -> String) -> String {
    let p90 = f.p90.map_or_else(|| "—".to_owned(), &show);
    format!("{} / {p90} / {}", show(f.p50), show(f.max))
}

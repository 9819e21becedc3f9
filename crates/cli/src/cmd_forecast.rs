//! `baton forecast SCENARIO`: what a job of a scenario costs, from recorded jobs —
//! fixtures, or the store's history (the application layer's `forecast`) — with the
//! figures the engine's `forecast` module computes.

use std::process::ExitCode;

use baton_app::forecast::Source;
use baton_app::place::Place;
use baton_engine::forecast::{Figures, P90_SAMPLE_MIN};

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
    let made = baton_app::forecast::forecast(place, scenario_id, input, source).await?;
    if json {
        outln!("{}", made.to_json(scenario_id))?;
        return Ok(ExitCode::SUCCESS);
    }
    let baton_app::forecast::Made { forecast: f, from, note, .. } = made;
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

//! Model constraints: `tier:provider/model` patterns, fallbacks, temperature and retries.

use super::checker::Checker;
use crate::de::Located;
use crate::limits;
use crate::model::{ModelConstraint, RetryPolicy, Tier};
use crate::raw::RawModel;
use crate::source::Pos;

impl Checker<'_> {
    pub(super) fn model(
        &mut self,
        m: &Located<RawModel>,
        source: &'static str,
    ) -> Option<ModelConstraint> {
        let mut tier: Option<(Tier, Pos)> = None;
        let mut ok = true;
        let mut allow = Vec::new();
        for pattern in &m.value.allow {
            match parse_model_pattern(&pattern.value) {
                Ok(t) => {
                    if let Some((first, first_pos)) = tier {
                        if first != t {
                            let line = first_pos.line;
                            self.error("mixed-tiers", pattern.pos, format!(
                                "`{}` is {} tier but the allow list started with {} (line {line})",
                                pattern.value, t.as_str(), first.as_str()
                            ))
                            .help = Some("an allow list names one tier; use `fallback` or `fallback_outside_allow` to reach the other".to_owned());
                            ok = false;
                        }
                    } else {
                        tier = Some((t, pattern.pos));
                    }
                    allow.push(pattern.value.clone());
                }
                Err(why) => {
                    self.error("bad-model", pattern.pos, format!("`{}` is not a model pattern: {why}", pattern.value)).help =
                        Some("write `tier:provider/model` with tier `free` or `paid`; `*` matches anything, e.g. `free:*`, `paid:anthropic/*`".to_owned());
                    ok = false;
                }
            }
        }
        let mut fallback = Vec::new();
        for entry in &m.value.fallback {
            if let Err(why) = parse_model_pattern(&entry.value) {
                self.error(
                    "bad-model",
                    entry.pos,
                    format!("`{}` is not a model pattern: {why}", entry.value),
                );
                ok = false;
            }
            fallback.push(entry.value.clone());
        }
        let temperature = m.value.temperature.as_ref().map(|t| t.value);
        if let Some(t) = &m.value.temperature
            && !(0.0..=2.0).contains(&t.value)
        {
            self.error(
                "out-of-range",
                t.pos,
                format!("temperature {} is outside 0..=2", t.value),
            )
            .help = Some("use 0 for the most deterministic answers, up to 2".to_owned());
            ok = false;
        }
        let names_models = !m.value.allow.is_empty() || !m.value.fallback.is_empty();
        // A constraint that only sets the temperature or the retry budget leaves the choice
        // to the default.
        let fallback_outside_allow =
            m.value.fallback_outside_allow.as_ref().is_some_and(|f| f.value)
                || (!names_models && (temperature.is_some() || m.value.retry.is_some()));
        if !names_models && !fallback_outside_allow {
            self.error("empty-model", m.pos, "the model constraint allows nothing").help = Some(
                "add `allow:` patterns, or leave `model:` out to use the routing default"
                    .to_owned(),
            );
            ok = false;
        }
        let retry = match &m.value.retry {
            Some(r) => {
                let errors = self.diags.error_count();
                let policy = RetryPolicy {
                    attempts: self.bounded(
                        r.value.attempts.as_ref(),
                        "retry.attempts",
                        limits::RETRY_ATTEMPTS_MAX,
                    ),
                    max_time_s: self.positive(
                        r.value.max_time_s.as_ref(),
                        "retry.max_time_s",
                        limits::RETRY_TIME_S_MAX,
                    ),
                    backoff_max_s: self.positive(
                        r.value.backoff_max_s.as_ref(),
                        "retry.backoff_max_s",
                        limits::RETRY_BACKOFF_S_MAX,
                    ),
                };
                ok &= self.diags.error_count() == errors;
                policy
            }
            None => RetryPolicy::default(),
        };
        ok.then(|| ModelConstraint {
            tier: tier.map(|t| t.0),
            allow,
            fallback_outside_allow,
            fallback,
            temperature,
            retry,
            source,
        })
    }
}

/// Parses `tier:provider[/model]`, returning the tier.
pub fn parse_model_pattern(pattern: &str) -> Result<Tier, &'static str> {
    let Some((tier, rest)) = pattern.split_once(':') else {
        return Err("it has no tier (`free:` or `paid:`)");
    };
    let tier = match tier {
        "free" => Tier::Free,
        "paid" => Tier::Paid,
        _ => return Err("the tier must be `free` or `paid`"),
    };
    if rest.is_empty() {
        return Err("it names no provider (use `*` for any)");
    }
    let (provider, model) = rest.split_once('/').map_or((rest, None), |(p, m)| (p, Some(m)));
    let provider_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*');
    if provider.is_empty() || !provider.chars().all(provider_ok) {
        return Err("the provider may hold letters, digits, `_`, `-`, `.` and `*`");
    }
    if let Some(model) = model {
        let model_ok = |c: char| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*' | ':' | '@' | '/')
        };
        if model.is_empty() || !model.chars().all(model_ok) {
            return Err("the model may hold letters, digits and `_ - . * : @ /`");
        }
    }
    Ok(tier)
}

//! Wave levels: where a wave's work comes from, how it is dispatched, and its worker bounds.

use std::collections::HashMap;

use super::checker::Checker;
use crate::de::Located;
use crate::limits;
use crate::model::{LevelIdx, LevelKind, WaveDispatch, WaveSource, WaveSpec};
use crate::raw::RawLevel;

impl Checker<'_> {
    pub(super) fn wave(
        &mut self,
        raw: &Located<RawLevel>,
        index: &HashMap<String, LevelIdx>,
    ) -> Option<LevelKind> {
        let Some(wave) = &raw.wave else {
            self.error(
                "missing-field",
                raw.pos,
                format!("wave level `{}` needs a `wave:` mapping", raw.id.value),
            )
            .help =
                Some("for example `wave: {worker: code_build, assignments_from: plan}`".to_owned());
            return None;
        };
        let w = &wave.value;
        let errors_before = self.diags.error_count();
        let dispatch = match w.dispatch.as_ref().map(|d| d.value) {
            Some(crate::raw::RawDispatch::Manual) => WaveDispatch::Manual,
            None | Some(crate::raw::RawDispatch::Auto) => WaveDispatch::Auto,
        };
        let worker = w.worker.as_ref().map(|id| {
            self.id(id, "worker scenario");
            id.value.clone()
        });
        let command = w.command.as_ref().map(|c| {
            if c.value.is_empty() || c.value[0].trim().is_empty() {
                self.error(
                    "invalid-value",
                    c.pos,
                    "`command` must name the program to run (its argv)",
                );
            }
            c.value.clone()
        });
        if let (Some(_), Some(c)) = (&worker, &w.command) {
            self.error(
                "invalid-value",
                c.pos,
                format!(
                    "wave level `{}` names both a `worker` scenario and a `command`; keep one",
                    raw.id.value
                ),
            );
        }
        if worker.is_none() && command.is_none() && dispatch == WaveDispatch::Auto {
            self.error(
                "missing-field",
                wave.pos,
                format!("wave level `{}` names no `worker` scenario (or `command`) to run its assignments", raw.id.value),
            )
            .help = Some("add `worker: <scenario id>` or `command: [program, args…]`, or `dispatch: manual` for workers run outside Baton".to_owned());
        }
        let source = match &w.assignments_from {
            None => WaveSource::Input,
            Some(from) if from.value == "input" => WaveSource::Input,
            Some(from) => {
                if from.value == raw.id.value {
                    self.error(
                        "invalid-value",
                        from.pos,
                        "a wave cannot take its assignments from itself",
                    );
                } else if !index.contains_key(&from.value) {
                    let help =
                        crate::suggest::closest(&from.value, index.keys().map(String::as_str))
                            .map(|near| format!("did you mean `{near}`?"))
                            .unwrap_or_else(|| {
                                "name `input` or a level of this scenario".to_owned()
                            });
                    self.error(
                        "unknown-level",
                        from.pos,
                        format!("`assignments_from` names no level `{}`", from.value),
                    )
                    .help = Some(help);
                }
                WaveSource::Level(from.value.clone())
            }
        };
        let max_parallel = w.max_parallel.as_ref().and_then(|m| {
            let max = limits::WAVE_PARALLEL_MAX;
            match u32::try_from(m.value) {
                Ok(v) if (1..=max).contains(&v) => Some(v),
                _ => {
                    self.error(
                        "out-of-range",
                        m.pos,
                        format!("`max_parallel` of a wave must be an integer from 1 through {max}, found {}", m.value),
                    );
                    None
                }
            }
        });
        let timeout_ms = match &w.timeout_s {
            None => limits::WAVE_TIMEOUT_MS_DEFAULT,
            Some(t) => match wave_timeout_ms(t.value) {
                Some(ms) => ms,
                None => {
                    self.error(
                        "out-of-range",
                        t.pos,
                        format!(
                            "`timeout_s` of a wave worker must be from 0.001 through {} seconds (1 to {} ms), found {}",
                            limits::WAVE_TIMEOUT_MS_MAX as f64 / 1000.0,
                            limits::WAVE_TIMEOUT_MS_MAX,
                            t.value
                        ),
                    );
                    0
                }
            },
        };
        let max_assignments = self
            .bounded(w.max_assignments.as_ref(), "max_assignments", limits::WAVE_ASSIGNMENTS_MAX)
            .unwrap_or(limits::WAVE_ASSIGNMENTS_DEFAULT);
        if self.diags.error_count() > errors_before {
            return None;
        }
        Some(LevelKind::Wave(WaveSpec {
            worker,
            command,
            source,
            max_parallel,
            timeout_ms,
            max_assignments,
            dispatch,
            context: w.context.as_ref().map(|c| c.value.clone()),
            order: w.order.as_ref().map(|o| o.value).unwrap_or_default(),
        }))
    }
}

/// A wave worker's timeout given in seconds, as whole milliseconds: `None` unless it is
/// 1 ms to [`limits::WAVE_TIMEOUT_MS_MAX`] ms once rounded.
pub fn wave_timeout_ms(seconds: f64) -> Option<u64> {
    if !seconds.is_finite() {
        return None;
    }
    let ms = (seconds * 1000.0).round();
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    ((1.0..=limits::WAVE_TIMEOUT_MS_MAX as f64).contains(&ms)).then_some(ms as u64)
}

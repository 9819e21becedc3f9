//! The model policy: from a level's constraint and the routing default to a concrete
//! provider and model, and the ordered chain to fail over along.
//!
//! A constraint's `allow` globs match `tier:provider/model` (`*` matches any run of
//! characters). Every configured model an allow pattern matches comes first, in the
//! patterns' order and configuration order within each; then come the constraint's
//! `fallback` entries in order; then, with `fallback_outside_allow`, the
//! routing default. A level without a constraint uses the routing default.

use baton_scenario::model::{ModelConstraint, Tier};

use crate::config::{Config, Model, Provider, matching};
pub use crate::config::{find, glob};

/// One concrete choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice<'a> {
    pub tier: Tier,
    pub provider: &'a Provider,
    pub model: &'a Model,
    /// Where the choice came from: `allow`, `fallback`, `default`.
    pub source: &'static str,
}

impl Choice<'_> {
    /// `tier:provider/model`.
    pub fn label(&self) -> String {
        format!("{}:{}/{}", self.tier.as_str(), self.provider.name, self.model.name)
    }
}

/// The ordered candidates for a level: its first choice, then what to fail over to.
/// Empty when nothing configured satisfies the constraint.
pub fn chain<'a>(config: &'a Config, constraint: Option<&'a ModelConstraint>) -> Vec<Choice<'a>> {
    let mut out: Vec<Choice<'a>> = Vec::new();
    let push = |provider: &'a Provider,
                model: &'a Model,
                source: &'static str,
                out: &mut Vec<Choice<'a>>| {
        if !out.iter().any(|c| std::ptr::eq(c.model, model)) {
            out.push(Choice { tier: provider.tier, provider, model, source });
        }
    };
    let default = config.routing.default.as_deref().and_then(|d| find(config, d));
    match constraint {
        None => {
            if let Some((p, m)) = default {
                push(p, m, "default", &mut out);
            }
        }
        Some(c) => {
            // Every configured model an allow pattern matches is a candidate, pattern by
            // pattern and in configuration order within one: a second free provider is
            // a failover target, not ignored.
            for pattern in &c.allow {
                for (p, m) in matching(config, pattern) {
                    push(p, m, "allow", &mut out);
                }
            }
            for pattern in &c.fallback {
                if let Some((p, m)) = find(config, pattern) {
                    push(p, m, "fallback", &mut out);
                }
            }
            if c.fallback_outside_allow
                && let Some((p, m)) = default
            {
                push(p, m, "default", &mut out);
            }
        }
    }
    out
}

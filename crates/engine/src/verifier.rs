//! Verifiers, as the kernel sees them: the [`Verifier`] trait, the [`Judge`] an
//! `llm_judge` asks through, and the set a run has ([`Verifiers`], by `uses`).
//!
//! A verifier gets a [`VerifyContext`] and returns a [`VerifierFinished`] outcome. The
//! kernel starts no program: the verifiers that do (the `command` verifier, the presets,
//! the scanners, MCP servers) are the embedder's — `baton-verifiers` — and run their
//! programs in the jail they were given; a verifier says why it cannot run on this host
//! ([`Verifier::refusal`]). The only check the kernel holds is `schema`, which reads the
//! level's answer. An `llm_judge` is a [`Judge`]: it writes the question and scores the
//! answer, and the kernel makes the model call between them (budgeted and recorded).

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use baton_scenario::model::{Uses, VerifierSpec};
use serde_json::Value;

use crate::cancel::CancelToken;
use crate::event::VerifierFinished;
use crate::future::BoxFuture;

/// What a verifier may look at.
#[derive(Clone, Debug)]
pub struct VerifyContext {
    pub workspace: PathBuf,
    pub input: String,
    pub output: String,
    pub parsed: Option<Value>,
    pub scratchpad: serde_json::Map<String, Value>,
}

/// A check on a level's result.
pub trait Verifier: Send + Sync + std::fmt::Debug {
    /// Runs the check described by `spec`.
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished>;

    /// Why this verifier cannot run on this host (its programs' jail cannot be set up), if
    /// it cannot: a job that would reach it is refused before it starts.
    fn refusal(&self) -> Option<String> {
        None
    }
}

/// The model call an `llm_judge` makes: its name in the log (`judge:RUBRIC`) and prompt.
#[derive(Clone, Debug)]
pub struct JudgeCall {
    pub name: String,
    pub prompt: String,
}

/// How an `llm_judge` asks and scores; the kernel makes the call between the two.
pub trait Judge: Send + Sync + std::fmt::Debug {
    /// The call that asks the judge about `ctx.output`, or why it cannot be asked.
    fn ask(&self, spec: &VerifierSpec, ctx: &VerifyContext) -> Result<JudgeCall, String>;

    /// The outcome the judge's answer gives (its cost and duration are the kernel's to set).
    fn score(&self, spec: &VerifierSpec, answer: &str) -> VerifierFinished;
}

/// The verifiers available to a run, by `uses`.
#[derive(Clone, Debug, Default)]
pub struct Verifiers {
    by_uses: BTreeMap<&'static str, Arc<dyn Verifier>>,
    /// What an `llm_judge` asks and how its answer scores.
    judge: Option<Arc<dyn Judge>>,
    /// A `trust_validation` replay's recorded outcomes, returned instead of running a
    /// verifier that has one.
    trusted: Option<Arc<crate::replay::Trusted>>,
}

impl Verifiers {
    /// The one verifier the kernel holds: `schema`, which reads the level's answer.
    pub fn builtin() -> Self {
        let mut v = Verifiers::default();
        v.register(Uses::Schema, Arc::new(SchemaVerifier));
        v
    }

    /// Sets what an `llm_judge` asks and how its answer scores.
    pub fn set_judge(&mut self, judge: Arc<dyn Judge>) {
        self.judge = Some(judge);
    }

    /// The judge, if this build has one.
    pub fn judge(&self) -> Option<&Arc<dyn Judge>> {
        self.judge.as_ref()
    }

    /// Why the verifier for `uses` cannot run on this host, if it cannot.
    pub fn refusal(&self, uses: Uses) -> Option<String> {
        self.get(uses)?.refusal()
    }

    /// Registers (or replaces) the verifier for a `uses`.
    pub fn register(&mut self, uses: Uses, verifier: Arc<dyn Verifier>) {
        self.by_uses.insert(uses.as_str(), verifier);
    }

    /// Returns `trusted`'s recorded outcomes instead of running the verifiers that have one.
    pub fn trusting(mut self, trusted: Arc<crate::replay::Trusted>) -> Self {
        self.trusted = Some(trusted);
        self
    }

    /// The recorded outcome a trusting replay takes for this verifier, if any.
    pub fn trusted(
        &self,
        run_id: &str,
        level_id: &str,
        attempt: u32,
        name: &str,
    ) -> Option<VerifierFinished> {
        self.trusted.as_ref()?.take(run_id, level_id, attempt, name)
    }

    /// The verifier for a `uses`, if this build has one.
    pub fn get(&self, uses: Uses) -> Option<&Arc<dyn Verifier>> {
        self.by_uses.get(uses.as_str())
    }
}

/// The outcome of a check that ran for free: passed or not, with its reasons and details.
pub fn checked(
    spec: &VerifierSpec,
    passed: bool,
    reasons: Vec<String>,
    started: Instant,
    details: Value,
) -> VerifierFinished {
    VerifierFinished {
        name: spec.name.clone(),
        passed,
        score: Some(if passed { 1.0 } else { 0.0 }),
        reasons,
        cost_usd: 0.0,
        duration_ms: crate::clock::elapsed_ms(started),
        details,
    }
}

/// The outcome of a verifier left out because an earlier one failed (serial mode): it did
/// not pass, and it did not fail either — it is neither reported nor counted as a failure.
pub fn not_run(spec: &VerifierSpec, why: &str) -> VerifierFinished {
    let mut outcome = unavailable(spec, why);
    outcome.details = serde_json::json!({ "not_run": true });
    outcome
}

impl VerifierFinished {
    /// Whether the verifier was left out without running ([`not_run`]).
    pub fn not_run(&self) -> bool {
        self.details.get("not_run").and_then(Value::as_bool).unwrap_or(false)
    }
}

/// An outcome for a verifier that could not run.
pub fn unavailable(spec: &VerifierSpec, why: &str) -> VerifierFinished {
    VerifierFinished {
        name: spec.name.clone(),
        passed: false,
        score: None,
        reasons: vec![why.to_owned()],
        cost_usd: 0.0,
        duration_ms: 0,
        details: Value::Null,
    }
}

/// Validates the level's parsed JSON against the verifier's schema.
#[derive(Clone, Copy, Debug, Default)]
pub struct SchemaVerifier;

impl Verifier for SchemaVerifier {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        _cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move {
            let started = Instant::now();
            let reasons = match (&spec.schema, &ctx.parsed) {
                (None, _) => vec!["the verifier has no schema".to_owned()],
                (Some(_), None) => vec!["the level's answer is not JSON".to_owned()],
                (Some(schema), Some(value)) => schema.violations(value),
            };
            checked(spec, reasons.is_empty(), reasons, started, Value::Null)
        })
    }
}

/// The last `max` bytes of a text, on a character boundary.
pub fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// A verifier's place in a tree: run, level, attempt, name.
pub(crate) type VerifierKey = (String, String, u32, String);

/// Recorded verifier outcomes a `trust_validation` replay returns instead of running the
/// verifiers; each is taken once, in the order it was recorded.
#[derive(Debug, Default)]
pub struct Trusted {
    pub(crate) by: Mutex<BTreeMap<VerifierKey, VecDeque<VerifierFinished>>>,
}

impl Trusted {
    /// The next recorded outcome of verifier `name` in this attempt of the level, if any.
    pub fn take(
        &self,
        run_id: &str,
        level_id: &str,
        attempt: u32,
        name: &str,
    ) -> Option<VerifierFinished> {
        let mut by = self.by.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (run_id.to_owned(), level_id.to_owned(), attempt, name.to_owned());
        by.get_mut(&key).and_then(VecDeque::pop_front)
    }
}

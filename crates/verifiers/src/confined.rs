//! A verifier that starts programs ([`Confined`]) and the jail they run in, together the
//! `Verifier` the engine is given ([`InJail`]): it says why it cannot run on this host (the
//! jail cannot be set up) and marks its outcomes `jail: off` when the jail is off.

use std::sync::Arc;

use baton_engine::cancel::CancelToken;
use baton_engine::event::VerifierFinished;
use baton_engine::model::BoxFuture;
use baton_engine::verifier::{Verifier, VerifyContext};
use baton_jail::Jail;
use baton_scenario::model::VerifierSpec;
use serde_json::Value;

/// A verifier whose checks start programs, given the jail they run in.
pub trait Confined: Send + Sync + std::fmt::Debug {
    /// Runs the check described by `spec`, its programs in `jail`.
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        jail: &'a Jail,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished>;
}

/// A [`Confined`] verifier with its jail: the `Verifier` the engine is given.
#[derive(Debug)]
pub struct InJail<V> {
    jail: Arc<Jail>,
    verifier: V,
}

impl<V: Confined> InJail<V> {
    /// `verifier`, its programs run in `jail`.
    pub fn new(jail: Arc<Jail>, verifier: V) -> Self {
        InJail { jail, verifier }
    }
}

impl<V: Confined> Verifier for InJail<V> {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move {
            let mut finished = self.verifier.verify(spec, ctx, &self.jail, cancel).await;
            // A program that ran unconfined (`--no-jail`) says so on its outcome.
            if self.jail.is_off() {
                if !finished.details.is_object() {
                    finished.details = Value::Object(serde_json::Map::new());
                }
                if let Value::Object(details) = &mut finished.details {
                    details.insert("jail".to_owned(), Value::from("off"));
                }
            }
            finished
        })
    }

    fn refusal(&self) -> Option<String> {
        self.jail.refusal().map(ToString::to_string)
    }
}

//! A piece of a model's answer as it streams in: not an event of the log, but what
//! followers see of an answer before its `model_response` is.

use std::sync::Arc;

/// A piece of a model's answer as it streams in: never recorded (the whole answer is, in
/// `model_response`), shown live by embedders that ask for it (`Engine::live`), and shared
/// between processes by stores that can (`EventStore::share_live`).
#[derive(Clone, Debug, PartialEq)]
pub struct LiveText {
    pub run_id: Arc<str>,
    pub level_id: String,
    pub call: u32,
    pub text: String,
}

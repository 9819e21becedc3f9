//! What the event streams send, shared by a run's stream (`events`), a job's tree stream
//! (`tree_events`) and MCP's `run_events`: an event of a log as JSON with its run, whether
//! it ends its run's log, a piece of a model's answer as an SSE event, and what a waiting
//! stream woke for.

use std::sync::Arc;

use axum::response::sse::Event as SseEvent;
use baton_engine::cancel::LiveText;
use baton_engine::event::EventData;
use serde_json::Value;

/// The events of a log as JSON values, with the run they belong to.
pub(crate) fn event_json(run_id: &str, e: &baton_engine::event::Event) -> Value {
    let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut v {
        map.insert("run_id".to_owned(), Value::String(run_id.to_owned()));
    }
    v
}

/// Whether an event ends its run's log.
pub(crate) fn ends(e: &baton_engine::event::Event) -> bool {
    matches!(e.data, EventData::ScenarioFinished(_))
}

/// What a stream woke for.
pub(crate) enum Woke {
    Events,
    Text(Arc<LiveText>),
    Stop,
}

/// A piece of a model's answer as an SSE event: type `model_delta`, no id (it is not an
/// event of the log, so a reconnect does not resume from it).
pub(crate) fn live_event(t: &LiveText) -> SseEvent {
    let data = serde_json::json!({
        "run_id": &*t.run_id,
        "level_id": t.level_id,
        "call": t.call,
        "text": t.text,
    });
    SseEvent::default().event("model_delta").data(data.to_string())
}

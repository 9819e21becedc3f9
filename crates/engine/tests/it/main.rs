//! Kernel tests: the planner given events, and whole runs on the scripted model over the
//! in-memory store (every kind, gates, budget, cancel, approvals, answers, crashes).

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

mod crash;
mod planner;
mod runs;

use std::path::PathBuf;
use std::sync::Arc;

use baton_engine::event::{Event, EventData};
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::runner::Runtime;
use baton_engine::store::{EventStore, MemoryStore};
use baton_engine::verifier::Verifiers;
use baton_engine::{Engine, clock::SystemClock};
use baton_scenario::{Registry, Scenario};

/// Loads one scenario from YAML text (templates inline).
pub fn scenario(yaml: &str) -> Arc<Scenario> {
    let dir = std::env::temp_dir().join(format!(
        "baton-engine-it-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("s.yaml"), yaml).unwrap();
    let loaded = Registry::load(&[&dir]).unwrap_or_else(|e| panic!("{}", e.diagnostics.render()));
    let _ = std::fs::remove_dir_all(&dir);
    Arc::clone(loaded.registry.scenarios().next().unwrap())
}

/// An engine over a fresh memory store.
pub fn engine(model: impl ModelProvider + 'static) -> Engine {
    engine_on(Arc::new(MemoryStore::new()), model)
}

/// An engine over a given store.
pub fn engine_on(store: Arc<dyn EventStore>, model: impl ModelProvider + 'static) -> Engine {
    Engine::new(
        store,
        Arc::new(Runtime {
            model: Arc::new(model),
            verifiers: Verifiers::builtin(),
            workspace: PathBuf::from("."),
            catalog: Arc::new(serde_json::Value::Array(Vec::new())),
        }),
        Arc::new(SystemClock),
    )
}

/// A scripted model from YAML text.
pub fn script(yaml: &str) -> ScriptedModel {
    ScriptedModel::parse(yaml, "script.yaml").unwrap()
}

/// The kinds of a log, with level ids where they belong: `level_started:l1`.
pub fn kinds(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| match &e.level_id {
            Some(l) => format!("{}:{l}", e.data.kind()),
            None => e.data.kind().to_owned(),
        })
        .collect()
}

/// The gate decisions of a log, as `source->target`.
pub fn route(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::GateDecision(g) => Some(format!("{}->{}", g.source, g.target)),
            _ => None,
        })
        .collect()
}

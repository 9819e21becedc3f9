//! Kernel tests: the planner given events, and whole runs on the scripted model over the
//! in-memory store (every kind, gates, budget, cancel, approvals, answers, crashes).

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

/// The `EventStore` methods a test wrapper passes to its `inner` store unchanged (every
/// one but `create_run`, `append` and `hold`, which the wrappers observe or break).
macro_rules! delegate_to_inner {
    () => {
        fn load<'a>(
            &'a self,
            run_id: &'a str,
            after: u64,
        ) -> BoxFuture<'a, Result<Vec<Event>, store::Error>> {
            self.inner.load(run_id, after)
        }
        delegate_to_inner!(but_load);
    };
    (but_load) => {
        fn verify<'a>(
            &'a self,
            run_id: &'a str,
        ) -> BoxFuture<'a, Result<store::Verified, store::Error>> {
            self.inner.verify(run_id)
        }
        fn writers<'a>(
            &'a self,
            run_id: &'a str,
        ) -> BoxFuture<'a, Result<Vec<(u64, String)>, store::Error>> {
            self.inner.writers(run_id)
        }
        fn run<'a>(
            &'a self,
            run_id: &'a str,
        ) -> BoxFuture<'a, Result<Option<RunRecord>, store::Error>> {
            self.inner.run(run_id)
        }
        fn runs<'a>(
            &'a self,
            status: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Vec<RunRecord>, store::Error>> {
            self.inner.runs(status)
        }
        fn put_tenant_override<'a>(
            &'a self,
            o: &'a store::TenantOverride,
        ) -> BoxFuture<'a, Result<(), store::Error>> {
            self.inner.put_tenant_override(o)
        }
        fn tenant_overrides<'a>(
            &'a self,
            tenant: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Vec<store::TenantOverride>, store::Error>> {
            self.inner.tenant_overrides(tenant)
        }
        fn remove_tenant_override<'a>(
            &'a self,
            tenant: &'a str,
            scenario_id: &'a str,
        ) -> BoxFuture<'a, Result<bool, store::Error>> {
            self.inner.remove_tenant_override(tenant, scenario_id)
        }
        fn run_by_key<'a>(
            &'a self,
            tenant: Option<&'a str>,
            key: &'a str,
        ) -> BoxFuture<'a, Result<Option<RunRecord>, store::Error>> {
            self.inner.run_by_key(tenant, key)
        }
        fn keys_held<'a>(
            &'a self,
            tenant: Option<&'a str>,
            limit: u64,
        ) -> BoxFuture<'a, Result<u64, store::Error>> {
            self.inner.keys_held(tenant, limit)
        }
        fn put_scenario_texts<'a>(
            &'a self,
            checksum: &'a str,
            scenario_id: &'a str,
            texts: &'a str,
        ) -> BoxFuture<'a, Result<bool, store::Error>> {
            self.inner.put_scenario_texts(checksum, scenario_id, texts)
        }
        fn scenario_texts<'a>(
            &'a self,
            checksum: &'a str,
        ) -> BoxFuture<'a, Result<Option<String>, store::Error>> {
            self.inner.scenario_texts(checksum)
        }
        fn claim<'a>(
            &'a self,
            worker: &'a str,
            now: DateTime<Utc>,
            until: DateTime<Utc>,
            what: &'a baton_engine::store::Claimable,
        ) -> BoxFuture<'a, Result<Option<RunRecord>, store::Error>> {
            self.inner.claim(worker, now, until, what)
        }
        fn renew<'a>(
            &'a self,
            run_id: &'a str,
            worker: &'a str,
            now: DateTime<Utc>,
            until: DateTime<Utc>,
        ) -> BoxFuture<'a, Result<bool, store::Error>> {
            self.inner.renew(run_id, worker, now, until)
        }
        fn release<'a>(
            &'a self,
            run_id: &'a str,
            worker: &'a str,
        ) -> BoxFuture<'a, Result<(), store::Error>> {
            self.inner.release(run_id, worker)
        }

        fn purge<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<u64, store::Error>> {
            self.inner.purge(run_ids)
        }
    };
}

/// [`delegate_to_inner`], `hold` included.
macro_rules! delegate_all_to_inner {
    () => {
        delegate_to_inner!();
        fn hold<'a>(
            &'a self,
            run_id: &'a str,
        ) -> BoxFuture<'a, Result<store::RunGuard, store::Error>> {
            self.inner.hold(run_id)
        }
    };
}

mod approvals;
mod crash;
mod damage;
mod gates;
mod planner;
mod runs;
mod trees;
mod verifiers;
mod waves;

use std::path::PathBuf;
use std::sync::Arc;

use baton_engine::event::{Event, EventData};
use baton_engine::model::BoxFuture;
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::runner::Runtime;
use baton_engine::store::{self, RunRecord};
use baton_engine::store::{EventStore, MemoryStore};
use baton_engine::verifier::Verifiers;
use baton_engine::{Engine, clock::SystemClock};
use baton_scenario::{Registry, Scenario};
use chrono::{DateTime, Utc};

/// Loads one scenario from YAML text (templates inline).
pub fn scenario(yaml: &str) -> Arc<Scenario> {
    scenario_with(yaml, &[])
}

/// Loads one scenario from YAML text, beside other files (rubrics, schemas).
pub fn scenario_with(yaml: &str, files: &[(&str, &str)]) -> Arc<Scenario> {
    let dir = std::env::temp_dir().join(format!(
        "baton-engine-it-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("s.yaml"), yaml).unwrap();
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
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
    engine_with_jobs(store, model, None)
}

/// An engine over a given store that starts child runs with `jobs`.
pub fn engine_with_jobs(
    store: Arc<dyn EventStore>,
    model: impl ModelProvider + 'static,
    jobs: Option<Arc<baton_engine::job::Jobs>>,
) -> Engine {
    Engine::new(
        store,
        Arc::new(Runtime {
            jobs,
            model: Arc::new(model),
            verifiers: {
                let mut verifiers = Verifiers::builtin();
                let jail = std::sync::Arc::new(baton_jail::Jail::off());
                baton_verifiers::register(&mut verifiers, &jail);
                verifiers
            },
            workspace: PathBuf::from("."),
            workspaces: None,
            catalog: Arc::new(serde_json::Value::Array(Vec::new())),
            redactor: std::sync::Arc::new(baton_engine::redact::Verbatim),
            runner: std::sync::Arc::new(baton_runners::Runners),
            tools: None,
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

/// A memory store that counts its write transactions and remembers where each ended.
#[derive(Debug, Default)]
pub struct Observed {
    inner: MemoryStore,
    ends: std::sync::Mutex<Vec<u64>>,
}

impl Observed {
    /// The `seq` of the last event of every write, in order.
    pub fn boundaries(&self) -> Vec<u64> {
        self.ends.lock().unwrap().clone()
    }

    /// How many writes there were.
    pub fn writes(&self) -> usize {
        self.ends.lock().unwrap().len()
    }
}

impl EventStore for Observed {
    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        let count = events.len() as u64;
        Box::pin(async move {
            self.inner.create_run(run, events).await?;
            self.ends.lock().unwrap().push(count);
            Ok(())
        })
    }
    fn append<'a>(
        &'a self,
        run_id: &'a str,
        expected: u64,
        events: Vec<Event>,
        status: &'a str,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        let count = events.len() as u64;
        Box::pin(async move {
            self.inner.append(run_id, expected, events, status).await?;
            self.ends.lock().unwrap().push(expected + count - 1);
            Ok(())
        })
    }
    delegate_all_to_inner!();
}

/// A memory store that says its notice covers every process (as PostgreSQL's LISTEN
/// does), wakes the run's notifier on each append (unless its notices are `lost`), and
/// counts the reads a running step makes of what other processes appended.
#[derive(Debug, Default)]
pub struct Noticing {
    inner: MemoryStore,
    woken: std::sync::Arc<tokio::sync::Notify>,
    pub looks: std::sync::atomic::AtomicUsize,
    /// Appends wake nobody: the notices are lost, as with a broken listen connection.
    pub lost: std::sync::atomic::AtomicBool,
}

impl EventStore for Noticing {
    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        self.inner.create_run(run, events)
    }
    fn append<'a>(
        &'a self,
        run_id: &'a str,
        expected: u64,
        events: Vec<Event>,
        status: &'a str,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        Box::pin(async move {
            self.inner.append(run_id, expected, events, status).await?;
            if !self.lost.load(std::sync::atomic::Ordering::Relaxed) {
                self.woken.notify_waiters();
            }
            Ok(())
        })
    }
    fn load<'a>(
        &'a self,
        run_id: &'a str,
        after: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, store::Error>> {
        if after > 0 {
            self.looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.load(run_id, after)
    }
    fn notices_other_processes(&self) -> bool {
        true
    }
    fn notifier<'a>(
        &'a self,
        _run_id: &'a str,
    ) -> BoxFuture<'a, Option<std::sync::Arc<tokio::sync::Notify>>> {
        Box::pin(async move { Some(std::sync::Arc::clone(&self.woken)) })
    }
    fn hold<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<store::RunGuard, store::Error>> {
        self.inner.hold(run_id)
    }
    delegate_to_inner!(but_load);
}

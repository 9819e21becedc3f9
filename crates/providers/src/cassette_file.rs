//! Cassette files: reading one (a regular file of at most `CASSETTE_BYTES_MAX` bytes),
//! writing one atomically (a temporary file renamed over the old one), and [`Recorder`],
//! which wraps a provider and writes every answer it gives into a cassette file as it
//! comes — and, through [`Recorder::tools`], every answer of the user's tools (what their
//! MCP servers listed, each call's result bounded and redacted as the model read it). The
//! cassette format and the replaying provider are the engine's (`baton_engine::cassette`);
//! the files are this crate's.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use std::collections::BTreeMap;

use baton_engine::cancel::CancelToken;
use baton_engine::cassette::{Cassette, Entry, FORMAT, ToolEntry};
use baton_engine::event::ledger::ListedTool;
use baton_engine::limits;
use baton_engine::model::{BoxFuture, ModelError, ModelProvider, ModelReply, ModelRequest};
use baton_engine::redact::Redact;
use baton_engine::tools::{Listed, OwnCall, ToolHost, ToolSession, bounded_result};
use baton_engine::workspace::ToolOutcome;
use baton_scenario::model::OwnTool;

/// Reads a cassette file; errors name the file.
pub fn load(path: &Path) -> Result<Cassette, String> {
    let text = baton_scenario::capped::read_text(path, limits::CASSETTE_BYTES_MAX)
        .map_err(|e| format!("cannot read the cassette: {e}"))?;
    Cassette::parse(&text, &path.display().to_string())
}

/// Writes the cassette to `path`, atomically (a temporary file renamed over the old one).
pub fn save(cassette: &Cassette, path: &Path) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, cassette.to_text())
        .map_err(|e| format!("cannot write cassette {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| format!("cannot write cassette {}: {e}", path.display()))
}

/// Wraps a provider and records every answer into a cassette file.
#[derive(Debug)]
pub struct Recorder {
    inner: Arc<dyn ModelProvider>,
    file: Arc<CassetteFile>,
}

/// The cassette being recorded and the file it is written to after each answer.
#[derive(Debug)]
struct CassetteFile {
    path: PathBuf,
    cassette: Mutex<Cassette>,
}

impl CassetteFile {
    /// Adds to the cassette with `add` and writes the whole of it.
    fn record(&self, add: impl FnOnce(&mut Cassette)) -> Result<(), String> {
        let snapshot = {
            let mut c = self.cassette.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            add(&mut c);
            c.clone()
        };
        save(&snapshot, &self.path)
    }
}

impl Recorder {
    /// Records `inner`'s answers into `path` (starting a new cassette).
    pub fn new(inner: Arc<dyn ModelProvider>, path: PathBuf) -> Self {
        let cassette = Mutex::new(Cassette { format: FORMAT, ..Cassette::default() });
        Recorder { inner, file: Arc::new(CassetteFile { path, cassette }) }
    }

    /// `tools`, with every answer recorded into this recorder's cassette as the model
    /// reads it: bounded, and with `redactor`'s secrets taken out.
    pub fn tools(&self, tools: Arc<dyn ToolHost>, redactor: Arc<dyn Redact>) -> Arc<dyn ToolHost> {
        Arc::new(ToolRecorder { inner: tools, redactor, file: Arc::clone(&self.file) })
    }
}

/// The user's tools, recorded into a cassette (see [`Recorder::tools`]).
#[derive(Debug)]
struct ToolRecorder {
    inner: Arc<dyn ToolHost>,
    redactor: Arc<dyn Redact>,
    file: Arc<CassetteFile>,
}

/// One attempt's tools, recorded.
#[derive(Debug)]
struct RecordedSession {
    inner: Box<dyn ToolSession>,
    redactor: Arc<dyn Redact>,
    file: Arc<CassetteFile>,
}

impl ToolHost for ToolRecorder {
    fn open<'a>(
        &'a self,
        tools: &'a [Arc<OwnTool>],
        workspace: &'a Path,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Box<dyn ToolSession>> {
        Box::pin(async move {
            let inner = self.inner.open(tools, workspace, cancel).await;
            let listed: Vec<ListedTool> = inner
                .listed()
                .iter()
                .map(|(name, l)| ListedTool {
                    name: name.clone(),
                    description: l.description.clone(),
                    schema: l.schema.clone(),
                })
                .collect();
            if !listed.is_empty() {
                // A cassette that cannot be written fails the recording of the next model
                // answer, which says why.
                let _ = self.file.record(|c| {
                    for tool in listed {
                        if !c.listed.iter().any(|t| t.name == tool.name) {
                            c.listed.push(tool);
                        }
                    }
                });
            }
            let session = RecordedSession {
                inner,
                redactor: Arc::clone(&self.redactor),
                file: Arc::clone(&self.file),
            };
            Box::new(session) as Box<dyn ToolSession>
        })
    }
}

impl ToolSession for RecordedSession {
    fn listed(&self) -> &BTreeMap<String, Listed> {
        self.inner.listed()
    }

    fn problems(&self) -> &[String] {
        self.inner.problems()
    }

    fn call<'a>(
        &'a self,
        call: OwnCall<'a>,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            let (level_id, tool, arguments) =
                (call.level_id.to_owned(), call.tool.name.clone(), call.arguments.clone());
            let mut outcome = self.inner.call(call, cancel).await;
            outcome.content = bounded_result(outcome.content);
            self.redactor.redact_in_place(&mut outcome.content);
            let entry = ToolEntry {
                level_id,
                tool,
                arguments,
                content: outcome.content.clone(),
                is_error: outcome.is_error,
            };
            // The call was made and its result stands; a cassette that cannot be written
            // fails the recording of the next model answer, which says why.
            let _ = self.file.record(|c| c.tools.push(entry));
            outcome
        })
    }
}

impl ModelProvider for Recorder {
    fn call<'a>(
        &'a self,
        request: &'a ModelRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let result = self.inner.call(request, cancel).await;
            let entry = match &result {
                Ok(reply) => Entry::of(request, reply),
                Err(ModelError::Failed { provider, message, refused }) => {
                    Entry::failed(request, provider, message, *refused)
                }
                // A cancel or an outage is no answer: the call is made again later.
                Err(_) => return result,
            };
            self.file.record(|c| c.entries.push(entry)).map_err(|message| ModelError::Failed {
                provider: "cassette".to_owned(),
                message,
                refused: false,
            })?;
            result
        })
    }

    fn worst_case_cost_usd(&self, request: &ModelRequest) -> f64 {
        self.inner.worst_case_cost_usd(request)
    }

    fn reaches_out(&self, request: &ModelRequest) -> bool {
        self.inner.reaches_out(request)
    }
}

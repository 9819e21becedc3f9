//! Cassette files: reading one (a regular file of at most `CASSETTE_BYTES_MAX` bytes),
//! writing one atomically (a temporary file renamed over the old one), and [`Recorder`],
//! which wraps a provider and writes every answer it gives into a cassette file as it
//! comes. The cassette format and the replaying provider are the engine's
//! (`baton_engine::cassette`); the files are this crate's.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use baton_engine::cancel::CancelToken;
use baton_engine::cassette::{Cassette, Entry, FORMAT};
use baton_engine::limits;
use baton_engine::model::{BoxFuture, ModelError, ModelProvider, ModelReply, ModelRequest};

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
    path: PathBuf,
    cassette: Mutex<Cassette>,
}

impl Recorder {
    /// Records `inner`'s answers into `path` (starting a new cassette).
    pub fn new(inner: Arc<dyn ModelProvider>, path: PathBuf) -> Self {
        Recorder {
            inner,
            path,
            cassette: Mutex::new(Cassette { format: FORMAT, ..Cassette::default() }),
        }
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
            let snapshot = {
                let mut c = self.cassette.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                c.entries.push(entry);
                c.clone()
            };
            save(&snapshot, &self.path).map_err(|message| ModelError::Failed {
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

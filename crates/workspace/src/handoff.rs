//! The hand-off of workspaces between hosts: every snapshot a workspace takes is pushed, as
//! a git bundle, to an object store speaking the S3 API, so that a process on another host
//! (its own `--data-dir`) that takes the run over fetches the snapshot it goes on from.
//!
//! Objects are kept per run: `<prefix>/runs/<run_id>/<commit>.bundle`. A bundle holds
//! the snapshot's commit and what it needs that the process had not pushed before (the
//! first push of a process holds the whole history; later ones only what is new since the
//! last, which they name as a prerequisite). A fetch reads a bundle's prerequisites from
//! its header and fetches those it lacks first, from the same run's objects.
//!
//! This is the one owner of the object store: the client (`object_store`, its HTTP under
//! a runtime of its own, so that the workspace's blocking calls can wait on it from any
//! thread), its limits (a deadline on every operation, bounded retries, a cap on the size
//! of what is read) and the names of its objects. Credentials come from the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`) and are never written to a message.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::StreamExt as _;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt as _, PutPayload, RetryConfig,
};

/// The largest bundle fetched: a workspace's history past it is refused, not read.
pub(crate) const BUNDLE_BYTES_MAX: u64 = 512 * 1024 * 1024;

/// How many prerequisites deep a fetch follows (one per process that pushed the run).
pub(crate) const CHAIN_DEPTH_MAX: usize = 1_000;

/// The most objects one run's removal deletes.
const RUN_OBJECTS_MAX: usize = 100_000;

/// A workspace hand-off store: an S3 bucket and a prefix in it.
#[derive(Debug)]
pub struct HandOff {
    store: Arc<dyn ObjectStore>,
    /// `s3://bucket/prefix`, as messages name it (no credential is ever part of it).
    shown: String,
    prefix: String,
    timeout: Duration,
}

/// Why a hand-off operation failed.
#[derive(Debug)]
pub(crate) enum HandOffError {
    /// The object is not in the store.
    Missing(String),
    /// Anything else: the store did not answer, refused, or gave something unreadable.
    Failed(String),
}

impl HandOff {
    /// The store `url` names (`s3://BUCKET[/PREFIX]`), credentials and endpoint from the
    /// environment, every operation bounded by `timeout`.
    pub fn from_url(url: &str, timeout: Duration) -> Result<HandOff, String> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| {
            format!(
                "--object-store {url:?} is not an S3 URL; write s3://BUCKET or s3://BUCKET/PREFIX"
            )
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/').to_owned();
        let plain = |s: &str| {
            s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
        };
        if bucket.is_empty() || !plain(bucket) || bucket.contains('/') {
            return Err(format!(
                "--object-store {url:?} names no bucket; write s3://BUCKET or s3://BUCKET/PREFIX"
            ));
        }
        if !plain(&prefix)
            || !prefix.is_empty()
                && prefix.split('/').any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(format!(
                "--object-store {url:?}: the prefix {prefix:?} is not a plain path; use letters, digits, '-', '_', '.' and '/' between names"
            ));
        }
        if timeout.is_zero() {
            return Err("--object-store-timeout-s must be at least 1".to_owned());
        }
        // Its HTTPS, when the endpoint is one, uses the process's TLS provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Set over what the environment says (`AWS_ALLOW_HTTP` and the like stay).
        let seconds = |d: Duration| format!("{}s", d.as_secs().max(1));
        let connect = timeout.min(Duration::from_secs(10));
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: 3,
            retry_timeout: timeout,
        };
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), seconds(timeout))
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                seconds(connect),
            )
            .with_retry(retry)
            .build()
            .map_err(|e| format!("--object-store {url:?}: {e}"))?;
        Ok(HandOff {
            store: Arc::new(store),
            shown: format!("s3://{bucket}/{prefix}"),
            prefix,
            timeout,
        })
    }

    /// The store as messages name it.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Where a run's objects live.
    fn run_prefix(&self, run_id: &str) -> ObjectPath {
        let mut parts: Vec<&str> = self.prefix.split('/').filter(|p| !p.is_empty()).collect();
        parts.extend(["runs", run_id]);
        ObjectPath::from_iter(parts)
    }

    /// The object that holds a run's snapshot `commit`.
    fn bundle_path(&self, run_id: &str, commit: &str) -> ObjectPath {
        self.run_prefix(run_id).join(format!("{commit}.bundle"))
    }

    /// Where a run's objects (and `name` among them) are, as messages name it.
    fn shown_in_run(&self, run_id: &str, name: &str) -> String {
        format!("{}/runs/{run_id}/{name}", self.shown.trim_end_matches('/'))
    }

    /// Stores the bundle of a run's snapshot `commit`.
    pub(crate) fn put(&self, run_id: &str, commit: &str, bundle: Vec<u8>) -> Result<(), String> {
        let store = Arc::clone(&self.store);
        let path = self.bundle_path(run_id, commit);
        let shown = self.shown_in_run(run_id, &format!("{commit}.bundle"));
        self.wait(async move {
            store
                .put(&path, PutPayload::from(bundle))
                .await
                .map(|_| ())
                .map_err(|e| format!("cannot push the snapshot to {shown}: {e}"))
        })
    }

    /// The bundle of a run's snapshot `commit`.
    pub(crate) fn get(&self, run_id: &str, commit: &str) -> Result<Vec<u8>, HandOffError> {
        let store = Arc::clone(&self.store);
        let path = self.bundle_path(run_id, commit);
        let shown = self.shown_in_run(run_id, &format!("{commit}.bundle"));
        let got = self.wait(async move {
            let got = match store.get(&path).await {
                Ok(got) => got,
                Err(object_store::Error::NotFound { .. }) => {
                    return Ok(Err(HandOffError::Missing(format!("{shown} is not in the store"))));
                }
                Err(e) => return Err(format!("cannot fetch {shown}: {e}")),
            };
            if got.meta.size > BUNDLE_BYTES_MAX {
                return Err(format!(
                    "{shown} holds {} bytes, more than the {BUNDLE_BYTES_MAX} a hand-off reads",
                    got.meta.size
                ));
            }
            let bytes = got.bytes().await.map_err(|e| format!("cannot read {shown}: {e}"))?;
            Ok(Ok(bytes.to_vec()))
        });
        match got {
            Ok(inner) => inner,
            Err(message) => Err(HandOffError::Failed(message)),
        }
    }

    /// Removes every object of a run; how many it removed.
    pub async fn remove_run(&self, run_id: &str) -> Result<usize, String> {
        let store = Arc::clone(&self.store);
        let prefix = self.run_prefix(run_id);
        let shown = self.shown_in_run(run_id, "");
        let timeout = self.timeout;
        let task = runtime().spawn(async move {
            let listed = async {
                let mut paths = Vec::new();
                let mut listing = store.list(Some(&prefix));
                while let Some(meta) = listing.next().await {
                    let meta = meta.map_err(|e| format!("cannot list {shown}: {e}"))?;
                    if paths.len() >= RUN_OBJECTS_MAX {
                        return Err(format!(
                            "{shown} holds more than {RUN_OBJECTS_MAX} objects; remove them with the store's own tools"
                        ));
                    }
                    paths.push(meta.location);
                }
                Ok(paths)
            };
            let paths = tokio::time::timeout(timeout, listed)
                .await
                .map_err(|_| format!("listing {shown} took longer than {} s", timeout.as_secs()))??;
            for path in &paths {
                let deleted = tokio::time::timeout(timeout, store.delete(path)).await;
                match deleted {
                    Ok(Ok(()) | Err(object_store::Error::NotFound { .. })) => {}
                    Ok(Err(e)) => return Err(format!("cannot remove {path}: {e}")),
                    Err(_) => {
                        return Err(format!(
                            "removing {path} took longer than {} s",
                            timeout.as_secs()
                        ));
                    }
                }
            }
            Ok(paths.len())
        });
        task.await.map_err(|e| format!("the removal from {} failed: {e}", self.shown))?
    }

    /// Runs `work` on the hand-off's runtime and waits for it, at most the timeout (from
    /// any thread: the caller blocks, the runtime does the I/O).
    fn wait<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
    ) -> Result<T, String> {
        let timeout = self.timeout;
        let (tell, told) = std::sync::mpsc::sync_channel(1);
        let shown = self.shown.clone();
        runtime().spawn(async move {
            let result = tokio::time::timeout(timeout, work).await.unwrap_or_else(|_| {
                Err(format!(
                    "the object store {shown} did not answer within {} s",
                    timeout.as_secs()
                ))
            });
            let _ = tell.send(result);
        });
        // The task itself is bounded; a little more here covers its start.
        told.recv_timeout(timeout + Duration::from_secs(5)).unwrap_or_else(|_| {
            Err(format!(
                "the object store {} did not answer within {} s",
                self.shown,
                timeout.as_secs()
            ))
        })
    }
}

/// The runtime every hand-off's I/O runs on: one thread, made at first use and never
/// dropped (a runtime may not be dropped inside another's tasks).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("baton-handoff")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the hand-off runtime: {e}"))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

    #[test]
    fn urls_name_a_bucket_and_a_plain_prefix() {
        for bad in ["bucket", "s3://", "s3:///x", "s3://b/../x", "s3://b/a//c", "s3://b c/x"] {
            assert!(HandOff::from_url(bad, TIMEOUT_DEFAULT).is_err(), "{bad} was accepted");
        }
        let ok = HandOff::from_url("s3://bucket/a/b/", TIMEOUT_DEFAULT).unwrap();
        assert_eq!(ok.shown(), "s3://bucket/a/b");
        assert_eq!(ok.bundle_path("r1", "abc").as_ref(), "a/b/runs/r1/abc.bundle");
        let bare = HandOff::from_url("s3://bucket", TIMEOUT_DEFAULT).unwrap();
        assert_eq!(bare.bundle_path("r1", "abc").as_ref(), "runs/r1/abc.bundle");
    }
}

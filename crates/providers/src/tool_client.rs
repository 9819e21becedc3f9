//! The client the user's HTTP tools send their requests with: the egress guard's, and a
//! redirect followed only to the host the request was sent to.

use std::sync::Arc;

use crate::egress::{EgressPolicy, REDIRECTS_MAX};

/// A client that calls only what `policy` allows, like [`EgressPolicy::client`]'s,
/// that follows a redirect only to the host the request was sent to: an HTTP tool's,
/// whose requests may carry a secret meant for that host alone. No request may take
/// longer than `timeout`.
pub fn same_host_client(
    policy: &EgressPolicy,
    timeout: std::time::Duration,
) -> Result<reqwest::Client, String> {
    crate::client::install_crypto();
    let checked = Arc::new(policy.clone());
    policy
        .client(reqwest::Client::builder())
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            let first = attempt.previous().first().and_then(|u| u.host_str().map(str::to_owned));
            if attempt.previous().len() >= REDIRECTS_MAX {
                let error = format!("more than {REDIRECTS_MAX} redirects");
                return attempt.error(error);
            }
            if first.as_deref() != attempt.url().host_str() {
                let error = format!(
                    "a redirect to {} was not followed: a tool's request stays on its host",
                    attempt.url()
                );
                return attempt.error(error);
            }
            match checked.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(why) => attempt.error(format!("a redirect was refused: {why}")),
            }
        }))
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .map_err(|e| format!("cannot build the HTTP tools' client: {e}"))
}

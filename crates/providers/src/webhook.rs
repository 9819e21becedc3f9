//! Sending one webhook delivery, signed as the Standard Webhooks specification says: the
//! headers `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature` — a
//! space-separated list of `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body` under
//! each secret that signs (after a rotation, the new one and the old one). A secret is
//! `whsec_` and the base64 of its key bytes. The URL goes through the egress guard: checked
//! before the request, every name resolved once and every address checked, redirects not
//! followed past the guard.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{KeyInit, Mac};

use crate::egress::EgressPolicy;

pub use reqwest::{Client, Url};

/// The prefix of a signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// Most bytes of a receiver's answer read (it is only looked at for the status).
pub const ANSWER_BYTES_MAX: usize = 4 * 1024;

/// A new signing secret: `whsec_` and the base64 of 32 random bytes.
pub fn new_secret() -> String {
    let mut key = Vec::with_capacity(32);
    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The `v1,` signature of `body` under `secret`, or why the secret is not one.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> Result<String, String> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    let key = STANDARD
        .decode(encoded)
        .map_err(|e| format!("the signing secret is not `whsec_` and base64: {e}"))?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key)
        .map_err(|e| format!("the signing secret does not make a key: {e}"))?;
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    Ok(format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())))
}

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The receiver answered with this status.
    Answered(u16),
    /// No answer: refused by the egress guard, unreachable, timed out; why.
    Failed(String),
}

/// A client for webhooks: the egress guard's, with a timeout per request.
pub fn client(policy: &EgressPolicy, timeout: Duration) -> Result<reqwest::Client, String> {
    crate::client::install_crypto();
    policy
        .client(reqwest::Client::builder())
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .map_err(|e| format!("cannot build the webhook client: {e}"))
}

/// Sends `body` to `url` as delivery `id`, signed with every secret in `secrets`.
pub async fn send(
    client: &reqwest::Client,
    policy: &EgressPolicy,
    url: &str,
    id: &str,
    timestamp: i64,
    body: &str,
    secrets: &[&str],
) -> Sent {
    let parsed = match reqwest::Url::parse(url) {
        Ok(u) => u,
        Err(e) => return Sent::Failed(format!("{url}: not a URL: {e}")),
    };
    if let Err(why) = policy.check_url(&parsed) {
        return Sent::Failed(why);
    }
    let mut signatures = Vec::with_capacity(secrets.len());
    for secret in secrets {
        match sign(secret, id, timestamp, body) {
            Ok(s) => signatures.push(s),
            Err(why) => return Sent::Failed(why),
        }
    }
    let request = client
        .post(parsed)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signatures.join(" "))
        .body(body.to_owned());
    match request.send().await {
        Ok(mut answer) => {
            let status = answer.status().as_u16();
            // Read a little of the answer so the connection is left clean, no more.
            let mut read = 0;
            while read < ANSWER_BYTES_MAX {
                match answer.chunk().await {
                    Ok(Some(chunk)) => read += chunk.len(),
                    Ok(None) | Err(_) => break,
                }
            }
            Sent::Answered(status)
        }
        Err(e) => Sent::Failed(chain(&e)),
    }
}

/// An error with its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_specifications_example_signature_is_reproduced() {
        // The example of the Standard Webhooks specification.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = r#"{"test": 2432232314}"#;
        let signed = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body)
            .expect("a valid secret");
        assert_eq!(signed, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_new_secret_is_random_and_signs() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX) && a.len() == SECRET_PREFIX.len() + 44, "{a}");
        assert!(sign(&a, "msg", 1, "{}").is_ok());
        assert!(sign("whsec_%%%", "msg", 1, "{}").is_err());
    }
}

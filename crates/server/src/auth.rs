//! Who is calling: bearer tokens (or the session cookie the UI gets from one), each scoped to
//! one tenant with one role; and the checks of `Host` and `Origin` that keep pages of other
//! sites and rebound DNS names away from a server on a loopback address.
//!
//! A token is `baton_` and 64 hex digits of randomness; the store keeps its SHA-256. A
//! token looked up is remembered for [`TOKEN_CACHE_FOR`], so a revocation takes effect
//! within that time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method, header};
use baton_app::{Role, TokenRecord, TokenStore};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::problem::Problem;

/// How long a looked-up token is believed without asking the store again.
pub const TOKEN_CACHE_FOR: Duration = Duration::from_secs(2);
/// The cookie the web UI authenticates with.
pub const SESSION_COOKIE: &str = "baton_session";
/// The longest token name (`--name`).
pub const NAME_CHARS_MAX: usize = 128;

/// A new token: the secret to hand to its holder once, and the record to store.
pub fn new_token(
    tenant: &str,
    role: Role,
    name: &str,
    now: DateTime<Utc>,
) -> (String, TokenRecord) {
    let secret =
        format!("baton_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let id = format!("tok_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let record = TokenRecord {
        id,
        sha256: digest(&secret),
        tenant: tenant.to_owned(),
        role,
        name: name.to_owned(),
        created_at: now,
        revoked_at: None,
    };
    (secret, record)
}

/// The SHA-256 of a token, lowercase hex.
pub fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Who made a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    /// The tenant whose runs it sees and starts (`None`: runs of no tenant, with --no-auth).
    pub tenant: Option<String>,
    pub role: Role,
    /// The principal decisions are recorded by.
    pub name: String,
    /// The token's id, for the per-token limits (`local` without auth).
    pub token_id: String,
}

impl Caller {
    /// The caller of a server without auth.
    pub fn local() -> Self {
        Caller {
            tenant: None,
            role: Role::Admin,
            name: "local".to_owned(),
            token_id: "local".to_owned(),
        }
    }

    /// Refuses a caller whose role is below `role`.
    pub fn require(&self, role: Role) -> Result<(), Problem> {
        if self.role >= role {
            return Ok(());
        }
        Err(Problem::forbidden(format!(
            "token {} has role {}, and this needs {}; create one with `baton token create --tenant {} --role {}`",
            self.token_id,
            self.role.as_str(),
            role.as_str(),
            self.tenant.as_deref().unwrap_or("TENANT"),
            role.as_str()
        )))
    }

    /// Whether a run of `tenant` is this caller's to see.
    pub fn sees(&self, tenant: Option<&str>) -> bool {
        self.tenant.as_deref() == tenant
    }
}

/// Finds callers from their tokens.
pub(crate) struct Tokens {
    store: Arc<dyn TokenStore>,
    seen: Mutex<HashMap<String, (Option<TokenRecord>, Instant)>>,
}

impl Tokens {
    pub(crate) fn new(store: Arc<dyn TokenStore>) -> Self {
        Tokens { store, seen: Mutex::default() }
    }

    /// The caller a request's bearer token or session cookie names.
    pub(crate) async fn caller(&self, headers: &HeaderMap) -> Result<Caller, Problem> {
        let Some(token) = presented(headers) else {
            return Err(Problem::unauthorized(
                "no token: send `Authorization: Bearer TOKEN` (make one with `baton token create --tenant TENANT`)",
            ));
        };
        let hash = digest(&token);
        let cached = {
            let seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            seen.get(&hash).filter(|(_, at)| at.elapsed() < TOKEN_CACHE_FOR).map(|(t, _)| t.clone())
        };
        let record = match cached {
            Some(r) => r,
            None => {
                let found = self
                    .store
                    .token_by_hash(&hash)
                    .await
                    .map_err(|e| Problem::internal(e.to_string()))?;
                let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if seen.len() > 10_000 {
                    seen.retain(|_, (_, at)| at.elapsed() < TOKEN_CACHE_FOR);
                }
                seen.insert(hash, (found.clone(), Instant::now()));
                found
            }
        };
        match record {
            Some(t) if t.revoked_at.is_none() => {
                Ok(Caller { tenant: Some(t.tenant), role: t.role, name: t.name, token_id: t.id })
            }
            Some(t) => {
                Err(Problem::unauthorized(format!("token {} was revoked; ask for a new one", t.id)))
            }
            None => Err(Problem::unauthorized("the token is not known here")),
        }
    }
}

impl Tokens {
    /// Which of the tokens `ids` are revoked (ids the store does not know count as revoked).
    pub(crate) async fn revoked_among(&self, ids: &[String]) -> Result<Vec<String>, String> {
        let all = self.store.tokens(None).await.map_err(|e| e.to_string())?;
        let live: std::collections::HashSet<&str> =
            all.iter().filter(|t| t.revoked_at.is_none()).map(|t| t.id.as_str()).collect();
        Ok(ids.iter().filter(|id| *id != "local" && !live.contains(id.as_str())).cloned().collect())
    }
}

/// The token a request carries: its bearer token, else its session cookie.
fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if let Some(t) = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")) {
            return Some(t.trim().to_owned());
        }
    }
    for cookies in headers.get_all(header::COOKIE) {
        let Ok(cookies) = cookies.to_str() else { continue };
        for pair in cookies.split(';') {
            if let Some((k, v)) = pair.trim().split_once('=')
                && k == SESSION_COOKIE
            {
                return Some(v.to_owned());
            }
        }
    }
    None
}

/// The hosts a request may name: on a loopback address, the loopback names with the port
/// (so a DNS name rebound to 127.0.0.1 is refused); on another, any (unless `--host`
/// names some); and always those given.
#[derive(Clone, Debug)]
pub(crate) struct Hosts {
    allowed: Vec<String>,
    any: bool,
}

impl Hosts {
    pub(crate) fn new(bound: std::net::SocketAddr, given: &[String]) -> Self {
        let port = bound.port();
        let mut allowed: Vec<String> = given.iter().map(|h| h.to_ascii_lowercase()).collect();
        let any = !bound.ip().is_loopback() && given.is_empty();
        if bound.ip().is_loopback() {
            for name in ["127.0.0.1", "localhost", "[::1]"] {
                allowed.push(format!("{name}:{port}"));
            }
        } else {
            allowed.push(bound.to_string());
        }
        Hosts { allowed, any }
    }

    /// Refuses a request whose `Host` is not one of this server's names, or that comes
    /// from a page of another origin (its `Origin` is not this host's).
    pub(crate) fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), Problem> {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        if !self.any && !self.allowed.contains(&host) {
            return Err(Problem::forbidden(format!(
                "Host {host:?} is not a name of this server (it answers to {}); pass --host NAME:PORT to `baton serve` to add one",
                self.allowed.join(", ")
            )));
        }
        let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
        if let Some(origin) = origin {
            let same = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|o| o.eq_ignore_ascii_case(&host));
            if !same {
                return Err(Problem::forbidden(format!(
                    "requests from pages of {origin:?} are refused: only this server's own pages may call it"
                )));
            }
        } else if method != Method::GET && method != Method::HEAD {
            // A browser names the origin of every state-changing request; one that says
            // it came from another site is refused even without an Origin.
            let site = headers.get("sec-fetch-site").and_then(|s| s.to_str().ok());
            if site.is_some_and(|s| s != "same-origin" && s != "none") {
                return Err(Problem::forbidden("requests from pages of other sites are refused"));
            }
        }
        Ok(())
    }
}

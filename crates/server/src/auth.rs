//! Who is calling: bearer tokens (or the session cookie the UI gets from one), each scoped to
//! one tenant with one role; and the checks of `Host` and `Origin` that keep pages of other
//! sites and rebound DNS names away from a server on a loopback address.
//!
//! A token is `baton_` and 64 hex digits of randomness; the store keeps its SHA-256. A
//! token looked up is remembered for [`TOKEN_CACHE_FOR`], so a revocation takes effect
//! within that time.
//!
//! The browser's cookie never holds a token: it holds a session id (`bs_` and 64 hex
//! digits), traded for a bearer token at `POST /session`. The store keeps the id's SHA-256
//! and the token's; a session ends when it is signed out of, when its token is revoked,
//! `session_max_age` after it was opened, `session_idle` after it was last used, or when
//! its token opens more than `sessions_per_token` (the oldest goes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method, header};
use baton_app::{Role, SessionRecord, TokenRecord, TokenStore};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::problem::Problem;

/// How long a looked-up token is believed without asking the store again.
pub const TOKEN_CACHE_FOR: Duration = Duration::from_secs(2);
/// The cookie the web UI authenticates with (over plain HTTP).
pub const SESSION_COOKIE: &str = "baton_session";
/// The cookie behind TLS: a `__Host-` cookie is sent only over HTTPS, to this host, for `/`.
pub const SECURE_SESSION_COOKIE: &str = "__Host-baton_session";
/// How stale a session's last-use time may get before a request writes it again (or a
/// quarter of the idle time, if that is shorter).
const SESSION_TOUCH_EVERY: Duration = Duration::from_secs(60);
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
    /// The hash of the browser session the request came through, if any.
    pub session: Option<String>,
}

impl Caller {
    /// The caller of a server without auth.
    pub fn local() -> Self {
        Caller {
            tenant: None,
            role: Role::Admin,
            name: "local".to_owned(),
            token_id: "local".to_owned(),
            session: None,
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

/// How browser sessions are kept.
#[derive(Clone, Debug)]
pub(crate) struct SessionRules {
    /// The cookie's name ([`SESSION_COOKIE`], or [`SECURE_SESSION_COOKIE`] behind TLS).
    pub(crate) cookie: &'static str,
    /// Whether the cookie is `Secure` (the server is behind TLS).
    pub(crate) secure: bool,
    pub(crate) max_age: Duration,
    pub(crate) idle: Duration,
    pub(crate) per_token: usize,
}

/// Finds callers from their tokens and sessions.
pub(crate) struct Tokens {
    store: Arc<dyn TokenStore>,
    seen: Mutex<HashMap<String, (Option<TokenRecord>, Instant)>>,
    pub(crate) sessions: SessionRules,
}

/// What a request presents.
enum Presented {
    Bearer(String),
    Session(String),
}

impl Tokens {
    pub(crate) fn new(store: Arc<dyn TokenStore>, sessions: SessionRules) -> Self {
        Tokens { store, seen: Mutex::default(), sessions }
    }

    /// The caller a request's bearer token or session cookie names.
    pub(crate) async fn caller(&self, headers: &HeaderMap) -> Result<Caller, Problem> {
        match self.presented(headers) {
            None => Err(Problem::unauthorized(
                "no token: send `Authorization: Bearer TOKEN` (make one with `baton token create --tenant TENANT`)",
            )),
            Some(Presented::Bearer(token)) => self.by_hash(&digest(&token)).await,
            Some(Presented::Session(id)) => {
                let hash = digest(&id);
                let session = self.live_session(&hash, true).await?;
                let mut caller = self.by_hash(&session.token_sha256).await.map_err(|_| {
                    Problem::unauthorized(
                        "the session's token was revoked; sign in again with a valid token",
                    )
                })?;
                caller.session = Some(hash);
                Ok(caller)
            }
        }
    }

    /// The caller the token whose hash this is names.
    async fn by_hash(&self, hash: &str) -> Result<Caller, Problem> {
        let cached = {
            let seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            seen.get(hash).filter(|(_, at)| at.elapsed() < TOKEN_CACHE_FOR).map(|(t, _)| t.clone())
        };
        let record = match cached {
            Some(r) => r,
            None => {
                let found = self
                    .store
                    .token_by_hash(hash)
                    .await
                    .map_err(|e| Problem::internal(e.to_string()))?;
                let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if seen.len() > 10_000 {
                    seen.retain(|_, (_, at)| at.elapsed() < TOKEN_CACHE_FOR);
                }
                seen.insert(hash.to_owned(), (found.clone(), Instant::now()));
                found
            }
        };
        match record {
            Some(t) if t.revoked_at.is_none() => Ok(Caller {
                tenant: Some(t.tenant),
                role: t.role,
                name: t.name,
                token_id: t.id,
                session: None,
            }),
            Some(t) => {
                Err(Problem::unauthorized(format!("token {} was revoked; ask for a new one", t.id)))
            }
            None => Err(Problem::unauthorized("the token is not known here")),
        }
    }

    /// The session whose hash this is, if it is live; else why not. A request's look
    /// (`used`) writes its last use, at most once a minute; the streams' watcher only looks.
    async fn live_session(&self, hash: &str, used: bool) -> Result<SessionRecord, Problem> {
        let found =
            self.store.session_by_hash(hash).await.map_err(|e| Problem::internal(e.to_string()))?;
        let now = Utc::now();
        let session = match found {
            None => return Err(Problem::unauthorized("the session is not known here; sign in")),
            Some(s) if s.revoked_at.is_some() => {
                return Err(Problem::unauthorized("the session was signed out of; sign in"));
            }
            Some(s) => s,
        };
        let age = now.signed_duration_since(session.created_at).to_std().unwrap_or_default();
        let idle = now.signed_duration_since(session.seen_at).to_std().unwrap_or_default();
        if age > self.sessions.max_age || idle > self.sessions.idle {
            return Err(Problem::unauthorized("the session expired; sign in again"));
        }
        if used && idle > SESSION_TOUCH_EVERY.min(self.sessions.idle / 4) {
            self.store
                .touch_session(hash, now)
                .await
                .map_err(|e| Problem::internal(e.to_string()))?;
        }
        Ok(session)
    }

    /// Opens a session for the token `bearer` names (already checked to be `caller`'s):
    /// the session id for the cookie, and the hashes of the token's sessions it pushed out.
    pub(crate) async fn open_session(
        &self,
        bearer: &str,
        caller: &Caller,
    ) -> Result<(String, Vec<String>), Problem> {
        let id = format!("bs_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let now = Utc::now();
        let record = SessionRecord {
            sha256: digest(&id),
            token_sha256: digest(bearer),
            token_id: caller.token_id.clone(),
            created_at: now,
            seen_at: now,
            revoked_at: None,
        };
        let forget = now - chrono::TimeDelta::from_std(self.sessions.max_age).unwrap_or_default();
        let pushed = self
            .store
            .put_session(&record, self.sessions.per_token, forget)
            .await
            .map_err(|e| Problem::internal(e.to_string()))?;
        Ok((id, pushed))
    }

    /// Signs out of the session the request's cookie names; its hash, if there was one.
    pub(crate) async fn close_session(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<String>, Problem> {
        let Some(id) = self.cookie(headers) else { return Ok(None) };
        let hash = digest(&id);
        self.store
            .revoke_session(&hash, Utc::now())
            .await
            .map_err(|e| Problem::internal(e.to_string()))?;
        Ok(Some(hash))
    }

    /// Whether the session whose hash this is has ended (signed out, expired, unknown).
    pub(crate) async fn session_ended(&self, hash: &str) -> bool {
        match self.live_session(hash, false).await {
            Ok(_) => false,
            Err(p) => p.status == 401,
        }
    }

    /// Which of the tokens `ids` are revoked (ids the store does not know count as revoked).
    pub(crate) async fn revoked_among(&self, ids: &[String]) -> Result<Vec<String>, String> {
        let all = self.store.tokens(None).await.map_err(|e| e.to_string())?;
        let live: std::collections::HashSet<&str> =
            all.iter().filter(|t| t.revoked_at.is_none()).map(|t| t.id.as_str()).collect();
        Ok(ids.iter().filter(|id| *id != "local" && !live.contains(id.as_str())).cloned().collect())
    }

    /// The token a request carries: its bearer token, else its session cookie's id.
    fn presented(&self, headers: &HeaderMap) -> Option<Presented> {
        if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            let v = v.trim();
            if let Some(t) = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")) {
                return Some(Presented::Bearer(t.trim().to_owned()));
            }
        }
        self.cookie(headers).map(Presented::Session)
    }

    /// The session id in the request's cookie.
    fn cookie(&self, headers: &HeaderMap) -> Option<String> {
        for cookies in headers.get_all(header::COOKIE) {
            let Ok(cookies) = cookies.to_str() else { continue };
            for pair in cookies.split(';') {
                if let Some((k, v)) = pair.trim().split_once('=')
                    && k == self.sessions.cookie
                {
                    return Some(v.to_owned());
                }
            }
        }
        None
    }
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

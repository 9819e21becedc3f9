//! Bearer tokens of the server: who may call it, for which tenant, in which role.
//!
//! A token is shown once, when it is made; stores keep only its SHA-256 (a token is 32
//! random bytes, so a fast hash is enough, and a slow one would cap the request rate).
//! Every store that keeps runs keeps tokens beside them through [`TokenStore`].

use baton_engine::model::BoxFuture;
use baton_engine::store::Error;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// What a token may do, each tenant role including the ones before it. `Metrics` stands
/// apart, below them all: the server's own token for its metrics, of no tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads the server's metrics (`/metrics`, every tenant's figures) and nothing else:
    /// no run, no scenario, no tenant's anything.
    Metrics,
    /// Reads runs, events and scenarios.
    Viewer,
    /// Also starts runs, approves, answers and cancels.
    Operator,
    /// Also changes the tenant's scenario overrides.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Metrics => "metrics",
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "metrics" => Some(Role::Metrics),
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// A token as it is stored: never the token itself.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenRecord {
    /// The public name of the token (`tok_` and 12 hex digits), for listing and revoking.
    pub id: String,
    /// The SHA-256 of the token, lowercase hex.
    #[serde(skip)]
    pub sha256: String,
    pub tenant: String,
    pub role: Role,
    /// Who holds it: the principal decisions made with it are recorded by.
    pub name: String,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Where tokens are kept.
pub trait TokenStore: Send + Sync {
    /// Keeps a new token (its id and hash are unique).
    fn put_token<'a>(&'a self, token: &'a TokenRecord) -> BoxFuture<'a, Result<(), Error>>;
    /// The token whose hash this is, revoked or not.
    fn token_by_hash<'a>(
        &'a self,
        sha256: &'a str,
    ) -> BoxFuture<'a, Result<Option<TokenRecord>, Error>>;
    /// Every token, optionally of one tenant, oldest first.
    fn tokens<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<TokenRecord>, Error>>;
    /// Revokes a token at `at`; false when there is no such token or it was revoked before.
    fn revoke_token<'a>(
        &'a self,
        id: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// Keeps a new browser session; then revokes the oldest live sessions of its token past
    /// `per_token` (at the new one's time) and forgets every session made before
    /// `forget_before`. Returns the hashes of the sessions it revoked.
    fn put_session<'a>(
        &'a self,
        session: &'a SessionRecord,
        per_token: usize,
        forget_before: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, Error>>;
    /// The session whose hash this is, revoked or not.
    fn session_by_hash<'a>(
        &'a self,
        sha256: &'a str,
    ) -> BoxFuture<'a, Result<Option<SessionRecord>, Error>>;
    /// Marks a session used at `at` (its idle time starts again).
    fn touch_session<'a>(
        &'a self,
        sha256: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), Error>>;
    /// Revokes a session at `at`; false when there is no such session or it was revoked
    /// before.
    fn revoke_session<'a>(
        &'a self,
        sha256: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>>;
}

/// A browser session as it is stored: never its id, only the id's SHA-256, and the token
/// it was opened with (by hash, so a revoked token ends it).
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRecord {
    /// The SHA-256 of the session id, lowercase hex.
    pub sha256: String,
    /// The SHA-256 of the token it was opened with.
    pub token_sha256: String,
    /// That token's id, for the cap per token.
    pub token_id: String,
    pub created_at: DateTime<Utc>,
    /// When it was last used (at most a minute off: it is not written on every request).
    pub seen_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// The checks every [`TokenStore`] passes, on a store that holds no tokens yet.
pub mod conformance {
    use super::{Role, SessionRecord, TokenRecord, TokenStore};

    /// Tokens are kept by hash, found by it, listed per tenant and revoked once; a second
    /// token with the same id is refused.
    pub async fn run_all(store: &dyn TokenStore) {
        let at = chrono::Utc::now();
        let token = |id: &str, tenant: &str, hash: &str| TokenRecord {
            id: id.to_owned(),
            sha256: hash.to_owned(),
            tenant: tenant.to_owned(),
            role: Role::Operator,
            name: format!("{id}-holder"),
            created_at: at,
            revoked_at: None,
        };
        store.put_token(&token("tok_a", "acme", "aa")).await.expect("put a token");
        store.put_token(&token("tok_b", "other", "bb")).await.expect("put a token");
        assert!(store.put_token(&token("tok_a", "acme", "cc")).await.is_err(), "ids are unique");
        let found = store.token_by_hash("aa").await.expect("by hash").expect("found by hash");
        assert_eq!(
            (found.id.as_str(), found.role, found.name.as_str()),
            ("tok_a", Role::Operator, "tok_a-holder")
        );
        assert_eq!(store.token_by_hash("zz").await.expect("by hash"), None);
        let acme = store.tokens(Some("acme")).await.expect("list");
        assert_eq!(acme.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["tok_a"]);
        assert_eq!(store.tokens(None).await.expect("list").len(), 2);
        assert!(store.revoke_token("tok_a", at).await.expect("revoke"));
        assert!(!store.revoke_token("tok_a", at).await.expect("revoke"), "revoked once");
        assert!(!store.revoke_token("tok_nope", at).await.expect("revoke"));
        let revoked = store.token_by_hash("aa").await.expect("by hash").expect("kept");
        assert!(revoked.revoked_at.is_some());
        sessions(store).await;
    }

    /// Sessions are kept by hash, touched, revoked once, capped per token (the oldest go
    /// first) and forgotten once old.
    async fn sessions(store: &dyn TokenStore) {
        let t0 = chrono::Utc::now() - chrono::Duration::hours(1);
        let session = |hash: &str, token: &str, minutes: i64| {
            let at = t0 + chrono::Duration::minutes(minutes);
            SessionRecord {
                sha256: hash.to_owned(),
                token_sha256: format!("{token}-hash"),
                token_id: token.to_owned(),
                created_at: at,
                seen_at: at,
                revoked_at: None,
            }
        };
        let long_ago = t0 - chrono::Duration::days(1);
        for (i, hash) in ["s1", "s2"].iter().enumerate() {
            let revoked = store
                .put_session(&session(hash, "tok_b", i as i64), 2, long_ago)
                .await
                .expect("put a session");
            assert!(revoked.is_empty(), "{revoked:?}");
        }
        store.put_session(&session("o1", "tok_o", 0), 2, long_ago).await.expect("put");
        let revoked =
            store.put_session(&session("s3", "tok_b", 2), 2, long_ago).await.expect("put");
        assert_eq!(revoked, ["s1"], "past the cap, the token's oldest live session goes");
        let s1 = store.session_by_hash("s1").await.expect("by hash").expect("kept");
        assert!(s1.revoked_at.is_some());
        let o1 = store.session_by_hash("o1").await.expect("by hash").expect("kept");
        assert!(o1.revoked_at.is_none(), "another token's sessions are not counted");
        let later = t0 + chrono::Duration::minutes(30);
        store.touch_session("s2", later).await.expect("touch");
        let s2 = store.session_by_hash("s2").await.expect("by hash").expect("kept");
        assert_eq!(s2.seen_at.timestamp_millis(), later.timestamp_millis());
        assert_eq!((s2.token_id.as_str(), s2.token_sha256.as_str()), ("tok_b", "tok_b-hash"));
        assert!(store.revoke_session("s2", later).await.expect("revoke"));
        assert!(!store.revoke_session("s2", later).await.expect("revoke"), "revoked once");
        assert!(!store.revoke_session("nope", later).await.expect("revoke"));
        assert_eq!(store.session_by_hash("nope").await.expect("by hash"), None);
        // Sessions made before the forget time go when the next one is kept.
        let forget = t0 + chrono::Duration::minutes(1);
        store.put_session(&session("s4", "tok_b", 3), 8, forget).await.expect("put");
        assert_eq!(store.session_by_hash("s1").await.expect("by hash"), None);
        assert_eq!(store.session_by_hash("o1").await.expect("by hash"), None);
        assert!(store.session_by_hash("s2").await.expect("by hash").is_some());
    }
}

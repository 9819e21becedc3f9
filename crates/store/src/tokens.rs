//! Bearer tokens of the server: who may call it, for which tenant, in which role.
//!
//! A token is shown once, when it is made; stores keep only its SHA-256 (a token is 32
//! random bytes, so a fast hash is enough, and a slow one would cap the request rate).
//! Every store that keeps runs keeps tokens beside them through [`TokenStore`].

use baton_engine::model::BoxFuture;
use baton_engine::store::Error;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// What a token may do, each role including the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
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
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
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
}

/// The checks every [`TokenStore`] passes, on a store that holds no tokens yet.
pub mod conformance {
    use super::{Role, TokenRecord, TokenStore};

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
    }
}

//! Baton's application layer: what sits between the adapters (store, providers, jail,
//! workspaces, verifiers) and the surfaces (the CLI, the HTTP server, MCP, workers).
//!
//! An instance is opened from a [`Place`] ([`Baton::open`]); its use cases take typed
//! inputs and fail with an [`Error`] whose [`Kind`] every surface shows through one table
//! ([`Kind::surfaces`]). The surfaces parse, call and render: none of them assembles an
//! engine or decides a rule of a job on its own.
//!
//! Modules, lowest first (the layers of ARCHITECTURE.md): `error`; `place` (where runs
//! live, opening the store); `models`, `fixture`, `jail` and `serving` (what a job or a
//! serving process runs with); `scenarios`; `engines` (assembling engines); `replay`,
//! `forecast`, `listing` and `tenants` (what the store and the fixtures keep); `start`,
//! `runs`, `follow`, `waves`, `fixtures` and `upkeep` (the use cases); `instance` (an
//! opened instance).

pub mod engines;
pub mod error;
pub mod feed;
pub mod fixture;
pub mod fixtures;
pub mod follow;
pub mod forecast;
pub mod instance;
pub mod jail;
pub mod listing;
pub mod models;
pub mod place;
pub mod queues;
pub mod redact;
pub mod replay;
pub mod runs;
pub mod scenarios;
pub mod serving;
pub mod start;
pub mod tenants;
pub mod tool_probe;
pub mod upkeep;
pub mod waves;
pub mod webhooks;

/// The store's token and role types, for the surfaces that manage tokens.
pub use baton_store::webhooks::WebhookRecord;
pub use baton_store::{
    QueueStore, Role, SessionRecord, Store, TokenRecord, TokenStore, WebhookStore,
};
pub use error::{Error, Kind};
pub use instance::{Answers, Baton, Instance};
pub use place::Place;

//! The Baton scenario language: YAML model, loader, gate DSL, static checks and graph.
//!
//! A scenario is read in two stages. The raw stage ([`raw`]) mirrors the YAML with serde
//! structs that refuse unknown fields; the check stage ([`check`]) turns them into a
//! [`Scenario`] that cannot represent an invalid state: every edge points at a level,
//! every gate is compiled and typed, every template parsed, every rubric read. The
//! [`Registry`] loads a directory of scenarios, indexes intent routes and applies tenant
//! overrides. Nothing here does I/O beyond reading the files it is asked to load.

pub mod capped;
pub mod check;
pub mod de;
pub mod diag;
pub mod digest;
pub mod expr;
pub mod files;
pub mod graph;
pub mod limits;
pub mod model;
pub mod node;
pub mod raw;
pub mod registry;
pub mod rubric;
pub mod scalar;
pub mod schema;
pub mod source;
pub mod suggest;
pub mod template;

pub use diag::{Diagnostic, Diagnostics, Severity};
pub use model::{Level, LevelKind, Scenario, Texts};
pub use registry::{LoadError, Loaded, Registry, RegistryHandle};
pub use source::{Pos, SourceId, Sources};

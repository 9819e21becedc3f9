//! From a raw scenario to a checked [`Scenario`](crate::Scenario): every rule of the format.
//!
//! The checker keeps going after a problem so that one run of `baton validate` shows an
//! author everything wrong with a file. It returns a scenario only when it found no error.
//! Warnings (unreachable levels, levels that can fall through to the end) never stop it.

mod checker;
mod edges;
mod fan_out;
mod levels;
mod models;
mod prompts;
mod scenario;
mod tools;
mod verifiers;
mod waves;

pub use checker::is_id;
pub use levels::APPROVER_ROLE_DEFAULT;
pub use models::parse_model_pattern;
pub use scenario::{ATTEMPTS_PER_CONFLICT_DEFAULT, check};
pub use tools::{BUILT_IN_TOOLS, widened as tools_widened};
pub use waves::wave_timeout_ms;

pub use crate::digest::hex;

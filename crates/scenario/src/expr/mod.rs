//! The gate language: the small boolean expressions on edges (`when:`).
//!
//! Three phases, one error type each (the design follows the parse → resolve → evaluate
//! split of revset-style languages):
//! - [`parse`] turns text into an [`Expr`] with byte spans and no knowledge of names;
//! - [`resolve`] checks every path against a [`Scope`] (the scenario and the edge's
//!   source level), gives each path a [`Type`], rejects comparisons between incompatible
//!   types, and yields a [`Gate`];
//! - [`Gate::fires`] evaluates against any [`Context`] in three-valued (Kleene) logic: a
//!   missing path is UNDEFINED, a comparison involving UNDEFINED is UNDEFINED, `&&` and
//!   `||` conclude only when the known sides decide, and `defined(path)` asks whether a
//!   path holds a value. The gate fires only when the whole expression is `true`, so
//!   missing data never fires an edge unless the expression is true whatever it would be.
//!   Runs started under the older two-valued rule keep it ([`Semantics`]).

mod ast;
mod eval;
mod parse;
mod print;
mod resolve;

pub use ast::{CmpOp, Expr, ExprKind, Literal, Span};
pub use eval::{Context, JsonContext, Reading, Semantics, Val, json_val, walk};
pub use parse::{ParseError, parse};
pub use resolve::{ErrorKind, Gate, PathRef, ResolveError, Root, Scope, Type, resolve};

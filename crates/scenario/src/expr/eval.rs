//! Evaluating a [`Gate`] against run state.
//!
//! Evaluation is total: it never fails and never panics. A path the [`Context`] cannot
//! find — or that holds null, a list or a mapping — is UNDEFINED.
//!
//! Two rules exist, chosen by [`Semantics`]:
//! - [`Semantics::ThreeValued`], the rule of every new run, is Kleene's strong logic with
//!   UNDEFINED as the third value. A comparison with UNDEFINED is UNDEFINED; so is a
//!   comparison between values of different types (a number with a string, say) or an
//!   ordering of booleans, since nothing can be concluded from them; `!UNDEFINED` is
//!   UNDEFINED; `&&` is false as soon as one side is false and true only when both are;
//!   `||` is true as soon as one side is true and false only when both are; anything else
//!   is UNDEFINED. A value that is not a boolean (a string or number read from a dynamic
//!   path) is UNDEFINED as an operand of `!`, `&&` and `||`. `defined(path)` is true when
//!   the path holds a boolean, number or string and false otherwise, never UNDEFINED.
//!   Missing data therefore never makes an expression true unless it is true whatever
//!   the data would have been (a property test holds this).
//! - [`Semantics::TwoValued`], the rule runs were started under before, is kept so that
//!   those runs finish as they began: any comparison involving UNDEFINED, or between
//!   values of different types, is false, `&&` and `||` treat anything but `true` as
//!   false, and `!UNDEFINED` is UNDEFINED — so `!(confidence >= 0.7)` is true when
//!   `confidence` is missing.
//!
//! Under both, the gate fires only when the whole expression is `true`.

use serde::{Deserialize, Serialize};

use super::ast::{CmpOp, Literal};
use super::resolve::{Gate, Node, PathRef};

/// Which logic a gate is evaluated under; a run records the one it started with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Semantics {
    /// The rule before three-valued gates: a comparison with UNDEFINED is false.
    TwoValued,
    /// Kleene's three-valued logic: a comparison with UNDEFINED is UNDEFINED.
    ThreeValued,
}

impl Semantics {
    /// The rule new runs start under.
    pub const CURRENT: Semantics = Semantics::ThreeValued;

    /// The rule's name as written in events and printed by the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Semantics::TwoValued => "two_valued",
            Semantics::ThreeValued => "three_valued",
        }
    }
}

/// A value during evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Val<'a> {
    Undefined,
    Bool(bool),
    Num(f64),
    Str(&'a str),
}

impl Val<'_> {
    /// The value as JSON, for a `gate_decision` event; UNDEFINED is the string "UNDEFINED".
    pub fn to_json(self) -> serde_json::Value {
        match self {
            Val::Undefined => serde_json::Value::String("UNDEFINED".to_owned()),
            Val::Bool(b) => serde_json::Value::Bool(b),
            Val::Num(n) => serde_json::Number::from_f64(n)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            Val::Str(s) => serde_json::Value::String(s.to_owned()),
        }
    }

    /// The value as a condition: a boolean, or `None` (UNDEFINED) for anything else.
    pub fn truth(self) -> Option<bool> {
        match self {
            Val::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// Where a gate reads its paths from: the run state, or a JSON document.
pub trait Context {
    /// The value at `path`, or [`Val::Undefined`].
    fn lookup(&self, path: &PathRef) -> Val<'_>;
}

/// One path a gate read and the value it found.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub path: String,
    pub value: serde_json::Value,
}

impl Gate {
    /// Whether the gate fires under the current rule (the whole expression is `true`).
    pub fn fires(&self, ctx: &dyn Context) -> bool {
        self.fires_under(Semantics::CURRENT, ctx)
    }

    /// Whether the gate fires under `semantics`.
    pub fn fires_under(&self, semantics: Semantics, ctx: &dyn Context) -> bool {
        matches!(self.value_under(semantics, ctx), Val::Bool(true))
    }

    /// The expression's value under the current rule.
    pub fn value<'c>(&'c self, ctx: &'c dyn Context) -> Val<'c> {
        self.value_under(Semantics::CURRENT, ctx)
    }

    /// The expression's value under `semantics`.
    pub fn value_under<'c>(&'c self, semantics: Semantics, ctx: &'c dyn Context) -> Val<'c> {
        match semantics {
            Semantics::TwoValued => two_valued::eval(&self.expr, &self.paths, ctx),
            Semantics::ThreeValued => eval(&self.expr, &self.paths, ctx),
        }
    }

    /// Whether the gate fires under the current rule, with the value of every path it
    /// names (for the `gate_decision` event).
    pub fn fires_traced(&self, ctx: &dyn Context) -> (bool, Vec<Reading>) {
        self.fires_traced_under(Semantics::CURRENT, ctx)
    }

    /// Whether the gate fires under `semantics`, with the value of every path it names.
    pub fn fires_traced_under(
        &self,
        semantics: Semantics,
        ctx: &dyn Context,
    ) -> (bool, Vec<Reading>) {
        let fired = self.fires_under(semantics, ctx);
        (fired, self.readings(ctx))
    }

    /// The value of every path the gate names, in order of first appearance.
    pub fn readings(&self, ctx: &dyn Context) -> Vec<Reading> {
        self.paths
            .iter()
            .map(|p| Reading { path: p.text(), value: ctx.lookup(p).to_json() })
            .collect()
    }
}

/// Three-valued evaluation: Kleene's strong logic over UNDEFINED.
fn eval<'c>(node: &'c Node, paths: &'c [PathRef], ctx: &'c dyn Context) -> Val<'c> {
    match node {
        Node::Or(l, r) => {
            let left = eval(l, paths, ctx).truth();
            if left == Some(true) {
                return Val::Bool(true);
            }
            match (left, eval(r, paths, ctx).truth()) {
                (_, Some(true)) => Val::Bool(true),
                (Some(false), Some(false)) => Val::Bool(false),
                _ => Val::Undefined,
            }
        }
        Node::And(l, r) => {
            let left = eval(l, paths, ctx).truth();
            if left == Some(false) {
                return Val::Bool(false);
            }
            match (left, eval(r, paths, ctx).truth()) {
                (_, Some(false)) => Val::Bool(false),
                (Some(true), Some(true)) => Val::Bool(true),
                _ => Val::Undefined,
            }
        }
        Node::Not(inner) => {
            eval(inner, paths, ctx).truth().map_or(Val::Undefined, |b| Val::Bool(!b))
        }
        Node::Compare(op, l, r) => {
            compare(*op, eval(l, paths, ctx), eval(r, paths, ctx)).map_or(Val::Undefined, Val::Bool)
        }
        Node::Defined(i) => Val::Bool(defined(paths, *i, ctx)),
        Node::Path(i) => paths.get(*i).map_or(Val::Undefined, |p| ctx.lookup(p)),
        Node::Literal(literal) => literal_val(literal),
    }
}

fn literal_val(literal: &Literal) -> Val<'_> {
    match literal {
        Literal::Bool(b) => Val::Bool(*b),
        Literal::Num(n) => Val::Num(*n),
        Literal::Str(s) => Val::Str(s),
    }
}

/// Whether the path holds a defined value: a boolean, a number or a string.
fn defined(paths: &[PathRef], index: usize, ctx: &dyn Context) -> bool {
    paths.get(index).is_some_and(|p| !matches!(ctx.lookup(p), Val::Undefined))
}

/// A comparison's outcome, or `None` (UNDEFINED) when either side is UNDEFINED, the sides
/// have different types, or the type has no order (booleans under `<`, `<=`, `>`, `>=`).
fn compare(op: CmpOp, l: Val<'_>, r: Val<'_>) -> Option<bool> {
    let ordering = match (l, r) {
        (Val::Num(a), Val::Num(b)) => a.partial_cmp(&b)?,
        (Val::Str(a), Val::Str(b)) => a.cmp(b),
        (Val::Bool(a), Val::Bool(b)) => {
            return match op {
                CmpOp::Eq => Some(a == b),
                CmpOp::Ne => Some(a != b),
                _ => None,
            };
        }
        _ => return None,
    };
    Some(match op {
        CmpOp::Eq => ordering.is_eq(),
        CmpOp::Ne => ordering.is_ne(),
        CmpOp::Lt => ordering.is_lt(),
        CmpOp::Le => ordering.is_le(),
        CmpOp::Gt => ordering.is_gt(),
        CmpOp::Ge => ordering.is_ge(),
    })
}

/// The two-valued rule, unchanged, for runs that started under it.
mod two_valued {
    use super::{Context, Node, PathRef, Val, compare, defined, literal_val};

    pub(super) fn eval<'c>(node: &'c Node, paths: &'c [PathRef], ctx: &'c dyn Context) -> Val<'c> {
        match node {
            Node::Or(l, r) => {
                Val::Bool(is_true(eval(l, paths, ctx)) || is_true(eval(r, paths, ctx)))
            }
            Node::And(l, r) => {
                Val::Bool(is_true(eval(l, paths, ctx)) && is_true(eval(r, paths, ctx)))
            }
            Node::Not(inner) => match eval(inner, paths, ctx) {
                Val::Bool(b) => Val::Bool(!b),
                _ => Val::Undefined,
            },
            // Where the three-valued rule cannot conclude, this one says false.
            Node::Compare(op, l, r) => {
                Val::Bool(compare(*op, eval(l, paths, ctx), eval(r, paths, ctx)).unwrap_or(false))
            }
            Node::Defined(i) => Val::Bool(defined(paths, *i, ctx)),
            Node::Path(i) => paths.get(*i).map_or(Val::Undefined, |p| ctx.lookup(p)),
            Node::Literal(literal) => literal_val(literal),
        }
    }

    fn is_true(v: Val<'_>) -> bool {
        matches!(v, Val::Bool(true))
    }
}

/// The value at `segments` under `at`: an object's key, or a list's index when the segment
/// is a number; `None` where the path leads nowhere.
pub fn walk<'v>(
    mut at: &'v serde_json::Value,
    segments: &[String],
) -> Option<&'v serde_json::Value> {
    for segment in segments {
        at = match at {
            serde_json::Value::Object(map) => map.get(segment.as_str())?,
            serde_json::Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

/// A JSON document as a context: the path's segments are looked up key by key (a
/// numeric segment indexes a list). The document's top level holds the roots:
/// `{"verdict": "PASS", "verifier": {"build": {"passed": true}}, "level": {…}, …}`.
#[derive(Clone, Copy, Debug)]
pub struct JsonContext<'a>(pub &'a serde_json::Value);

impl Context for JsonContext<'_> {
    fn lookup(&self, path: &PathRef) -> Val<'_> {
        walk(self.0, &path.segments).map_or(Val::Undefined, json_val)
    }
}

/// A JSON value as a gate value: null, lists and mappings are UNDEFINED.
pub fn json_val(value: &serde_json::Value) -> Val<'_> {
    match value {
        serde_json::Value::Bool(b) => Val::Bool(*b),
        serde_json::Value::Number(n) => n.as_f64().map_or(Val::Undefined, Val::Num),
        serde_json::Value::String(s) => Val::Str(s),
        _ => Val::Undefined,
    }
}

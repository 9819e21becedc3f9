//! Evaluating a [`Gate`] against run state.
//!
//! Evaluation is total: it never fails and never panics. A path the [`Context`] cannot
//! find — or that holds null, a list or a mapping — is UNDEFINED. Any comparison
//! involving UNDEFINED, or between values of different types, is false; `!UNDEFINED` is
//! UNDEFINED; `&&` and `||` treat anything but `true` as not true. The gate fires only
//! when the whole expression is `true`.

use super::resolve::{Gate, Node, PathRef};
use super::{CmpOp, Literal};

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
    /// Whether the gate fires (the whole expression is `true`).
    pub fn fires(&self, ctx: &dyn Context) -> bool {
        matches!(eval(&self.expr, &self.paths, ctx), Val::Bool(true))
    }

    /// The expression's value.
    pub fn value<'c>(&'c self, ctx: &'c dyn Context) -> Val<'c> {
        eval(&self.expr, &self.paths, ctx)
    }

    /// Whether the gate fires, with the value of every path it names (for the
    /// `gate_decision` event).
    pub fn fires_traced(&self, ctx: &dyn Context) -> (bool, Vec<Reading>) {
        let fired = self.fires(ctx);
        let readings = self
            .paths
            .iter()
            .map(|p| Reading { path: p.text(), value: ctx.lookup(p).to_json() })
            .collect();
        (fired, readings)
    }
}

fn eval<'c>(node: &'c Node, paths: &'c [PathRef], ctx: &'c dyn Context) -> Val<'c> {
    match node {
        Node::Or(l, r) => Val::Bool(is_true(eval(l, paths, ctx)) || is_true(eval(r, paths, ctx))),
        Node::And(l, r) => Val::Bool(is_true(eval(l, paths, ctx)) && is_true(eval(r, paths, ctx))),
        Node::Not(inner) => match eval(inner, paths, ctx) {
            Val::Bool(b) => Val::Bool(!b),
            _ => Val::Undefined,
        },
        Node::Compare(op, l, r) => {
            Val::Bool(compare(*op, eval(l, paths, ctx), eval(r, paths, ctx)))
        }
        Node::Path(i) => paths.get(*i).map_or(Val::Undefined, |p| ctx.lookup(p)),
        Node::Literal(Literal::Bool(b)) => Val::Bool(*b),
        Node::Literal(Literal::Num(n)) => Val::Num(*n),
        Node::Literal(Literal::Str(s)) => Val::Str(s),
    }
}

fn is_true(v: Val<'_>) -> bool {
    matches!(v, Val::Bool(true))
}

fn compare(op: CmpOp, l: Val<'_>, r: Val<'_>) -> bool {
    let ordering = match (l, r) {
        (Val::Num(a), Val::Num(b)) => a.partial_cmp(&b),
        (Val::Str(a), Val::Str(b)) => Some(a.cmp(b)),
        (Val::Bool(a), Val::Bool(b)) => {
            return match op {
                CmpOp::Eq => a == b,
                CmpOp::Ne => a != b,
                _ => false,
            };
        }
        _ => None,
    };
    let Some(ordering) = ordering else {
        return false;
    };
    match op {
        CmpOp::Eq => ordering.is_eq(),
        CmpOp::Ne => ordering.is_ne(),
        CmpOp::Lt => ordering.is_lt(),
        CmpOp::Le => ordering.is_le(),
        CmpOp::Gt => ordering.is_gt(),
        CmpOp::Ge => ordering.is_ge(),
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

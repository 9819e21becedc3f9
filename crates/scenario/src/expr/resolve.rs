//! Checking an [`Expr`] against what a scenario declares, and typing it.
//!
//! Roots: `verdict`, `escalate_now`, `confidence`, `attempt`,
//! `verifier.<name>.<field>` (a verifier declared on the edge's source level),
//! `level.<id>.<field>` (a level of the scenario), `scratchpad.<key…>`, `input[.<…>]`,
//! `metadata.<…>`, `wave.<field>` (the result of the edge's source level, a wave). Known fields have a [`Type`]; scratchpad, input, metadata, `parsed.…`
//! and `details.…` are dynamic. `defined(path)` is a boolean over any path but a list
//! (a list is never a defined value). Comparing incompatible types, ordering booleans, testing a
//! verdict against anything but 'PASS' or 'FAIL', or using a number or string as a
//! condition is an error here, at load time, with the span to underline.

use std::fmt;

use super::ast::{CmpOp, Expr, ExprKind, Literal, Span};
use crate::suggest;

/// The type of a value in the gate language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Bool,
    Num,
    Str,
    /// A string that is always 'PASS' or 'FAIL' (or undefined).
    Verdict,
    /// A string that is always one of [`ErrorKind::ALL`]'s names (or undefined).
    ErrorKind,
    /// A list; it cannot be compared or tested.
    List,
    /// Known only at run time (scratchpad, input, metadata, parsed output, details).
    Dynamic,
}

impl Type {
    fn name(self) -> &'static str {
        match self {
            Type::Bool => "a boolean",
            Type::Num => "a number",
            Type::Str => "a string",
            Type::Verdict => "a verdict ('PASS' or 'FAIL')",
            Type::ErrorKind => "an error kind",
            Type::List => "a list",
            Type::Dynamic => "a value known at run time",
        }
    }
}

/// How an attempt of a level failed, as gates read it (`level.X.error.kind`) and
/// `level_finished` records it. Cancels, budget stops, jail refusals and a damaged log are
/// no attempt's failure: they are never routed by edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The provider refused the request for good (a 4xx, a wrong answer, no model left).
    Provider,
    /// The answer was cut at the output limit (`max_tokens`).
    Truncated,
    /// The model refused to answer.
    Refused,
    /// The attempt ran past its level's `timeout_s`.
    Timeout,
    /// The answer did not read: not JSON, against its schema, or no verdict.
    Invalid,
    /// A verifier of the attempt failed.
    Verifier,
    /// A tool of a tool loop failed the attempt.
    Tool,
}

impl ErrorKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::Provider,
        ErrorKind::Truncated,
        ErrorKind::Refused,
        ErrorKind::Timeout,
        ErrorKind::Invalid,
        ErrorKind::Verifier,
        ErrorKind::Tool,
    ];

    /// The kind's name, as gates compare it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Provider => "provider",
            ErrorKind::Truncated => "truncated",
            ErrorKind::Refused => "refused",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Verifier => "verifier",
            ErrorKind::Tool => "tool",
        }
    }
}

/// Which part of the run state a path reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Root {
    Verdict,
    EscalateNow,
    Confidence,
    Attempt,
    /// `verifier.<name>.<field…>`: an outcome of a verifier of the edge's source level.
    Verifier,
    /// `level.<id>.<field…>`: the state of a level.
    Level,
    Scratchpad,
    Input,
    Metadata,
    /// `result.<…>`: the structured result of an MCP tool call, in an `mcp` verifier's
    /// `condition` only.
    Result,
    /// `args.<…>`: the arguments of a call of a user's tool, in its `approval` only.
    Args,
    /// `wave.<field>`: the decision and counts of the edge's source level, a wave.
    Wave,
}

const ROOTS: &[&str] = &[
    "verdict",
    "escalate_now",
    "confidence",
    "attempt",
    "verifier",
    "level",
    "scratchpad",
    "input",
    "metadata",
    "wave",
];

/// What `wave.<field>` reads: the wave's decision and its assignments counted by state.
const WAVE_FIELDS: &[(&str, Type)] = &[
    ("decision", Type::Str),
    ("assignments", Type::Num),
    ("completed", Type::Num),
    ("partial", Type::Num),
    ("blocked", Type::Num),
    ("failed", Type::Num),
    ("cancelled", Type::Num),
    ("planned", Type::Num),
    ("in_flight", Type::Num),
    ("cost_usd", Type::Num),
    ("tokens", Type::Num),
];

const VERIFIER_FIELDS: &[(&str, Type)] = &[
    ("passed", Type::Bool),
    ("score", Type::Num),
    ("cost_usd", Type::Num),
    ("duration_ms", Type::Num),
    ("exit_code", Type::Num),
    ("reasons", Type::List),
    ("details", Type::Dynamic),
];

const LEVEL_FIELDS: &[(&str, Type)] = &[
    ("verdict", Type::Verdict),
    ("output", Type::Str),
    ("ok", Type::Bool),
    ("failed", Type::Bool),
    ("error", Type::Dynamic),
    ("skipped", Type::Bool),
    ("timed_out", Type::Bool),
    ("attempts", Type::Num),
    ("cost_usd", Type::Num),
    ("tokens", Type::Num),
    ("duration_ms", Type::Num),
    ("confidence", Type::Num),
    ("approved", Type::Bool),
    ("comment", Type::Str),
    ("touched_paths", Type::List),
    ("parsed", Type::Dynamic),
];

/// What `level.<id>.error.<field>` reads: how the level's last attempt failed.
const ERROR_FIELDS: &[(&str, Type)] = &[("kind", Type::ErrorKind), ("message", Type::Str)];

/// What a gate may name: the scenario's levels and the source level's verifiers.
///
/// `None` leaves that kind of name unchecked, for evaluating an expression without a
/// scenario.
#[derive(Clone, Debug, Default)]
pub struct Scope<'a> {
    pub levels: Option<Vec<&'a str>>,
    pub verifiers: Option<Vec<&'a str>>,
    /// The level the edge leaves from, for messages.
    pub source_level: Option<&'a str>,
    /// Whether `result.<…>` may be read: an `mcp` verifier's condition on the tool's
    /// structured result.
    pub result: bool,
    /// Whether `args.<…>` may be read: a tool's `approval` over a call's arguments.
    pub args: bool,
    /// Whether the edge's source level is a wave (`wave.<…>` reads it); `None` leaves it
    /// unchecked.
    pub wave: Option<bool>,
}

impl Scope<'_> {
    /// A scope that checks roots and fields but not level or verifier names.
    pub fn open() -> Self {
        Scope::default()
    }
}

/// Why an expression does not fit its scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolveError {
    pub message: String,
    pub span: Span,
    pub help: Option<String>,
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ResolveError {}

/// A path the gate reads, resolved to its root and type.
#[derive(Clone, Debug, PartialEq)]
pub struct PathRef {
    pub root: Root,
    /// Every segment, the root's included.
    pub segments: Vec<String>,
    pub ty: Type,
}

impl PathRef {
    /// The path as written.
    pub fn text(&self) -> String {
        self.segments.join(".")
    }
}

/// A checked expression, ready to evaluate.
#[derive(Clone, Debug)]
pub struct Gate {
    pub(super) expr: Node,
    pub(super) paths: Vec<PathRef>,
    source: Expr,
}

#[derive(Clone, Debug)]
pub(super) enum Node {
    Or(Box<Node>, Box<Node>),
    And(Box<Node>, Box<Node>),
    Not(Box<Node>),
    Compare(CmpOp, Box<Node>, Box<Node>),
    /// `defined(path)`, by the path's index.
    Defined(usize),
    Path(usize),
    Literal(Literal),
}

impl Gate {
    /// The expression as parsed.
    pub fn expr(&self) -> &Expr {
        &self.source
    }

    /// Every path the gate reads, in order of first appearance.
    pub fn paths(&self) -> &[PathRef] {
        &self.paths
    }

    /// Whether the gate reads how the last attempt of `level` — the edge's source — ended:
    /// `attempt`, or `level.<level>.failed`, `.error.…`, `.ok` or `.timed_out`. Only such
    /// an edge routes an attempt that failed with an error; the others were written for
    /// results.
    pub fn reads_outcome_of(&self, level: &str) -> bool {
        self.paths.iter().any(|p| match p.root {
            Root::Attempt => true,
            Root::Level => {
                p.segments.get(1).is_some_and(|l| l == level)
                    && p.segments.get(2).is_some_and(|f| {
                        matches!(f.as_str(), "failed" | "error" | "ok" | "timed_out")
                    })
            }
            _ => false,
        })
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)
    }
}

/// Checks `expr` against `scope` and compiles it.
pub fn resolve(expr: &Expr, scope: &Scope<'_>) -> Result<Gate, ResolveError> {
    let mut paths = Vec::new();
    let (node, ty) = compile(expr, scope, &mut paths)?;
    expect_condition(expr, ty)?;
    Ok(Gate { expr: node, paths, source: expr.clone() })
}

fn compile(
    expr: &Expr,
    scope: &Scope<'_>,
    paths: &mut Vec<PathRef>,
) -> Result<(Node, Type), ResolveError> {
    Ok(match &expr.kind {
        ExprKind::Or(l, r) | ExprKind::And(l, r) => {
            let (left, lt) = compile(l, scope, paths)?;
            expect_condition(l, lt)?;
            let (right, rt) = compile(r, scope, paths)?;
            expect_condition(r, rt)?;
            let node = if matches!(expr.kind, ExprKind::Or(..)) {
                Node::Or(Box::new(left), Box::new(right))
            } else {
                Node::And(Box::new(left), Box::new(right))
            };
            (node, Type::Bool)
        }
        ExprKind::Not(inner) => {
            let (node, ty) = compile(inner, scope, paths)?;
            expect_condition(inner, ty)?;
            (Node::Not(Box::new(node)), Type::Bool)
        }
        ExprKind::Compare(op, l, r) => {
            let (left, lt) = compile(l, scope, paths)?;
            let (right, rt) = compile(r, scope, paths)?;
            check_comparison(*op, (l, lt), (r, rt), expr.span)?;
            (Node::Compare(*op, Box::new(left), Box::new(right)), Type::Bool)
        }
        ExprKind::Literal(literal) => {
            let ty = match literal {
                Literal::Bool(_) => Type::Bool,
                Literal::Num(_) => Type::Num,
                Literal::Str(_) => Type::Str,
            };
            (Node::Literal(literal.clone()), ty)
        }
        ExprKind::Defined(operand) => {
            let ExprKind::Path(segments) = &operand.kind else {
                return Err(ResolveError {
                    message: format!("`defined` takes a path, not `{operand}`"),
                    span: operand.span,
                    help: Some("for example `defined(confidence)`".to_owned()),
                });
            };
            let path = resolve_path(segments, operand.span, scope)?;
            if path.ty == Type::List {
                return Err(ResolveError {
                    message: format!(
                        "`{}` is a list, and a list is never a defined value in a gate",
                        path.text()
                    ),
                    span: operand.span,
                    help: Some(
                        "`defined` asks whether a boolean, number or string is there".to_owned(),
                    ),
                });
            }
            (Node::Defined(intern(paths, path)), Type::Bool)
        }
        ExprKind::Path(segments) => {
            let path = resolve_path(segments, expr.span, scope)?;
            let ty = path.ty;
            (Node::Path(intern(paths, path)), ty)
        }
    })
}

/// The index of `path` among the gate's paths, added when it is new.
fn intern(paths: &mut Vec<PathRef>, path: PathRef) -> usize {
    match paths.iter().position(|p| p.segments == path.segments) {
        Some(i) => i,
        None => {
            paths.push(path);
            paths.len() - 1
        }
    }
}

fn expect_condition(expr: &Expr, ty: Type) -> Result<(), ResolveError> {
    if matches!(ty, Type::Bool | Type::Dynamic) {
        return Ok(());
    }
    let shown = expr.to_string();
    let help = match ty {
        Type::Num => format!("compare it, for example `{shown} >= 0.7`"),
        Type::Verdict => format!("compare it, for example `{shown} == 'PASS'`"),
        Type::ErrorKind => format!("compare it, for example `{shown} == 'provider'`"),
        Type::Str => format!("compare it, for example `{shown} == 'done'`"),
        _ => "a condition must be true or false".to_owned(),
    };
    Err(ResolveError {
        message: format!("`{shown}` is {}, not a condition", ty.name()),
        span: expr.span,
        help: Some(help),
    })
}

fn check_comparison(
    op: CmpOp,
    (l, lt): (&Expr, Type),
    (r, rt): (&Expr, Type),
    span: Span,
) -> Result<(), ResolveError> {
    for (side, ty) in [(l, lt), (r, rt)] {
        if ty == Type::List {
            return Err(ResolveError {
                message: format!("`{side}` is a list and cannot be compared"),
                span: side.span,
                help: None,
            });
        }
    }
    // A verdict compared with a string literal: the literal must be a verdict.
    for ((side, ty), (other, _)) in [((l, lt), (r, rt)), ((r, rt), (l, lt))] {
        if ty == Type::Verdict
            && let ExprKind::Literal(Literal::Str(s)) = &other.kind
            && s != "PASS"
            && s != "FAIL"
        {
            return Err(ResolveError {
                message: format!("`{side}` is 'PASS' or 'FAIL'; '{s}' never matches"),
                span: other.span,
                help: Some("verdicts are upper case: 'PASS' or 'FAIL'".to_owned()),
            });
        }
    }
    // An error kind compared with a string literal: the literal must be a kind.
    for ((side, ty), (other, _)) in [((l, lt), (r, rt)), ((r, rt), (l, lt))] {
        if ty == Type::ErrorKind
            && let ExprKind::Literal(Literal::Str(s)) = &other.kind
            && !ErrorKind::ALL.iter().any(|k| k.as_str() == s)
        {
            let names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
            let help = match suggest::closest(s, names.iter().copied()) {
                Some(near) => format!("did you mean '{near}'? kinds: {}", names.join(", ")),
                None => format!("kinds: {}", names.join(", ")),
            };
            return Err(ResolveError {
                message: format!("`{side}` is an error kind; '{s}' never matches"),
                span: other.span,
                help: Some(help),
            });
        }
    }
    let base = |t: Type| if matches!(t, Type::Verdict | Type::ErrorKind) { Type::Str } else { t };
    let (lb, rb) = (base(lt), base(rt));
    if lb != Type::Dynamic && rb != Type::Dynamic && lb != rb {
        return Err(ResolveError {
            message: format!("cannot compare `{l}` ({}) with `{r}` ({})", lt.name(), rt.name()),
            span,
            help: Some("both sides of a comparison must have the same type".to_owned()),
        });
    }
    if op.is_ordering() {
        for (side, ty) in [(l, lt), (r, rt)] {
            if matches!(ty, Type::Bool | Type::Verdict | Type::ErrorKind) {
                return Err(ResolveError {
                    message: format!("`{side}` is {} and has no order", ty.name()),
                    span,
                    help: Some(format!("use `==` or `!=` instead of `{}`", op.as_str())),
                });
            }
        }
    }
    Ok(())
}

fn resolve_path(
    segments: &[String],
    span: Span,
    scope: &Scope<'_>,
) -> Result<PathRef, ResolveError> {
    let err = |message: String, help: Option<String>| ResolveError { message, span, help };
    let text = segments.join(".");
    let first = segments[0].as_str();
    let simple = |root: Root, ty: Type| -> Result<PathRef, ResolveError> {
        if segments.len() > 1 {
            return Err(err(
                format!("`{first}` has no fields; `{text}` does not exist"),
                Some(format!("write `{first}`")),
            ));
        }
        Ok(PathRef { root, segments: segments.to_vec(), ty })
    };
    match first {
        "verdict" => simple(Root::Verdict, Type::Verdict),
        "escalate_now" => simple(Root::EscalateNow, Type::Bool),
        "confidence" => simple(Root::Confidence, Type::Num),
        "attempt" => simple(Root::Attempt, Type::Num),
        "verifier" => {
            let Some(name) = segments.get(1) else {
                return Err(err(
                    "`verifier` needs a verifier name and a field".to_owned(),
                    Some("for example `verifier.build.passed`".to_owned()),
                ));
            };
            if let Some(names) = &scope.verifiers
                && !names.contains(&name.as_str())
            {
                let on = scope.source_level.map_or(String::new(), |l| format!(" on level `{l}`"));
                let help = match suggest::closest(name, names.iter().copied()) {
                        Some(near) => format!("did you mean `{near}`?"),
                        None if names.is_empty() => {
                            "the level declares no verifiers; `verifier.<name>` reads the verifiers of the level the edge leaves".to_owned()
                        }
                        None => format!("declared here: {}", names.join(", ")),
                    };
                return Err(err(format!("no verifier `{name}` is declared{on}"), Some(help)));
            }
            typed_field(segments, 2, VERIFIER_FIELDS, Root::Verifier, span)
        }
        "level" => {
            let Some(id) = segments.get(1) else {
                return Err(err(
                    "`level` needs a level id and a field".to_owned(),
                    Some("for example `level.l3_accept.verdict`".to_owned()),
                ));
            };
            if let Some(ids) = &scope.levels
                && !ids.contains(&id.as_str())
            {
                let help = suggest::closest(id, ids.iter().copied())
                    .map(|near| format!("did you mean `{near}`?"));
                return Err(err(format!("the scenario has no level `{id}`"), help));
            }
            if segments.get(2).map(String::as_str) == Some("error") {
                return typed_field(segments, 3, ERROR_FIELDS, Root::Level, span);
            }
            typed_field(segments, 2, LEVEL_FIELDS, Root::Level, span)
        }
        "scratchpad" | "metadata" => {
            if segments.len() < 2 {
                return Err(err(
                    format!("`{first}` needs a key"),
                    Some(format!("for example `{first}.some_key`")),
                ));
            }
            let root = if first == "scratchpad" { Root::Scratchpad } else { Root::Metadata };
            Ok(PathRef { root, segments: segments.to_vec(), ty: Type::Dynamic })
        }
        "input" => {
            Ok(PathRef { root: Root::Input, segments: segments.to_vec(), ty: Type::Dynamic })
        }
        "wave" => {
            if scope.wave == Some(false) {
                let on = scope.source_level.map_or(String::new(), |l| format!(" `{l}`"));
                return Err(err(
                    format!("`wave.<…>` reads a wave's result, and level{on} is not a wave"),
                    Some("put this gate on an edge leaving a `wave` level".to_owned()),
                ));
            }
            typed_field(segments, 1, WAVE_FIELDS, Root::Wave, span)
        }
        "result" if scope.result => {
            Ok(PathRef { root: Root::Result, segments: segments.to_vec(), ty: Type::Dynamic })
        }
        "args" if scope.args => {
            Ok(PathRef { root: Root::Args, segments: segments.to_vec(), ty: Type::Dynamic })
        }
        _ => {
            let mut roots = ROOTS.to_vec();
            if scope.result {
                roots.push("result");
            }
            if scope.args {
                roots.push("args");
            }
            let help = match suggest::closest(first, roots.iter().copied()) {
                Some(near) => format!("did you mean `{near}`?"),
                None => format!("a path starts with one of: {}", roots.join(", ")),
            };
            Err(err(format!("unknown name `{first}`"), Some(help)))
        }
    }
}

fn typed_field(
    segments: &[String],
    at: usize,
    fields: &[(&str, Type)],
    root: Root,
    span: Span,
) -> Result<PathRef, ResolveError> {
    let prefix = segments[..at].join(".");
    let names: Vec<&str> = fields.iter().map(|(n, _)| *n).collect();
    let Some(field) = segments.get(at) else {
        return Err(ResolveError {
            message: format!("`{prefix}` needs a field"),
            span,
            help: Some(format!("one of: {}", names.join(", "))),
        });
    };
    let Some((_, ty)) = fields.iter().find(|(n, _)| n == field) else {
        let help = match suggest::closest(field, names.iter().copied()) {
            Some(near) => format!("did you mean `{near}`? fields: {}", names.join(", ")),
            None => format!("fields: {}", names.join(", ")),
        };
        return Err(ResolveError {
            message: format!("`{prefix}` has no field `{field}`"),
            span,
            help: Some(help),
        });
    };
    if *ty != Type::Dynamic && segments.len() > at + 1 {
        return Err(ResolveError {
            message: format!("`{prefix}.{field}` has no fields"),
            span,
            help: None,
        });
    }
    Ok(PathRef { root, segments: segments.to_vec(), ty: *ty })
}

//! The gate language's syntax tree: [`Expr`] and its parts, with byte [`Span`]s into the
//! expression's text.

/// A byte range in the expression's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    /// The range from `start` to `end`.
    pub fn new(start: usize, end: usize) -> Self {
        Span { start: crate::source::saturate(start), end: crate::source::saturate(end) }
    }

    /// The smallest range covering both.
    #[must_use]
    pub fn to(self, other: Span) -> Span {
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// A parsed expression. Equality ignores spans.
#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

impl PartialEq for Expr {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
    }
}

/// The shape of an expression.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Compare(CmpOp, Box<Expr>, Box<Expr>),
    /// `defined(path)`: whether the path holds a value; the operand is always a
    /// [`ExprKind::Path`].
    Defined(Box<Expr>),
    /// A dotted path; every segment is an identifier or a list index.
    Path(Vec<String>),
    Literal(Literal),
}

/// A literal value.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Str(String),
    Num(f64),
    Bool(bool),
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    /// The operator as written.
    pub fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    /// Whether this is an ordering (`<`, `<=`, `>`, `>=`) rather than an equality.
    pub fn is_ordering(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }
}

//! [`Expr`] back to text, with the fewest parentheses that keep its shape.
//!
//! `parse(expr.to_string())` gives back an equal expression (a property test holds this).

use std::fmt::{self, Write as _};

use super::ast::{Expr, ExprKind, Literal};

const OR: u8 = 1;
const AND: u8 = 2;
const COMPARE: u8 = 3;
const NOT: u8 = 4;
const ATOM: u8 = 5;

fn precedence(kind: &ExprKind) -> u8 {
    match kind {
        ExprKind::Or(..) => OR,
        ExprKind::And(..) => AND,
        ExprKind::Compare(..) => COMPARE,
        ExprKind::Not(_) => NOT,
        ExprKind::Defined(_) | ExprKind::Path(_) | ExprKind::Literal(_) => ATOM,
    }
}

/// Writes `expr`, in parentheses when its precedence is below `min`.
fn write(expr: &Expr, min: u8, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let own = precedence(&expr.kind);
    if own < min {
        f.write_char('(')?;
        write(expr, 0, f)?;
        return f.write_char(')');
    }
    match &expr.kind {
        ExprKind::Or(l, r) => {
            write(l, OR, f)?;
            f.write_str(" || ")?;
            write(r, OR + 1, f)
        }
        ExprKind::And(l, r) => {
            write(l, AND, f)?;
            f.write_str(" && ")?;
            write(r, AND + 1, f)
        }
        ExprKind::Compare(op, l, r) => {
            write(l, COMPARE + 1, f)?;
            write!(f, " {} ", op.as_str())?;
            write(r, COMPARE + 1, f)
        }
        ExprKind::Not(inner) => {
            f.write_char('!')?;
            write(inner, NOT, f)
        }
        ExprKind::Defined(path) => {
            f.write_str("defined(")?;
            write(path, 0, f)?;
            f.write_char(')')
        }
        ExprKind::Path(segments) => f.write_str(&segments.join(".")),
        ExprKind::Literal(literal) => fmt::Display::fmt(literal, f),
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write(self, 0, f)
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Bool(b) => write!(f, "{b}"),
            Literal::Num(n) => write!(f, "{n}"),
            Literal::Str(s) => {
                f.write_char('\'')?;
                for c in s.chars() {
                    match c {
                        '\'' => f.write_str("\\'")?,
                        '\\' => f.write_str("\\\\")?,
                        '\n' => f.write_str("\\n")?,
                        '\t' => f.write_str("\\t")?,
                        c => f.write_char(c)?,
                    }
                }
                f.write_char('\'')
            }
        }
    }
}

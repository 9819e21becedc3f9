//! Text to [`Expr`]: a hand-written lexer and recursive-descent parser with spans.
//!
//! Grammar, loosest first:
//! ```text
//! or      := and ("||" and)*
//! and     := compare ("&&" compare)*
//! compare := unary (("==" | "!=" | "<" | "<=" | ">" | ">=") unary)?
//! unary   := "!" unary | primary
//! primary := "defined" "(" path ")" | path | string | number | "-" number
//!          | "true" | "false" | "(" or ")"
//! path    := ident ("." (ident | digits))*
//! ```
//! Comparisons do not chain (`a == b == c` is an error). `defined` alone is not a path.
//! A number must survive a round trip through f64: at most
//! [`limits::NUMBER_DIGITS_MAX`] significant digits, a magnitude of at most
//! [`limits::NUMBER_MAGNITUDE_MAX`] (2^53), and a decimal value that f64 holds as written
//! once its shortest form is read back (`0.7` does; `9007199254740993` does not). Length,
//! nesting depth and path length are bounded by [`crate::limits`]; the parser never
//! panics.

use std::fmt;

use super::ast::{CmpOp, Expr, ExprKind, Literal, Span};
use crate::limits;

/// Why an expression could not be parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ParseError {
    pub message: String,
    pub span: Span,
    pub help: Option<String>,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParseError {}

fn error(message: impl Into<String>, span: Span) -> ParseError {
    ParseError { message: message.into(), span, help: None }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Path(Vec<String>),
    Str(String),
    Num(f64),
    True,
    False,
    Op(CmpOp),
    Not,
    And,
    Or,
    LParen,
    RParen,
    Minus,
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Path(segments) => format!("`{}`", segments.join(".")),
            Tok::Str(_) => "a string".to_owned(),
            Tok::Num(_) => "a number".to_owned(),
            Tok::True => "`true`".to_owned(),
            Tok::False => "`false`".to_owned(),
            Tok::Op(op) => format!("`{}`", op.as_str()),
            Tok::Not => "`!`".to_owned(),
            Tok::And => "`&&`".to_owned(),
            Tok::Or => "`||`".to_owned(),
            Tok::LParen => "`(`".to_owned(),
            Tok::RParen => "`)`".to_owned(),
            Tok::Minus => "`-`".to_owned(),
            Tok::End => "the end of the expression".to_owned(),
        }
    }
}

fn lex(text: &str) -> Result<Vec<(Tok, Span)>, ParseError> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'(' => tokens.push((Tok::LParen, Span::new(i, i + 1))),
            b')' => tokens.push((Tok::RParen, Span::new(i, i + 1))),
            b'-' => tokens.push((Tok::Minus, Span::new(i, i + 1))),
            b'&' | b'|' => {
                if bytes.get(i + 1) == Some(&c) {
                    let tok = if c == b'&' { Tok::And } else { Tok::Or };
                    tokens.push((tok, Span::new(i, i + 2)));
                    i += 2;
                    continue;
                }
                let doubled = if c == b'&' { "&&" } else { "||" };
                return Err(ParseError {
                    message: format!("`{}` is not an operator", c as char),
                    span: Span::new(i, i + 1),
                    help: Some(format!("write `{doubled}`")),
                });
            }
            b'=' | b'!' | b'<' | b'>' => {
                let eq = bytes.get(i + 1) == Some(&b'=');
                let tok = match (c, eq) {
                    (b'=', true) => Tok::Op(CmpOp::Eq),
                    (b'!', true) => Tok::Op(CmpOp::Ne),
                    (b'<', true) => Tok::Op(CmpOp::Le),
                    (b'>', true) => Tok::Op(CmpOp::Ge),
                    (b'<', false) => Tok::Op(CmpOp::Lt),
                    (b'>', false) => Tok::Op(CmpOp::Gt),
                    (b'!', false) => Tok::Not,
                    _ => {
                        return Err(ParseError {
                            message: "`=` is not an operator".to_owned(),
                            span: Span::new(i, i + 1),
                            help: Some("compare with `==`".to_owned()),
                        });
                    }
                };
                let width = if eq { 2 } else { 1 };
                tokens.push((tok, Span::new(i, i + width)));
                i += width;
                continue;
            }
            b'\'' | b'"' => {
                let (value, end) = lex_string(text, i)?;
                tokens.push((Tok::Str(value), Span::new(start, end)));
                i = end;
                continue;
            }
            b'0'..=b'9' => {
                let end = scan_number(bytes, i);
                let value = number(&text[i..end], Span::new(i, end))?;
                tokens.push((Tok::Num(value), Span::new(i, end)));
                i = end;
                continue;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let (tok, end) = lex_path(text, i)?;
                tokens.push((tok, Span::new(start, end)));
                i = end;
                continue;
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(error(
                    format!("unexpected character `{ch}`"),
                    Span::new(i, i + ch.len_utf8()),
                ));
            }
        }
        i += 1;
    }
    tokens.push((Tok::End, Span::new(text.len(), text.len())));
    Ok(tokens)
}

/// The value of the number literal `literal`, refused unless f64 holds it as written.
fn number(literal: &str, span: Span) -> Result<f64, ParseError> {
    let value: f64 =
        literal.parse().map_err(|_| error(format!("`{literal}` is not a number"), span))?;
    if !value.is_finite() || value.abs() > limits::NUMBER_MAGNITUDE_MAX {
        return Err(ParseError {
            message: format!(
                "`{literal}` is too large: a gate number may be at most 2^53 \
                 ({}) in magnitude, where f64 still holds every integer",
                limits::NUMBER_MAGNITUDE_MAX
            ),
            span,
            help: Some("compare a smaller unit (seconds rather than nanoseconds)".to_owned()),
        });
    }
    let (digits, exponent) = decimal(literal);
    if digits.len() > limits::NUMBER_DIGITS_MAX {
        return Err(ParseError {
            message: format!(
                "`{literal}` has {} significant digits; a gate number keeps at most {}",
                digits.len(),
                limits::NUMBER_DIGITS_MAX
            ),
            span,
            help: Some(format!("it would be read as {value}; write that, or fewer digits")),
        });
    }
    if (digits, exponent) != decimal(&format!("{value:e}")) {
        return Err(ParseError {
            message: format!(
                "`{literal}` does not survive a round trip through f64: it would be read as \
                 {value}"
            ),
            span,
            help: Some(format!("write {value}, or fewer significant digits")),
        });
    }
    Ok(value)
}

/// A decimal number's significant digits and the power of ten of the last one:
/// `0.70` and `7e-1` are both `("7", -1)`; zero is `("", 0)`. `text` is a literal as
/// [`scan_number`] delimits it, or an f64 printed with `{:e}`.
fn decimal(text: &str) -> (String, i64) {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => {
            let written = &text[at + 1..];
            // An exponent too long for i64 is far beyond f64 either way; any huge value
            // with its sign keeps the comparison honest.
            let exponent = written.parse::<i64>().unwrap_or(if written.starts_with('-') {
                i64::MIN / 2
            } else {
                i64::MAX / 2
            });
            (&text[..at], exponent)
        }
        None => (text, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{whole}{fraction}");
    let significant = all.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return (String::new(), 0);
    }
    let shift = i64::try_from(significant.len() - trimmed.len()).unwrap_or(i64::MAX);
    let fraction_len = i64::try_from(fraction.len()).unwrap_or(i64::MAX);
    (trimmed.to_owned(), exponent.saturating_sub(fraction_len).saturating_add(shift))
}

fn scan_number(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        i += 1;
    }
    if i + 1 < bytes.len() && bytes[i] == b'.' && bytes[i + 1].is_ascii_digit() {
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
    }
    if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
        let mut j = i + 1;
        if j < bytes.len() && (bytes[j] == b'+' || bytes[j] == b'-') {
            j += 1;
        }
        if j < bytes.len() && bytes[j].is_ascii_digit() {
            while j < bytes.len() && bytes[j].is_ascii_digit() {
                j += 1;
            }
            i = j;
        }
    }
    i
}

fn lex_string(text: &str, start: usize) -> Result<(String, usize), ParseError> {
    let quote = text.as_bytes()[start];
    let mut value = String::new();
    let mut chars = text[start + 1..].char_indices();
    while let Some((offset, ch)) = chars.next() {
        let at = start + 1 + offset;
        match ch {
            c if c as u32 == u32::from(quote) => return Ok((value, at + 1)),
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, 't')) => value.push('\t'),
                Some((_, c @ ('\\' | '\'' | '"'))) => value.push(c),
                Some((o, c)) => {
                    let end = start + 1 + o + c.len_utf8();
                    return Err(ParseError {
                        message: format!("unknown escape `\\{c}`"),
                        span: Span::new(at, end),
                        help: Some("the escapes are \\\\, \\', \\\", \\n and \\t".to_owned()),
                    });
                }
                None => break,
            },
            c => value.push(c),
        }
    }
    Err(ParseError {
        message: "unterminated string".to_owned(),
        span: Span::new(start, text.len()),
        help: Some(format!("close it with `{}`", quote as char)),
    })
}

fn lex_path(text: &str, start: usize) -> Result<(Tok, usize), ParseError> {
    let bytes = text.as_bytes();
    let ident_end = |mut i: usize| {
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        i
    };
    let mut i = ident_end(start);
    let mut segments = vec![text[start..i].to_owned()];
    while i < bytes.len() && bytes[i] == b'.' {
        let seg_start = i + 1;
        let seg_end = match bytes.get(seg_start) {
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => ident_end(seg_start),
            Some(c) if c.is_ascii_digit() => {
                let mut j = seg_start;
                while j < bytes.len() && bytes[j].is_ascii_digit() {
                    j += 1;
                }
                j
            }
            _ => {
                return Err(error("expected a name after `.`", Span::new(i, seg_start)));
            }
        };
        segments.push(text[seg_start..seg_end].to_owned());
        if segments.len() > limits::PATH_SEGMENTS_MAX {
            return Err(error(
                format!("a path may have at most {} segments", limits::PATH_SEGMENTS_MAX),
                Span::new(start, seg_end),
            ));
        }
        i = seg_end;
    }
    let tok = match (segments.len(), segments[0].as_str()) {
        (1, "true") => Tok::True,
        (1, "false") => Tok::False,
        _ => Tok::Path(segments),
    };
    Ok((tok, i))
}

/// The one function of the language: `defined(path)`.
const DEFINED: &str = "defined";

struct Parser {
    tokens: Vec<(Tok, Span)>,
    at: usize,
    depth: usize,
}

/// Parses an expression.
pub fn parse(text: &str) -> Result<Expr, ParseError> {
    if text.len() > limits::EXPR_BYTES_MAX {
        return Err(error(
            format!(
                "the expression is {} bytes; a gate may be at most {} bytes",
                text.len(),
                limits::EXPR_BYTES_MAX
            ),
            Span::new(0, text.len()),
        ));
    }
    if text.trim().is_empty() {
        return Err(ParseError {
            message: "the expression is empty".to_owned(),
            span: Span::new(0, text.len()),
            help: Some("remove `when:` for an unconditional edge".to_owned()),
        });
    }
    let mut parser = Parser { tokens: lex(text)?, at: 0, depth: 0 };
    let expr = parser.or()?;
    match parser.peek() {
        Tok::End => Ok(expr),
        Tok::Path(segments) if matches!(segments[0].as_str(), "and" | "or" | "not") => {
            let word = segments[0].clone();
            let symbol = match word.as_str() {
                "and" => "&&",
                "or" => "||",
                _ => "!",
            };
            Err(ParseError {
                message: format!("unexpected `{word}`"),
                span: parser.span(),
                help: Some(format!("write `{symbol}`")),
            })
        }
        Tok::Op(_) => Err(ParseError {
            message: "comparisons do not chain".to_owned(),
            span: parser.span(),
            help: Some("join two comparisons with `&&`".to_owned()),
        }),
        other => Err(error(
            format!("expected `&&`, `||` or the end, found {}", other.describe()),
            parser.span(),
        )),
    }
}

impl Parser {
    fn peek(&self) -> &Tok {
        self.tokens.get(self.at).map_or(&Tok::End, |(t, _)| t)
    }

    fn span(&self) -> Span {
        self.tokens.get(self.at).map_or_else(Span::default, |(_, s)| *s)
    }

    fn bump(&mut self) -> (Tok, Span) {
        let item = self.tokens.get(self.at).cloned().unwrap_or((Tok::End, Span::default()));
        if self.at < self.tokens.len() {
            self.at += 1;
        }
        item
    }

    fn descend(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > limits::EXPR_DEPTH_MAX {
            return Err(error(
                format!("the expression nests deeper than {} levels", limits::EXPR_DEPTH_MAX),
                self.span(),
            ));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, ParseError> {
        self.descend()?;
        let mut left = self.and()?;
        while *self.peek() == Tok::Or {
            self.bump();
            let right = self.and()?;
            let span = left.span.to(right.span);
            left = Expr { kind: ExprKind::Or(Box::new(left), Box::new(right)), span };
        }
        self.depth -= 1;
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.compare()?;
        while *self.peek() == Tok::And {
            self.bump();
            let right = self.compare()?;
            let span = left.span.to(right.span);
            left = Expr { kind: ExprKind::And(Box::new(left), Box::new(right)), span };
        }
        Ok(left)
    }

    fn compare(&mut self) -> Result<Expr, ParseError> {
        let left = self.unary()?;
        if let Tok::Op(op) = *self.peek() {
            self.bump();
            let right = self.unary()?;
            let span = left.span.to(right.span);
            return Ok(Expr { kind: ExprKind::Compare(op, Box::new(left), Box::new(right)), span });
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if *self.peek() == Tok::Not {
            let (_, start) = self.bump();
            self.descend()?;
            let operand = self.unary()?;
            self.depth -= 1;
            let span = start.to(operand.span);
            return Ok(Expr { kind: ExprKind::Not(Box::new(operand)), span });
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        let (tok, span) = self.bump();
        let kind = match tok {
            Tok::Path(segments) if segments.len() == 1 && segments[0] == DEFINED => {
                return self.defined(span);
            }
            Tok::Path(segments) => {
                if matches!(segments[0].as_str(), "and" | "or" | "not") && segments.len() == 1 {
                    let symbol = match segments[0].as_str() {
                        "and" => "&&",
                        "or" => "||",
                        _ => "!",
                    };
                    return Err(ParseError {
                        message: format!("unexpected `{}`", segments[0]),
                        span,
                        help: Some(format!("write `{symbol}`")),
                    });
                }
                ExprKind::Path(segments)
            }
            Tok::Str(s) => ExprKind::Literal(Literal::Str(s)),
            Tok::Num(n) => ExprKind::Literal(Literal::Num(n)),
            Tok::True => ExprKind::Literal(Literal::Bool(true)),
            Tok::False => ExprKind::Literal(Literal::Bool(false)),
            Tok::Minus => {
                let (next, number_span) = self.bump();
                let Tok::Num(n) = next else {
                    return Err(error("`-` must be followed by a number", span.to(number_span)));
                };
                return Ok(Expr {
                    kind: ExprKind::Literal(Literal::Num(-n)),
                    span: span.to(number_span),
                });
            }
            Tok::LParen => {
                let inner = self.or()?;
                let (close, close_span) = self.bump();
                if close != Tok::RParen {
                    return Err(ParseError {
                        message: format!("expected `)`, found {}", close.describe()),
                        span: close_span,
                        help: Some(format!("the `(` at byte {} is not closed", span.start)),
                    });
                }
                return Ok(Expr { kind: inner.kind, span: span.to(close_span) });
            }
            other => {
                return Err(error(
                    format!("expected a value, a path or `(`, found {}", other.describe()),
                    span,
                ));
            }
        };
        Ok(Expr { kind, span })
    }

    /// The rest of `defined(path)`, after the word at `start`.
    fn defined(&mut self, start: Span) -> Result<Expr, ParseError> {
        let usage = || Some("write `defined(path)`, for example `defined(confidence)`".to_owned());
        let (open, open_span) = self.bump();
        if open != Tok::LParen {
            return Err(ParseError {
                message: format!(
                    "`defined` needs a path in parentheses, found {}",
                    open.describe()
                ),
                span: start.to(open_span),
                help: usage(),
            });
        }
        let (operand, operand_span) = self.bump();
        let Tok::Path(segments) = operand else {
            return Err(ParseError {
                message: format!("`defined` takes a path, found {}", operand.describe()),
                span: operand_span,
                help: usage(),
            });
        };
        let (close, close_span) = self.bump();
        if close != Tok::RParen {
            return Err(ParseError {
                message: format!("expected `)` after the path, found {}", close.describe()),
                span: close_span,
                help: Some("`defined` takes exactly one path".to_owned()),
            });
        }
        let path = Expr { kind: ExprKind::Path(segments), span: operand_span };
        Ok(Expr { kind: ExprKind::Defined(Box::new(path)), span: start.to(close_span) })
    }
}

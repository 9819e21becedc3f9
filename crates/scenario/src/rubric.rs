//! Rubrics for `llm_judge` verifiers: Markdown files with a YAML front matter.
//!
//! ```text
//! ---
//! id: fact_check_v1
//! title: Fact check
//! pass_threshold: 0.7
//! criteria:
//!   - id: accuracy
//!     weight: 2
//!     description: every claim is supported by the sources
//! ---
//! Instructions to the judge, in Markdown.
//! ```
//! The front matter is read as strictly as a scenario; the body is what the judge reads.

use std::collections::HashSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::de::{Located, from_node};
use crate::diag::Diagnostic;
use crate::node::Node;
use crate::source::{Pos, SourceId};

/// A parsed rubric.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rubric {
    pub id: String,
    pub title: String,
    /// Weighted mean score (0..1) at or above which the judge passes.
    pub pass_threshold: f64,
    pub criteria: Vec<Criterion>,
    /// The Markdown after the front matter: instructions for the judge.
    pub body: String,
}

/// One scored criterion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Criterion {
    pub id: String,
    pub weight: f64,
    pub description: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRubric {
    id: Located<String>,
    #[serde(default)]
    title: Option<String>,
    pass_threshold: Located<f64>,
    criteria: Located<Vec<Located<RawCriterion>>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawCriterion {
    id: Located<String>,
    #[serde(default)]
    weight: Option<Located<f64>>,
    description: String,
}

/// Parses a rubric file; `expected_id` is the name it was referenced by.
pub fn parse(text: &str, source: SourceId, expected_id: &str) -> Result<Rubric, Vec<Diagnostic>> {
    let file_pos = Pos { source, ..Pos::UNKNOWN };
    let missing = || {
        vec![
            Diagnostic::error("rubric-front-matter", file_pos, "the rubric has no front matter")
                .with_help("start the file with `---`, the rubric's id, pass_threshold and criteria, then `---`"),
        ]
    };
    let Some(rest) = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")) else {
        return Err(missing());
    };
    let offset = text.len() - rest.len();
    let close = rest.match_indices("\n---").map(|(i, _)| i).find(|&i| {
        let after = &rest[i + 4..];
        after.is_empty() || after.starts_with('\n') || after.starts_with("\r\n")
    });
    let Some(close) = close else {
        let opening = crate::source::pos_in_text(text, 0, 3, source);
        return Err(vec![
            Diagnostic::error(
                "rubric-front-matter",
                opening,
                "the rubric's front matter opens here but never closes",
            )
            .with_help("end the front matter with a line holding only `---`, then write the judge's instructions below it"),
        ]);
    };
    // Parsing the file's own prefix keeps every line and byte position true to the file.
    let front = &text[..offset + close + 1];
    let body = rest[close + 4..].trim().to_owned();
    let node = Node::parse(front, source).map_err(|d| vec![d])?;
    let raw: RawRubric = from_node(&node).map_err(|e| vec![e.into_diagnostic()])?;

    let mut errors = Vec::new();
    if raw.id.value != expected_id {
        errors.push(
            Diagnostic::error(
                "rubric-id-mismatch",
                raw.id.pos,
                format!(
                    "the rubric's id is `{}` but it is referenced as `{expected_id}`",
                    raw.id.value
                ),
            )
            .with_help("the id must equal the file name without `.md`"),
        );
    }
    if !(raw.pass_threshold.value > 0.0 && raw.pass_threshold.value <= 1.0) {
        errors.push(Diagnostic::error(
            "out-of-range",
            raw.pass_threshold.pos,
            format!("pass_threshold must be in (0, 1], found {}", raw.pass_threshold.value),
        ));
    }
    if raw.criteria.value.is_empty() {
        errors.push(Diagnostic::error(
            "rubric-no-criteria",
            raw.criteria.pos,
            "the rubric lists no criteria",
        ));
    }
    let mut seen = HashSet::new();
    let mut criteria = Vec::new();
    for c in &raw.criteria.value {
        if !seen.insert(c.id.value.clone()) {
            errors.push(Diagnostic::error(
                "duplicate-id",
                c.id.pos,
                format!("criterion `{}` is listed twice", c.id.value),
            ));
        }
        let weight = c.weight.as_ref().map_or(1.0, |w| w.value);
        if !(weight.is_finite() && weight > 0.0) {
            let pos = c.weight.as_ref().map_or(c.id.pos, |w| w.pos);
            errors.push(Diagnostic::error(
                "out-of-range",
                pos,
                format!("a criterion's weight must be positive, found {weight}"),
            ));
        }
        criteria.push(Criterion {
            id: c.id.value.clone(),
            weight,
            description: c.description.clone(),
        });
    }
    if body.is_empty() {
        errors.push(
            Diagnostic::error(
                "rubric-no-body",
                file_pos,
                "the rubric has no instructions after its front matter",
            )
            .with_help("write what the judge should look for below the closing `---`"),
        );
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Rubric {
        id: raw.id.value,
        title: raw.title.unwrap_or_else(|| expected_id.to_owned()),
        pass_threshold: raw.pass_threshold.value,
        criteria,
        body,
    })
}

//! Reading a PASS/FAIL verdict out of a model's answer.
//!
//! In order: a trailing ```control fence holding JSON (`{"verdict": "PASS", …}`); then
//! lenient JSON anywhere in the answer (`{verdict}` or `{extra: {verdict}}`); then a
//! first line that starts with PASS or FAIL. When none holds, the prompt runner makes one
//! bounded repair call with the contract spelled out.

use serde_json::Value;

/// A verdict and what came with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// `PASS` or `FAIL`.
    pub verdict: String,
    pub confidence: Option<f64>,
}

/// The instruction sent with a repair call.
pub const CONTRACT: &str = "Your previous answer did not state a verdict I could read. \
End your answer with a fenced block exactly like this:\n\n```control\n{\"verdict\": \"PASS\", \"confidence\": 0.9, \"reason\": \"one sentence\"}\n```\n\n\
where verdict is PASS or FAIL.";

/// Reads the verdict, if the answer states one.
pub fn parse(text: &str) -> Option<Verdict> {
    control_fence(text).or_else(|| lenient_json(text)).or_else(|| leading_word(text))
}

fn from_value(v: &Value) -> Option<Verdict> {
    let raw = v.get("verdict").or_else(|| v.get("extra").and_then(|e| e.get("verdict")))?;
    let verdict = raw.as_str()?.trim().to_uppercase();
    if verdict != "PASS" && verdict != "FAIL" {
        return None;
    }
    Some(Verdict {
        verdict,
        confidence: v.get("confidence").and_then(Value::as_f64).filter(|c| (0.0..=1.0).contains(c)),
    })
}

fn control_fence(text: &str) -> Option<Verdict> {
    let start = text.rfind("```control")?;
    let body = &text[start + "```control".len()..];
    let end = body.find("```").unwrap_or(body.len());
    serde_json::from_str::<Value>(body[..end].trim()).ok().as_ref().and_then(from_value)
}

fn lenient_json(text: &str) -> Option<Verdict> {
    // Try every `{` from the last one back: the verdict object usually ends the answer.
    let bytes = text.as_bytes();
    let mut positions: Vec<usize> =
        bytes.iter().enumerate().filter(|(_, b)| **b == b'{').map(|(i, _)| i).collect();
    positions.reverse();
    for start in positions.into_iter().take(64) {
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        if let Some(Ok(value)) = stream.next()
            && let Some(v) = from_value(&value)
        {
            return Some(v);
        }
    }
    None
}

fn leading_word(text: &str) -> Option<Verdict> {
    let first = text.trim_start().lines().next()?.trim_start_matches(['*', '#', ' ']);
    for word in ["PASS", "FAIL"] {
        if let Some(rest) = first.strip_prefix(word)
            && (rest.is_empty() || rest.starts_with([':', ' ', '.', '-', '—']))
        {
            return Some(Verdict { verdict: word.to_owned(), confidence: None });
        }
    }
    None
}

/// Reads a JSON answer: the whole text, or the body of a ```json fence.
pub fn parse_json(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        return Some(v);
    }
    let start =
        trimmed.find("```json").map(|i| i + 7).or_else(|| trimmed.find("```").map(|i| i + 3))?;
    let body = &trimmed[start..];
    let end = body.find("```").unwrap_or(body.len());
    serde_json::from_str(body[..end].trim()).ok()
}

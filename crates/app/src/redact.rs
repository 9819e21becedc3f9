//! The redactor the engine is given (its `Redact`): taking secrets out of outside text
//! before it is recorded: a provider's error body, a
//! verifier's output, an MCP result may hold an API key (a server echoing the request, a
//! model-written program printing its environment), and the log, the prompts built from it
//! and the terminal must never hold one.
//!
//! Two passes: every key value the process knows (the embedder gives them: the CLI reads
//! the variables its provider configuration names, and the well-known key variables), and
//! shapes that look like keys whoever owns them — `sk-…` / `sk-ant-…` tokens and the token
//! after `Bearer `. Scanned by hand: the workspace has no regex engine.

use std::borrow::Cow;
use std::sync::Arc;

use baton_engine::redact::Redact;

/// What a secret is replaced by.
pub const REDACTED: &str = baton_engine::redact::REDACTED;

/// A known secret shorter than this is not searched for: it would match ordinary text.
pub const SECRET_CHARS_MIN: usize = 8;

/// The fewest characters of a known secret, cut at the edge of a text (an output tail that
/// begins inside it, a head that ends inside it), that are still taken out.
pub const FRAGMENT_CHARS_MIN: usize = 6;

/// At least this many token characters after `sk-` make an `sk-…` key.
const SK_TOKEN_CHARS_MIN: usize = 16;

/// At least this many token characters after `Bearer ` make a bearer token.
const BEARER_TOKEN_CHARS_MIN: usize = 8;

/// Replaces the secrets it was given, and key-shaped tokens, by [`REDACTED`].
#[derive(Clone, Default)]
pub struct Redactor {
    /// Known secret values, longest first (so a key that contains another goes whole).
    secrets: Arc<Vec<String>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The values are the secrets: only their number is shown.
        f.debug_struct("Redactor").field("secrets", &self.secrets.len()).finish()
    }
}

impl Redactor {
    /// A redactor for these secret values; empty, blank and too short ones are left out
    /// (see [`SECRET_CHARS_MIN`]), surrounding whitespace is trimmed.
    pub fn new<I, S>(secrets: I) -> Redactor
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut kept: Vec<String> = secrets
            .into_iter()
            .map(|s| s.as_ref().trim().to_owned())
            .filter(|s| s.chars().count() >= SECRET_CHARS_MIN)
            .collect();
        kept.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        kept.dedup();
        Redactor { secrets: Arc::new(kept) }
    }

    /// The text with every known secret and key-shaped token replaced; borrowed when
    /// nothing was found.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for secret in self.secrets.iter() {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
            }
            if let Some(cut) = edge_fragment(&out, secret) {
                out = Cow::Owned(cut);
            }
        }
        match shapes(&out) {
            Some(redacted) => Cow::Owned(redacted),
            None => out,
        }
    }
}

impl Redact for Redactor {
    fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        Redactor::redact(self, text)
    }
}

/// The text with a piece of `secret` at its edges taken out: a text that begins with one of
/// the secret's proper suffixes (a tail cut inside it) or ends with one of its proper
/// prefixes (a head cut inside it), of at least [`FRAGMENT_CHARS_MIN`] characters; `None`
/// when it has neither.
fn edge_fragment(text: &str, secret: &str) -> Option<String> {
    let mut out: Option<String> = None;
    // Longest first: the whole of what the cut left.
    if let Some(suffix) = (1..secret.len())
        .filter(|&i| secret.is_char_boundary(i))
        .map(|i| &secret[i..])
        .take_while(|s| s.chars().count() >= FRAGMENT_CHARS_MIN)
        .find(|s| text.starts_with(s))
    {
        out = Some(format!("{REDACTED}{}", &text[suffix.len()..]));
    }
    let current = out.as_deref().unwrap_or(text);
    if let Some(prefix) = (1..secret.len())
        .rev()
        .filter(|&i| secret.is_char_boundary(i))
        .map(|i| &secret[..i])
        .take_while(|p| p.chars().count() >= FRAGMENT_CHARS_MIN)
        .find(|p| current.ends_with(p))
    {
        out = Some(format!("{}{REDACTED}", &current[..current.len() - prefix.len()]));
    }
    out
}

/// Characters of an `sk-…` key after the prefix.
fn is_sk_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Characters of a bearer token (RFC 6750's `b64token`).
fn is_bearer_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
}

/// How many bytes from `at` satisfy `accept`.
fn run_of(bytes: &[u8], at: usize, accept: fn(u8) -> bool) -> usize {
    bytes[at..].iter().take_while(|b| accept(**b)).count()
}

/// The text with key-shaped tokens replaced, or `None` when it has none. Every pattern is
/// ASCII, so cutting at its bytes keeps UTF-8 whole.
fn shapes(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0; // bytes of `text` already in `out`
    let mut i = 0;
    while i < bytes.len() {
        // A token starts at the text's start or after a character that is no key's.
        let at_boundary = i == 0 || !is_sk_char(bytes[i - 1]);
        if at_boundary && bytes[i..].starts_with(b"sk-") {
            let token = run_of(bytes, i + 3, is_sk_char);
            if token >= SK_TOKEN_CHARS_MIN {
                let o = out.get_or_insert_with(String::new);
                o.push_str(&text[copied..i]);
                o.push_str(REDACTED);
                i += 3 + token;
                copied = i;
                continue;
            }
        }
        if at_boundary && bytes.len() - i > 7 && bytes[i..i + 7].eq_ignore_ascii_case(b"bearer ") {
            let spaces = run_of(bytes, i + 7, |b| b == b' ');
            let start = i + 7 + spaces;
            let token = run_of(bytes, start, is_bearer_char);
            if token >= BEARER_TOKEN_CHARS_MIN {
                let o = out.get_or_insert_with(String::new);
                o.push_str(&text[copied..start]);
                o.push_str(REDACTED);
                i = start + token;
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    out.map(|mut o| {
        o.push_str(&text[copied..]);
        o
    })
}

#[cfg(test)]
mod tests {
    use super::{REDACTED, Redactor};
    use baton_engine::redact::Redact as _;

    #[test]
    fn known_secrets_go_wherever_they_are() {
        let r = Redactor::new(["k3y-value-0123", "  spaced-secret-9  ", "short", ""]);
        assert_eq!(
            r.redact("a k3y-value-0123b and spaced-secret-9."),
            format!("a {REDACTED}b and {REDACTED}.")
        );
        // Too short to search for: ordinary words would go.
        assert_eq!(r.redact("a short word"), "a short word");
        assert!(!format!("{r:?}").contains("k3y"), "{r:?}");
    }

    #[test]
    fn a_secret_cut_at_the_edge_of_a_text_goes_too() {
        let r = Redactor::new(["test-key-1f2e3d4c5b6a79880011"]);
        // A tail that begins inside the key, a head that ends inside it.
        assert_eq!(r.redact("6a79880011xxxx"), format!("{REDACTED}xxxx"));
        assert_eq!(r.redact("build log test-key-1f2e"), format!("build log {REDACTED}"));
        assert_eq!(r.redact("a1f2e3d4c5b6a79880011b"), "a1f2e3d4c5b6a79880011b".to_owned());
        // Fewer characters than a fragment needs, or a piece inside the text, stay.
        assert_eq!(r.redact("80011 done"), "80011 done");
        assert_eq!(r.redact("the test-key word"), "the test-key word");
    }

    #[test]
    fn key_shapes_go_without_being_known() {
        let r = Redactor::default();
        assert_eq!(
            r.redact("key=sk-abcdefghijklmnop0123 and sk-ant-api03-AbC_dEf-0123456789xyz!"),
            format!("key={REDACTED} and {REDACTED}!")
        );
        assert_eq!(
            r.redact("Authorization: Bearer eyJhbGciOi.J9x_y+z/== ok"),
            format!("Authorization: Bearer {REDACTED} ok")
        );
        assert_eq!(r.redact("bearer  abcdefgh12"), format!("bearer  {REDACTED}"));
    }

    #[test]
    fn json_values_are_redacted_through_and_through() {
        let r = Redactor::new(["a-configured-key-0000"]);
        let mut v = serde_json::json!({
            "stderr_tail": "leaked a-configured-key-0000",
            "list": [1, "sk-abcdefghijklmnopqrst"],
            "a-configured-key-0000": true,
        });
        r.redact_value(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"stderr_tail": "leaked [redacted]", "list": [1, "[redacted]"], "[redacted]": true})
        );
    }

    #[test]
    fn ordinary_text_is_kept_as_it_is() {
        let r = Redactor::new(["a-configured-key-0000"]);
        for text in [
            "build passed: 3 files compiled, ünïcode ✓",
            "task-abcdefghijklmnopqrstu", // `sk-` inside a word
            "sk-short",
            "the bearer of bad news",
            "Bearer x",
            "",
        ] {
            let kept = r.redact(text);
            assert!(matches!(kept, std::borrow::Cow::Borrowed(_)), "{text}");
        }
    }
}

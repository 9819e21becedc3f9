//! Making outside text safe for a terminal: what a model, a tool, a file or a verifier
//! wrote is printed with its control characters shown as escapes, never sent raw.
//!
//! A file name or a summary holding `ESC ] 0 ; … BEL` would set the window title,
//! `ESC [ 2 J` clear the screen, OSC 52 write the clipboard, and a `\r` or `\n` inside a
//! one-line preview forge a timeline line of its own. Every such character becomes visible
//! text (`\x1b`, `\r`, `\u{202e}`), so the reader sees what was there.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether the text is shown on one line or as a block of lines.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Layout {
    /// A timeline line, a list row, a message: `\n` and `\t` are escaped too.
    OneLine,
    /// A block meant to span lines (a run's final output): `\n` and `\t` are kept.
    Block,
}

/// The text with every character a terminal would act on escaped: C0 controls (but `\n`
/// and `\t` in a [`Layout::Block`]), DEL, C1 controls and the bidirectional overrides and
/// isolates that reorder what is shown. Borrows when there is nothing to escape.
pub(crate) fn terminal_safe(text: &str, layout: Layout) -> Cow<'_, str> {
    if !text.chars().any(|c| needs_escape(c, layout)) {
        return Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !needs_escape(c, layout) {
            safe.push(c);
            continue;
        }
        match c {
            '\n' => safe.push_str("\\n"),
            '\r' => safe.push_str("\\r"),
            '\t' => safe.push_str("\\t"),
            c if u32::from(c) < 0x80 => {
                let _ = write!(safe, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(safe, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(safe)
}

/// One-line text made safe (the common case), owned.
pub(crate) fn one_line(text: &str) -> String {
    terminal_safe(text, Layout::OneLine).into_owned()
}

fn needs_escape(c: char, layout: Layout) -> bool {
    match c {
        '\n' | '\t' => layout == Layout::OneLine,
        // C0 controls, DEL and C1 controls; then the bidi embeddings, overrides, isolates.
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}' => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{Layout, terminal_safe};

    #[test]
    fn ordinary_text_is_kept_as_it_is_without_a_copy() {
        for text in ["greet/__init__.py", "Hello, wörld — ok ✓", ""] {
            let safe = terminal_safe(text, Layout::OneLine);
            assert!(matches!(safe, std::borrow::Cow::Borrowed(_)), "{text}");
            assert_eq!(safe, text);
        }
        assert_eq!(terminal_safe("a\n\tb", Layout::Block), "a\n\tb");
    }

    #[test]
    fn controls_become_visible_escapes() {
        let hostile = "x\u{1b}]0;pwned\u{7}\r#99 forged\n\u{1b}[2J\u{7f}\u{9b}\u{202e}\u{2066}";
        let one = terminal_safe(hostile, Layout::OneLine);
        assert_eq!(
            one,
            "x\\x1b]0;pwned\\x07\\r#99 forged\\n\\x1b[2J\\x7f\\u{9b}\\u{202e}\\u{2066}"
        );
        let block = terminal_safe(hostile, Layout::Block);
        assert!(block.contains("forged\n\\x1b[2J"), "{block}");
        for text in [one, block] {
            assert!(!text.chars().any(|c| c != '\n' && (c.is_control())), "{text}");
        }
    }
}

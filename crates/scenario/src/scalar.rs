//! Where each character of a YAML string value sits in the file it was read from.
//!
//! A gate or an inline template is checked as the string YAML made of it, but a caret
//! must point into the file. The value differs from its source text in every style but
//! plain single-line: quotes, `''` in single quotes, escapes (`\"`, `\t`, `\x41`,
//! `\u00e9`, an escaped line break) in double quotes, indentation and folded line breaks
//! in multi-line plain, quoted and block (`|`, `>`) scalars. [`offsets`] walks the value
//! and the scalar's source together: every character of the value is either the same
//! character in the source or a decoded escape, and the source may additionally hold
//! syntax the value lacks (quotes, indentation, line breaks, escape backslashes). The
//! result is checked: if the walk cannot account for every character, there is no map
//! and the caller points at the whole value instead of guessing.

/// For each byte offset of `value` (and one past its end), the byte offset in `text` it
/// was read from; `start..end` is the scalar's span in `text`. `None` when the value
/// cannot be traced through the source exactly.
pub fn offsets(text: &str, start: usize, end: usize, value: &str) -> Option<Vec<usize>> {
    let source = text.get(start..end.min(text.len()))?;
    // A double-quoted scalar's span starts at its opening quote; a block scalar's span
    // starts at its content, which may itself begin with a quote, so the value tells.
    let double = source.starts_with('"') && !value.starts_with('"');
    let src: Vec<(usize, char)> = source.char_indices().collect();
    let mut map = vec![0usize; value.len() + 1];
    let mut s = 0usize;
    for (v_at, v) in value.char_indices() {
        loop {
            let &(s_at, c) = src.get(s)?;
            if double && c == '\\' {
                match escape(&src, s)? {
                    Escape::Char(decoded, width) if decoded == v => {
                        fill(&mut map, v_at, v, start + s_at);
                        s += width;
                        break;
                    }
                    Escape::LineBreak(width) => {
                        s += width;
                        continue;
                    }
                    // An escape that decodes to something else: the walk has lost track.
                    Escape::Char(..) => return None,
                }
            }
            if c == v || (v == ' ' && c == '\n') {
                fill(&mut map, v_at, v, start + s_at);
                s += 1;
                break;
            }
            // Syntax the value does not hold: quotes, indentation, line breaks.
            if matches!(c, ' ' | '\t' | '\n' | '\r' | '\'' | '"') {
                s += 1;
                continue;
            }
            return None;
        }
    }
    map[value.len()] = start + src.get(s).map_or(source.len(), |&(at, _)| at);
    Some(map)
}

fn fill(map: &mut [usize], at: usize, c: char, to: usize) {
    for k in 0..c.len_utf8() {
        map[at + k] = to;
    }
}

enum Escape {
    /// The character an escape stands for, and how many source characters it spans.
    Char(char, usize),
    /// An escaped line break (`\` at the end of a line), with the next line's indentation.
    LineBreak(usize),
}

/// Decodes the YAML double-quoted escape at `src[at]` (a backslash).
fn escape(src: &[(usize, char)], at: usize) -> Option<Escape> {
    let next = src.get(at + 1)?.1;
    let simple = match next {
        '0' => Some('\0'),
        'a' => Some('\u{7}'),
        'b' => Some('\u{8}'),
        't' | '\t' => Some('\t'),
        'n' => Some('\n'),
        'v' => Some('\u{b}'),
        'f' => Some('\u{c}'),
        'r' => Some('\r'),
        'e' => Some('\u{1b}'),
        ' ' => Some(' '),
        '"' => Some('"'),
        '/' => Some('/'),
        '\\' => Some('\\'),
        'N' => Some('\u{85}'),
        '_' => Some('\u{a0}'),
        'L' => Some('\u{2028}'),
        'P' => Some('\u{2029}'),
        _ => None,
    };
    if let Some(c) = simple {
        return Some(Escape::Char(c, 2));
    }
    let digits = match next {
        'x' => 2,
        'u' => 4,
        'U' => 8,
        '\n' | '\r' => {
            let mut width = 2;
            if next == '\r' && src.get(at + 2).is_some_and(|&(_, c)| c == '\n') {
                width += 1;
            }
            while src.get(at + width).is_some_and(|&(_, c)| c == ' ' || c == '\t') {
                width += 1;
            }
            return Some(Escape::LineBreak(width));
        }
        _ => return None,
    };
    let hex: String = src.get(at + 2..at + 2 + digits)?.iter().map(|&(_, c)| c).collect();
    let code = u32::from_str_radix(&hex, 16).ok()?;
    Some(Escape::Char(char::from_u32(code)?, 2 + digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `yaml` (one key `k`), and returns where `needle` of the value sits in the file.
    fn locate(yaml: &str, needle: &str) -> Option<(usize, String)> {
        let node = crate::node::Node::parse(yaml, crate::SourceId(0)).expect("valid YAML");
        let value = node.get("k").expect("key k");
        let text = value.as_str().expect("a string");
        let map = offsets(
            yaml,
            value.pos.byte as usize,
            (value.pos.byte + value.pos.len) as usize,
            text,
        )?;
        let at = text.find(needle).expect("needle in value");
        let from = map[at];
        Some((from, yaml[from..].chars().take(needle.chars().count()).collect()))
    }

    #[test]
    fn every_style_maps_each_character_back_to_the_file() {
        let cases = [
            "k: a && bad = 1\n",
            "k: a &&\n  bad = 1\n",
            "k: 'a == ''x'' &&\n  bad = 1'\n",
            "k: \"a == \\\"x\\\" \\t&&\n  bad = 1\"\n",
            "k: \"\\x61 && \\\n  bad = 1\"\n",
            "k: \"\\u00e9 && bad = 1\"\n",
            "k: |\n  a &&\n  \tbad = 1\n",
            "k: >-\n  a &&\n\n  bad = 1\n",
            "k: >\n  a\n    more &&\n  bad = 1\n",
        ];
        for yaml in cases {
            let (at, found) = locate(yaml, "bad = 1").unwrap_or_else(|| panic!("no map: {yaml:?}"));
            assert_eq!(found, "bad = 1", "{yaml:?} mapped to byte {at}");
        }
    }

    #[test]
    fn a_value_the_source_cannot_explain_has_no_map() {
        assert_eq!(offsets("k: abc", 3, 6, "abd"), None);
        assert_eq!(offsets("k: \"\\x41\"", 3, 9, "B"), None);
    }
}

//! Line diffs for people: what changed between a recorded text and a new one (a prompt a
//! cassette does not hold, an output a fixture did not expect).
//!
//! A longest common subsequence over lines, bounded: texts past [`LINES_MAX`] lines are
//! compared from their first differing line with a window of that many lines, so a
//! diff never costs more than `LINES_MAX²` steps.

/// The most lines of each text a diff compares.
pub const LINES_MAX: usize = 400;

/// Unchanged lines shown around each change.
const CONTEXT: usize = 2;

/// The difference of `old` and `new` as `-` / `+` lines with a little context (` `), hunks
/// separated by `…`; empty when they are equal.
pub fn lines(old: &str, new: &str) -> String {
    if old == new {
        return String::new();
    }
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // Lines in common at both ends are not compared, only shown as context.
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail =
        a[head..].iter().rev().zip(b[head..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (mid_a, mid_b) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let (mid_a, cut_a) = window(mid_a);
    let (mid_b, cut_b) = window(mid_b);
    let mut ops: Vec<(char, &str)> = a[..head].iter().map(|l| (' ', *l)).collect();
    ops.extend(script(mid_a, mid_b));
    if cut_a + cut_b > 0 {
        ops.push(('…', ""));
    } else {
        ops.extend(a[a.len() - tail..].iter().map(|l| (' ', *l)));
    }
    let mut out = String::new();
    let mut skipped = false;
    for (i, (op, line)) in ops.iter().enumerate() {
        let near = ops[i.saturating_sub(CONTEXT)..(i + CONTEXT + 1).min(ops.len())]
            .iter()
            .any(|(o, _)| *o != ' ');
        if *op == '…' {
            out.push_str(&format!("… ({} more lines not compared)\n", cut_a + cut_b));
        } else if *op != ' ' || near {
            if skipped && !out.is_empty() {
                out.push_str("…\n");
            }
            skipped = false;
            out.push(*op);
            out.push_str(line);
            out.push('\n');
        } else {
            skipped = true;
        }
    }
    if out.is_empty() {
        // Line splitting hides a trailing newline: the texts differ only there.
        out.push_str("(the texts differ only in their line ends)\n");
    }
    out
}

fn window<'a>(lines: &'a [&'a str]) -> (&'a [&'a str], usize) {
    if lines.len() > LINES_MAX {
        (&lines[..LINES_MAX], lines.len() - LINES_MAX)
    } else {
        (lines, 0)
    }
}

/// The edit script turning `a` into `b`: removed lines (`-`) before added ones (`+`) in
/// each changed stretch, unchanged lines (` `) between.
fn script<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<(char, &'a str)> {
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] =
                if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            out.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if j == m || (i < n && lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(('-', a[i]));
            i += 1;
        } else {
            out.push(('+', b[j]));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::lines;

    #[test]
    fn a_changed_line_is_shown_with_its_context() {
        let old = "one\ntwo\nthree\nfour\nfive\nsix\nseven\n";
        let new = "one\ntwo\nthree\nFOUR\nfive\nsix\nseven\n";
        assert_eq!(lines(old, new), " two\n three\n-four\n+FOUR\n five\n six\n");
    }

    #[test]
    fn equal_texts_have_no_diff_and_added_lines_are_marked() {
        assert_eq!(lines("a\nb\n", "a\nb\n"), "");
        assert_eq!(lines("a\n", "a\nb\n"), " a\n+b\n");
        assert_eq!(lines("", "x"), "+x\n");
    }

    #[test]
    fn distant_changes_are_separate_hunks() {
        let old: String = (0..20).map(|i| format!("l{i}\n")).collect();
        let new = old.replace("l2\n", "L2\n").replace("l17\n", "L17\n");
        let d = lines(&old, &new);
        assert!(d.contains("-l2\n+L2\n"), "{d}");
        assert!(d.contains("…\n"), "{d}");
        assert!(d.contains("-l17\n+L17\n"), "{d}");
        assert!(!d.contains("l9"), "{d}");
    }

    #[test]
    fn long_texts_are_compared_in_a_bounded_window() {
        let old: String = (0..5000).map(|i| format!("line {i}\n")).collect();
        let new: String = (0..5000).map(|i| format!("LINE {i}\n")).collect();
        let d = lines(&old, &new);
        assert!(d.contains("more lines not compared"), "{}", &d[d.len() - 200..]);
    }
}

//! The tool loop's pure parts: the textual protocol's blocks, and the conversation bound.

#![allow(clippy::unwrap_used)]

use baton_engine::model::{ToolCall, ToolReply, Turn};
use baton_runners::tool_loop::{bounded, parse_tool_blocks};
use serde_json::json;

#[test]
fn tool_blocks_are_read_in_order_and_bad_ones_say_why() {
    let text = "Let me look.\n```tool\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}}\n```\nand\n```tool\n{\"name\": 3}\n```\n```tool\nnot json\n```\n```tool_result\nignored\n```\n```tool\n{\"name\": \"finish\"}\n```\n";
    let calls = parse_tool_blocks(text, 2);
    assert_eq!(calls.len(), 4, "{calls:?}");
    let first = calls[0].as_ref().unwrap();
    assert_eq!((first.id.as_str(), first.name.as_str()), ("text_2_0", "read_file"));
    assert_eq!(first.arguments, json!({"path": "a.txt"}));
    assert!(calls[1].as_ref().unwrap_err().contains("string `name`"));
    assert!(calls[2].as_ref().unwrap_err().contains("not valid JSON"));
    assert_eq!(calls[3].as_ref().unwrap().arguments, json!({}), "no arguments means none");
    let open = parse_tool_blocks("```tool\n{\"name\": \"finish\"}\n", 1);
    assert!(open[0].as_ref().unwrap_err().contains("not closed"));
    assert!(parse_tool_blocks("no tools here", 1).is_empty());
}

fn read(n: usize, bytes: usize) -> [Turn; 2] {
    let id = format!("c{n}");
    [
        Turn::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: id.clone(),
                name: "read_file".into(),
                arguments: json!({"path": "f"}),
            }],
        },
        Turn::Tools {
            results: vec![ToolReply {
                call_id: id,
                name: "read_file".into(),
                content: "x".repeat(bytes),
                is_error: false,
            }],
        },
    ]
}

#[test]
fn a_long_conversation_drops_its_oldest_tool_results_first() {
    let turns: Vec<Turn> = (0..10).flat_map(|n| read(n, 100_000)).collect();
    assert_eq!(bounded(&turns, 2_000_000), turns, "under the bound nothing changes");
    let kept = bounded(&turns, 350_000);
    let sizes: Vec<usize> = kept
        .iter()
        .filter_map(|t| match t {
            Turn::Tools { results } => Some(results[0].content.len()),
            _ => None,
        })
        .collect();
    // The newest three results fit; the older ones became short notes.
    assert!(sizes[..7].iter().all(|s| *s < 200), "{sizes:?}");
    assert_eq!(&sizes[7..], &[100_000, 100_000, 100_000]);
    let Turn::Tools { results } = &kept[1] else { panic!("a tools turn") };
    assert!(results[0].content.contains("100000 bytes of this `read_file` result were dropped"));
    assert_eq!(kept.len(), turns.len(), "every turn stays, in order: ids still pair up");
    // However small the bound, the newest turn stays whole.
    let tiny = bounded(&turns, 10);
    let Some(Turn::Tools { results }) = tiny.last() else { panic!("a tools turn") };
    assert_eq!(results[0].content.len(), 100_000);
}

#[test]
fn the_names_a_users_tool_may_not_take_are_the_tool_loops_own() {
    let own: Vec<String> =
        baton_runners::tool_loop::tool_specs().into_iter().map(|s| s.name).collect();
    assert_eq!(own, baton_scenario::check::BUILT_IN_TOOLS, "keep the scenario's list in step");
}

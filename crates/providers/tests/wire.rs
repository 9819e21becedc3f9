//! The stream parsers on real recordings of the services (tests/wire, see its README), and
//! the SSE parser under arbitrary chunking.

#![allow(clippy::unwrap_used)]

use baton_providers::{Reply, Stop, StreamError, anthropic, openai, sse};
use proptest::prelude::*;
use serde_json::json;

fn fixture(path: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/wire/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn openai_reply(path: &str) -> Result<Reply, StreamError> {
    let mut a = openai::Assembler::new();
    for e in sse::parse_all(&fixture(path)) {
        a.push(&e)?;
    }
    assert!(a.is_done(), "{path}: [DONE] arrives");
    a.finish()
}

fn anthropic_reply(path: &str) -> Result<Reply, StreamError> {
    let mut a = anthropic::Assembler::new();
    for e in sse::parse_all(&fixture(path)) {
        a.push(&e)?;
    }
    a.finish()
}

#[test]
fn openai_one_tool_call() {
    let r = openai_reply("openai/one_tool_call.sse").unwrap();
    assert_eq!(r.stop, Stop::ToolUse);
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].id, "call_7PhhveOvvpPK53s1fV8TWhoV");
    assert_eq!(r.tool_calls[0].name, "GetWeatherArgs");
    assert_eq!(
        r.tool_calls[0].arguments,
        json!({"city": "Edinburgh", "country": "GB", "units": "c"})
    );
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (76, 24));
}

#[test]
fn openai_two_parallel_tool_calls() {
    let r = openai_reply("openai/two_parallel_tool_calls.sse").unwrap();
    assert_eq!(r.stop, Stop::ToolUse);
    let names: Vec<&str> = r.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["GetWeatherArgs", "get_stock_price"]);
    assert_eq!(
        r.tool_calls[0].arguments,
        json!({"city": "Edinburgh", "country": "UK", "units": "c"})
    );
    assert_eq!(r.tool_calls[1].arguments, json!({"ticker": "AAPL", "exchange": "NASDAQ"}));
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (149, 60));
}

#[test]
fn openai_text_with_usage_chunk() {
    let r = openai_reply("openai/text_with_usage_chunk.sse").unwrap();
    assert_eq!(r.stop, Stop::EndTurn);
    assert!(r.text.starts_with("I'm unable to provide real-time weather updates."), "{}", r.text);
    assert!(r.tool_calls.is_empty());
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (14, 30));
}

#[test]
fn anthropic_basic_response_ignores_ping() {
    let events = sse::parse_all(&fixture("anthropic/basic_response.sse"));
    assert!(events.iter().any(|e| e.event == "ping"), "the recording has a ping");
    let r = anthropic_reply("anthropic/basic_response.sse").unwrap();
    assert_eq!(r.stop, Stop::EndTurn);
    assert!(!r.text.is_empty());
}

#[test]
fn anthropic_tool_use_assembles_input_json_deltas() {
    let r = anthropic_reply("anthropic/tool_use_response.sse").unwrap();
    assert_eq!(r.stop, Stop::ToolUse);
    assert!(r.text.starts_with("I'll check the current weather in Paris"), "{}", r.text);
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].name, "get_weather");
    assert_eq!(r.tool_calls[0].arguments, json!({"location": "Paris"}));
    assert_eq!(r.usage.output_tokens, 65);
}

#[test]
fn anthropic_cut_off_tool_call_is_an_error() {
    let err = anthropic_reply("anthropic/incomplete_partial_json_response.sse").unwrap_err();
    assert!(matches!(err, StreamError::TruncatedToolCall { .. }), "{err}");
}

#[test]
fn anthropic_refusal_is_surfaced() {
    let r = anthropic_reply("anthropic/refusal_response.sse").unwrap();
    assert!(r.text.is_empty());
    assert_eq!(r.stop, Stop::Refusal(Some("This request was refused due to policy.".to_owned())));
}

#[test]
fn sse_fields_follow_the_standard() {
    let text = "\u{feff}: a comment\r\nevent: greet\r\ndata: one\r\ndata:two\rid: 7\n\ndata\n\nretry: 3000\nevent: ignored without data\n\nid: bad\0id\ndata: x\n\ndata: cut at the end";
    let events = sse::parse_all(text.as_bytes());
    assert_eq!(events.len(), 3);
    assert_eq!(
        (events[0].event.as_str(), events[0].data.as_str(), events[0].id.as_deref()),
        ("greet", "one\ntwo", Some("7"))
    );
    assert_eq!(
        (events[1].event.as_str(), events[1].data.as_str()),
        ("message", ""),
        "a bare `data` field holds an empty line"
    );
    assert_eq!(events[2].id.as_deref(), Some("7"), "an id with NUL is ignored");
    assert_eq!(events[2].retry, Some(3000));
    assert_eq!(events[2].event, "message", "an event type without data is dropped at dispatch");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// However the bytes are cut, the same events come out.
    #[test]
    fn chunking_never_changes_the_events(
        lines in prop::collection::vec(
            prop_oneof![
                "data: [a-zé😀 {}\":,]{0,12}".prop_map(|s| s),
                "event: [a-z_]{1,8}".prop_map(|s| s),
                "id: [0-9]{1,3}".prop_map(|s| s),
                Just(": comment".to_owned()),
                Just(String::new()),
            ],
            0..30,
        ),
        endings in prop::collection::vec(prop_oneof![Just("\n"), Just("\r"), Just("\r\n")], 30),
        cuts in prop::collection::vec(0usize..400, 0..12),
        bom in any::<bool>(),
    ) {
        let mut text = String::new();
        if bom {
            text.push('\u{feff}');
        }
        for (i, line) in lines.iter().enumerate() {
            text.push_str(line);
            text.push_str(endings[i % endings.len()]);
        }
        let bytes = text.as_bytes();
        let whole = sse::parse_all(bytes);
        let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
        points.sort_unstable();
        let mut parser = sse::Parser::new();
        let mut pieces = Vec::new();
        let mut from = 0;
        for p in points.into_iter().chain(std::iter::once(bytes.len())) {
            parser.feed(&bytes[from..p], &mut pieces);
            from = p;
        }
        parser.finish();
        prop_assert_eq!(pieces, whole);
    }

    #[test]
    fn the_parser_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..500)) {
        let _ = sse::parse_all(&bytes);
    }
}

#[test]
fn every_recording_parses_the_same_byte_by_byte() {
    for path in [
        "openai/one_tool_call.sse",
        "openai/two_parallel_tool_calls.sse",
        "openai/text_with_usage_chunk.sse",
        "anthropic/basic_response.sse",
        "anthropic/tool_use_response.sse",
        "anthropic/incomplete_partial_json_response.sse",
        "anthropic/refusal_response.sse",
    ] {
        let bytes = fixture(path);
        let mut parser = sse::Parser::new();
        let mut events = Vec::new();
        for b in &bytes {
            parser.feed(std::slice::from_ref(b), &mut events);
        }
        assert_eq!(events, sse::parse_all(&bytes), "{path}");
    }
}

#[test]
fn an_empty_chunk_keeps_a_pending_cr_from_its_lf() {
    // Found by the chunking property: "…\r" + "" + "\n" is one line end, not two.
    let mut parser = sse::Parser::new();
    let mut events = Vec::new();
    for chunk in [&b"data: x\r"[..], b"", b"\n"] {
        parser.feed(chunk, &mut events);
    }
    parser.finish();
    assert!(events.is_empty(), "an event without its blank line is not dispatched: {events:?}");
}

/// An OpenAI stream from its `data:` payloads, assembled.
fn openai_stream(chunks: &[&str]) -> Result<Reply, StreamError> {
    let text: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    let mut a = openai::Assembler::new();
    for e in sse::parse_all(text.as_bytes()) {
        a.push(&e)?;
    }
    a.finish()
}

#[test]
fn openai_refusals_are_kept_like_anthropics() {
    // The refusal arrives in `delta.refusal`, then the stream ends with `stop`.
    let streamed = openai_stream(&[
        r#"{"id":"c","choices":[{"index":0,"delta":{"refusal":"I can't help "}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"refusal":"with that."}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        "[DONE]",
    ])
    .unwrap();
    assert_eq!(streamed.stop, Stop::Refusal(Some("I can't help with that.".to_owned())));
    assert!(streamed.text.is_empty(), "a refusal is not an answer: {:?}", streamed.text);
    let whole = openai::from_response(&json!({"choices": [{"message": {"content": null, "refusal": "No."}, "finish_reason": "stop"}]})).unwrap();
    assert_eq!(whole.stop, Stop::Refusal(Some("No.".to_owned())));
}

#[test]
fn an_empty_choices_array_is_a_clear_error_not_a_dropped_stream() {
    let whole = openai::from_response(&json!({"id": "c", "choices": []})).unwrap_err();
    assert!(matches!(whole, StreamError::Malformed(_)), "{whole:?}");
    assert!(whole.to_string().contains("no choices"), "{whole}");
    let streamed = openai_stream(&[
        r#"{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}"#,
        "[DONE]",
    ])
    .unwrap_err();
    assert!(streamed.to_string().contains("without any choice"), "{streamed}");
    // A stream cut before [DONE] is still incomplete (and retried).
    let cut = openai_stream(&[r#"{"id":"c","choices":[]}"#]).unwrap_err();
    assert_eq!(cut, StreamError::Incomplete);
}

#[test]
fn a_cut_answer_reports_max_tokens_over_both_apis() {
    let cut = openai_stream(&[
        r#"{"id":"c","choices":[{"index":0,"delta":{"content":"{\"answer\": \"Par"}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        "[DONE]",
    ])
    .unwrap();
    assert_eq!(cut.stop, Stop::MaxTokens);
    let anthropic = anthropic::from_response(&json!({"id": "m", "model": "c", "content": [{"type": "text", "text": "{\"answer\": \"Par"}], "stop_reason": "max_tokens", "usage": {"input_tokens": 3, "output_tokens": 5}})).unwrap();
    assert_eq!(anthropic.stop, Stop::MaxTokens);
}

//! Streaming parser throughput: SSE parsing plus OpenAI and Anthropic assembly, in MB/s.
//!
//! Run with `cargo bench -p baton-providers`. Target (issue: model providers): the parser is
//! never the bottleneck — at least 100 MB/s.

use std::hint::black_box;

use baton_providers::{anthropic, openai, sse};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// A long streamed answer: many small text deltas, as a real stream sends them.
fn stream() -> Vec<u8> {
    let mut s = String::new();
    for i in 0..20_000 {
        s.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"token {i} \"}},\"finish_reason\":null}}]}}\n\n"
        ));
    }
    s.push_str("data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    s.into_bytes()
}

/// The same answer as an Anthropic Messages stream.
fn anthropic_stream() -> Vec<u8> {
    let mut s = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"m\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    );
    for i in 0..20_000 {
        s.push_str(&format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"token {i} \"}}}}\n\n"
        ));
    }
    s.push_str("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":20000}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s.into_bytes()
}

fn parse(c: &mut Criterion) {
    let bytes = stream();
    let mut group = c.benchmark_group("stream");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("sse_parse_4k_chunks", |b| {
        b.iter(|| {
            let mut parser = sse::Parser::new();
            let mut events = Vec::new();
            for chunk in bytes.chunks(4096) {
                parser.feed(black_box(chunk), &mut events);
            }
            black_box(events.len())
        });
    });
    group.bench_function("sse_parse_and_assemble_openai", |b| {
        b.iter(|| {
            let mut parser = sse::Parser::new();
            let mut events = Vec::new();
            let mut assembler = openai::Assembler::new();
            for chunk in bytes.chunks(4096) {
                parser.feed(black_box(chunk), &mut events);
                for e in events.drain(..) {
                    assembler.push(&e).expect("valid chunk");
                }
            }
            black_box(assembler.finish().expect("complete").text.len())
        });
    });
    let bytes = anthropic_stream();
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("sse_parse_and_assemble_anthropic", |b| {
        b.iter(|| {
            let mut parser = sse::Parser::new();
            let mut events = Vec::new();
            let mut assembler = anthropic::Assembler::new();
            for chunk in bytes.chunks(4096) {
                parser.feed(black_box(chunk), &mut events);
                for e in events.drain(..) {
                    assembler.push(&e).expect("valid event");
                }
            }
            black_box(assembler.finish().expect("complete").text.len())
        });
    });
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);

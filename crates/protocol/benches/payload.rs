//! Checking a payload (depth, line breaks) before it is stored or sent: once per client
//! publication and per backend answer, so its cost grows with the document. Large documents
//! are the messaging-system study's case (`herald bench fetch`: 130 KB from a backend).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use herald_protocol::json::payload;
use serde_json::value::RawValue;

/// A conversation's messages, about `size` bytes: mostly string content, as real documents are.
fn document(size: usize) -> String {
    let mut messages = Vec::new();
    let mut length = 0;
    while length < size {
        let n = messages.len();
        let m = format!(
            r#"{{"id":{n},"from":"user-{}","at":{},"text":"Are we still on for the review? I moved the \"numbers\" into the sheet.","read":{}}}"#,
            n % 17,
            1_795_000_000 + n * 37,
            n.is_multiple_of(3)
        );
        length += m.len() + 1;
        messages.push(m);
    }
    format!(r#"{{"messages":[{}]}}"#, messages.join(","))
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("payload");
    for size in [64, 2_048, 130_000] {
        let raw: Box<RawValue> = serde_json::from_str(&document(size)).unwrap();
        group.throughput(Throughput::Bytes(raw.get().len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &raw, |b, raw| {
            b.iter(|| payload(raw).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Fan-out hot path without sockets: one publication through the broker and hub into N
//! subscribers' queues, then each session drains its queue into a frame buffer (the work a
//! transport does before its write). Throughput is in deliveries.

use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use herald_protocol::ChannelName;
use herald_server::{publish, session::Session, Config, Node};

fn fanout(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("fanout");
    let channel = ChannelName::new("bench").unwrap();
    let data = Bytes::from_static(br#"{"text":"this is a chat message!","user":"bench"}"#);
    for subscribers in [100usize, 1_000, 10_000] {
        let (node, mut sessions): (Arc<Node>, Vec<Session>) = rt.block_on(async {
            let node = Node::with_memory_broker(Config::default().validate().unwrap());
            let mut sessions = Vec::with_capacity(subscribers);
            for _ in 0..subscribers {
                let mut s = Session::new(&node);
                let mut reply = Vec::new();
                s.handle_frame(br#"{"id":1,"subscribe":{"channel":"bench"}}"#, &mut reply)
                    .await
                    .unwrap();
                sessions.push(s);
            }
            (node, sessions)
        });
        let mut frame = Vec::with_capacity(4096);
        group.throughput(Throughput::Elements(subscribers as u64));
        group.bench_function(BenchmarkId::new("publish_and_drain", subscribers), |b| {
            b.iter(|| {
                rt.block_on(publish::publish(&node, &channel, data.clone(), None))
                    .unwrap();
                for s in &mut sessions {
                    frame.clear();
                    s.write_deliveries(&mut frame, 64 * 1024).unwrap();
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, fanout);
criterion_main!(benches);

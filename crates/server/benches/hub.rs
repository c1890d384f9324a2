//! Joining and leaving a channel with many local subscribers: the hub's own work (issue
//! #30: a join or leave must not copy or scan the channel's whole member list). Each
//! iteration adds `n` subscribers to one channel, then removes them all, in the order they
//! came; the time is per member (one join and one leave). No publication is in flight, so
//! what this shows is the search a leave made through the list (a copy of the list while a
//! fan-out job holds it is the other cost, tested in `hub::members`).

use std::{sync::Arc, time::Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use herald_protocol::ChannelName;
use herald_server::{
    queue::{Position, Queue},
    Config, Node,
};

fn join_and_leave(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let node =
        rt.block_on(async { Node::with_memory_broker(Config::default().validate().unwrap()) });
    let channel = ChannelName::new("bench").unwrap();
    let mut group = c.benchmark_group("hub");
    group.sample_size(10);
    for n in [1_000u64, 10_000, 40_000] {
        let members: Vec<_> = (0..n)
            .map(|_| (Arc::new(Queue::new(1 << 16)), Arc::new(Position::default())))
            .collect();
        group.throughput(Throughput::Elements(n));
        group.bench_function(BenchmarkId::new("join_then_leave", n), |b| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    rt.block_on(async {
                        for (i, (queue, position)) in members.iter().enumerate() {
                            node.hub
                                .subscribe(
                                    &node.broker,
                                    &channel,
                                    i as u64,
                                    queue.clone(),
                                    position.clone(),
                                    false,
                                )
                                .await
                                .unwrap();
                        }
                        for i in 0..n {
                            node.hub.unsubscribe(&node.broker, &channel, i).await;
                        }
                    });
                }
                started.elapsed()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, join_and_leave);
criterion_main!(benches);

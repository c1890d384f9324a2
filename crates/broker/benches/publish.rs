//! Acknowledged publications per second for each store and durability policy, with many
//! concurrent publishers (throughput) and with one (latency: with the durable store a
//! publication is fanned out when its commit returns, so this is also fan-out delay).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use herald_broker::{
    DurableBroker, MemoryBroker, PublicationSink, SharedBroker, StreamPolicy, SyncPolicy,
};
use herald_protocol::{ChannelName, Epoch, Publication};

struct Discard;

impl PublicationSink for Discard {
    fn on_publication(&self, _: &ChannelName, _: &Epoch, _: &Publication) {}
}

fn brokers(dir: &std::path::Path) -> Vec<(&'static str, SharedBroker)> {
    let open = |name: &str, sync| -> SharedBroker {
        DurableBroker::open(&dir.join(name), sync, Arc::new(Discard)).unwrap()
    };
    vec![
        ("memory", MemoryBroker::new(Arc::new(Discard))),
        ("durable-none", open("none", SyncPolicy::None)),
        ("durable-interval", open("interval", SyncPolicy::Interval)),
        ("durable-group", open("group", SyncPolicy::Group)),
        ("durable-always", open("always", SyncPolicy::Always)),
    ]
}

/// `publishers` tasks each publish `each` messages (to 16 channels); returns the elapsed time.
async fn run(broker: &SharedBroker, publishers: usize, each: usize) -> Duration {
    let data = Bytes::from_static(br#"{"text":"this is a chat message!","user":"bench"}"#);
    let started = Instant::now();
    let tasks: Vec<_> = (0..publishers)
        .map(|p| {
            let (broker, data) = (broker.clone(), data.clone());
            tokio::spawn(async move {
                let channel = ChannelName::new(&format!("bench:{}", p % 16)).unwrap();
                for _ in 0..each {
                    broker
                        .publish(&channel, data.clone(), StreamPolicy::default())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed()
}

fn publish(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let brokers = rt.block_on(async { brokers(dir.path()) });
    let mut throughput = c.benchmark_group("acknowledged_publications");
    const PUBLISHERS: usize = 256;
    throughput.throughput(Throughput::Elements(PUBLISHERS as u64));
    for (name, broker) in &brokers {
        throughput.bench_function(BenchmarkId::new("256_publishers", name), |b| {
            b.iter_custom(|rounds| rt.block_on(run(broker, PUBLISHERS, rounds as usize)))
        });
    }
    throughput.finish();
    let mut latency = c.benchmark_group("publish_latency");
    latency.throughput(Throughput::Elements(1));
    for (name, broker) in &brokers {
        latency.bench_function(BenchmarkId::new("1_publisher", name), |b| {
            b.iter_custom(|rounds| rt.block_on(run(broker, 1, rounds as usize)))
        });
    }
    latency.finish();
}

criterion_group!(benches, publish);
criterion_main!(benches);

//! Publications per second through the Redis broker with 64 concurrent publishers (16
//! channels), and a lone publisher's mean time per publication, against a running Redis:
//!
//! ```text
//! cargo run --release -p herald-broker-redis --example redis_publish_rate -- redis://127.0.0.1:6379
//! ```
//!
//! Prints `RATE MEAN_US`. For comparing builds of the scripts (docs/deployment.md quotes
//! it for the rollback check): run the builds alternately, a few times each.

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use herald_broker::{conformance::Recorder, Broker, PublicationSink, StreamPolicy};
use herald_broker_redis::{RedisBroker, RedisOptions};
use herald_protocol::ChannelName;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .expect("usage: redis_publish_rate REDIS_URL");
    let sink = Arc::new(Recorder::default()) as Arc<dyn PublicationSink>;
    let prefix = format!("rate{}", std::process::id());
    let broker = RedisBroker::start(RedisOptions::at(url, prefix), sink)
        .await
        .expect("redis answers");
    let data = Bytes::from_static(br#"{"text":"this is a chat message!","user":"bench"}"#);
    let started = Instant::now();
    let publishers: Vec<_> = (0..64)
        .map(|p| {
            let (broker, data) = (broker.clone(), data.clone());
            tokio::spawn(async move {
                let channel = ChannelName::new(&format!("room:{}", p % 16)).expect("valid");
                for _ in 0..600 {
                    let policy = StreamPolicy::default();
                    broker
                        .publish(&channel, data.clone(), policy)
                        .await
                        .expect("published");
                }
            })
        })
        .collect();
    for p in publishers {
        p.await.expect("publisher ran");
    }
    let rate = 64.0 * 600.0 / started.elapsed().as_secs_f64();
    let channel = ChannelName::new("solo").expect("valid");
    let started = Instant::now();
    for _ in 0..3000 {
        let policy = StreamPolicy::default();
        broker
            .publish(&channel, data.clone(), policy)
            .await
            .expect("published");
    }
    let mean_us = started.elapsed().as_secs_f64() / 3000.0 * 1e6;
    println!("{rate:.0} {mean_us:.1}");
}

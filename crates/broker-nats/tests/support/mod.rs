//! What the NATS tests share: names, a node on a NATS server, waiting for a condition.
#![allow(dead_code)]

use std::sync::Arc;

use herald_broker::{conformance::Recorder, default_policies, PublicationSink};
use herald_broker_nats::{testkit::NatsServer, NatsBroker, NatsOptions};
use herald_protocol::ChannelName;

pub fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

pub fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

pub async fn node(nats: &NatsServer) -> (Arc<NatsBroker>, Arc<Recorder>) {
    let sink = Arc::new(Recorder::default());
    let broker = NatsBroker::start(
        NatsOptions::at(nats.url(), "herald"),
        default_policies(),
        sink.clone() as Arc<dyn PublicationSink>,
    )
    .await
    .unwrap();
    (broker, sink)
}

/// Waits until `done` holds, looking every few milliseconds, at most `within`.
pub async fn eventually(within: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    true
}

//! The contract of a broker several nodes share (Redis, NATS), as tests: each node is a
//! broker of its own on the same store.

use std::sync::Arc;

use bytes::Bytes;

use super::{ch, Recorder};
use crate::{HistoryQuery, SharedBroker, StreamPolicy};

/// Three nodes on one store, each with its recorder. Eight publishers on each of the first
/// two write one channel at once (every publication a race between the nodes): both hear
/// 1..=800 once, in order, in one epoch; the third, which never subscribed, is handed
/// nothing and reads the same history.
pub async fn nodes_share_one_order(nodes: [(SharedBroker, Arc<Recorder>); 3]) {
    let [(a, seen_a), (b, seen_b), (c_node, seen_c)] = nodes;
    let c = ch("shared:room");
    a.subscribe(&c).await.unwrap();
    b.subscribe(&c).await.unwrap();
    let mut publishers = Vec::new();
    for broker in [a.clone(), b.clone()] {
        for _ in 0..8 {
            let (broker, c) = (broker.clone(), c.clone());
            publishers.push(tokio::spawn(async move {
                for i in 0..50 {
                    broker
                        .publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
                        .await
                        .unwrap();
                }
            }));
        }
    }
    for p in publishers {
        p.await.unwrap();
    }
    let all: Vec<u64> = (1..=800).collect();
    assert_eq!(seen_a.await_offsets("shared:room", 800).await, all);
    assert_eq!(seen_b.await_offsets("shared:room", 800).await, all);
    let epochs: std::collections::HashSet<String> = seen_a
        .0
        .lock()
        .iter()
        .chain(seen_b.0.lock().iter())
        .map(|r| r.1.clone())
        .collect();
    assert_eq!(epochs.len(), 1, "one epoch for both nodes: {epochs:?}");
    let h = c_node.history(&c, HistoryQuery::newest(3)).await.unwrap();
    assert_eq!(h.position.offset, 800);
    assert_eq!(
        h.publications.iter().map(|p| p.offset).collect::<Vec<_>>(),
        [798, 799, 800]
    );
    assert!(seen_c.0.lock().is_empty(), "a node that never subscribed");
}

//! Concurrent publishers through the HTTP API still produce one order, seen by everyone.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::json;

use crate::support::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]
    #[test]
    fn concurrent_publishers_keep_one_order(publishers in 2usize..6, each in 5usize..30) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let server = Arc::new(start(config()).await);
            let mut watchers = Vec::new();
            for _ in 0..3 {
                let mut c = server.client().await;
                c.subscribe("order", None).await;
                watchers.push(c);
            }
            let tasks: Vec<_> = (0..publishers).map(|p| {
                let server = server.clone();
                tokio::spawn(async move {
                    let mut mine = Vec::new();
                    for i in 0..each {
                        mine.push((server.publish("order", json!([p, i])).await.0, i));
                    }
                    mine
                })
            }).collect();
            let mut by_offset = std::collections::BTreeMap::new();
            for (p, t) in tasks.into_iter().enumerate() {
                let mine = t.await.unwrap();
                prop_assert!(mine.windows(2).all(|w| w[0].0 < w[1].0), "publisher {} saw offsets go back", p);
                for (offset, i) in mine {
                    by_offset.insert(offset, json!([p, i]));
                }
            }
            let n = (publishers * each) as u64;
            prop_assert_eq!(by_offset.keys().copied().collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>());
            for w in &mut watchers {
                for offset in 1..=n {
                    let (_, got, data) = w.next_pub().await;
                    prop_assert_eq!(got, offset);
                    prop_assert_eq!(&data, &by_offset[&offset]);
                }
            }
            Arc::into_inner(server).unwrap().stop().await.unwrap();
            Ok(())
        })?;
    }
}

/// A channel past the inline limit is written by several fan-out threads, mostly straight
/// to the sockets; subscribers that join mid-stream replay history while live publications
/// race in. Everyone must see every offset once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_channel_fanned_out_by_threads_reaches_everyone_in_order() {
    const TOTAL: u64 = 60;
    let mut c = config();
    c.fanout_threads = 3;
    let server = Arc::new(start(c).await);
    let mut early = Vec::new();
    for _ in 0..150 {
        let mut client = server.client().await;
        client.subscribe("big", None).await;
        early.push(client);
    }
    let (_, epoch) = server.publish("big", json!(1)).await;
    let publisher = {
        let server = server.clone();
        tokio::spawn(async move {
            for i in 2..=TOTAL {
                server.publish("big", json!(i)).await;
            }
        })
    };
    let mut late = Vec::new();
    for _ in 0..20 {
        let mut client = server.client().await;
        let replayed = offsets(&client.subscribe("big", Some((0, &epoch))).await);
        late.push((client, replayed));
    }
    publisher.await.unwrap();
    for client in early.iter_mut() {
        let mut seen = Vec::new();
        while seen.len() < TOTAL as usize {
            seen.push(client.next_pub().await.1);
        }
        assert_eq!(seen, (1..=TOTAL).collect::<Vec<_>>());
    }
    for (client, mut seen) in late {
        let mut client = client;
        while seen.last().copied().unwrap_or(0) < TOTAL {
            seen.push(client.next_pub().await.1);
        }
        assert_eq!(
            seen,
            (1..=TOTAL).collect::<Vec<_>>(),
            "history then live, once each"
        );
    }
}

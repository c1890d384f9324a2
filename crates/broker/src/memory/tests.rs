use std::{sync::Arc, time::Duration};

use herald_protocol::Since;

use super::*;

use crate::conformance::Recorder;

fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

fn data(i: u64) -> Bytes {
    Bytes::from(i.to_string())
}

fn since(offset: u64, epoch: &Epoch) -> Option<Since> {
    Some(Since {
        offset,
        epoch: Some(epoch.clone()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fulfils_the_broker_contract() {
    crate::conformance::run_all(|sink| MemoryBroker::new(sink)).await;
}

#[tokio::test]
async fn memory_presence_fulfils_the_presence_contract() {
    crate::conformance::run_presence(|| crate::MemoryPresence::new()).await;
}

#[tokio::test(start_paused = true)]
async fn history_expires_by_age_but_the_position_is_remembered() {
    let broker = MemoryBroker::new(Arc::new(Recorder::default()));
    let c = ch("a");
    let policy = StreamPolicy {
        history_ttl: Duration::from_secs(10),
        meta_ttl: Duration::from_secs(100),
        ..Default::default()
    };
    let pos = broker.publish(&c, data(1), policy).await.unwrap();
    tokio::time::advance(Duration::from_secs(11)).await;
    broker.sweep();
    let h = broker
        .history(
            &c,
            HistoryQuery {
                since: None,
                limit: 10,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert!(h.publications.is_empty());
    assert_eq!(h.position, pos, "epoch and offset outlive the history");
    // A client that had offset 1 is up to date; one that had 0 lost a publication: it
    // reads from the oldest kept (none) while the top says 1 (a resume reports the gap).
    let at_top = HistoryQuery {
        since: since(1, &pos.epoch),
        limit: 10,
        max_bytes: None,
    };
    assert!(broker.history(&c, at_top).await.is_ok());
    let behind = HistoryQuery {
        since: since(0, &pos.epoch),
        limit: 10,
        max_bytes: None,
    };
    let from_start = broker.history(&c, behind).await.unwrap();
    assert!(from_start.publications.is_empty());
    assert_eq!(from_start.position.offset, 1);
    tokio::time::advance(Duration::from_secs(100)).await;
    broker.sweep();
    assert_eq!(broker.channel_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn subscribed_streams_keep_their_epoch() {
    let broker = MemoryBroker::new(Arc::new(Recorder::default()));
    let c = ch("a");
    broker.subscribe(&c).await.unwrap();
    let before = broker
        .history(&c, HistoryQuery::default())
        .await
        .unwrap()
        .position;
    tokio::time::advance(Duration::from_secs(48 * 3600)).await;
    broker.sweep();
    let after = broker
        .history(&c, HistoryQuery::default())
        .await
        .unwrap()
        .position;
    assert_eq!(before, after);
    broker.unsubscribe(&c).await.unwrap();
    tokio::time::advance(Duration::from_secs(400)).await;
    broker.sweep();
    assert_eq!(broker.channel_count(), 0);
}

mod concurrency {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// However publishers interleave, offsets are 1..=n without gaps or repeats, the sink
        /// sees them in that order, and each publisher's own publications keep its order.
        #[test]
        fn concurrent_publishers_share_one_order(publishers in 1usize..8, each in 1usize..60) {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).build().unwrap();
            rt.block_on(async {
                let sink = Arc::new(Recorder::default());
                let broker = MemoryBroker::new(sink.clone());
                let c = ch("race");
                let tasks: Vec<_> = (0..publishers).map(|p| {
                    let broker = broker.clone();
                    let c = c.clone();
                    tokio::spawn(async move {
                        let mut mine = Vec::new();
                        for i in 0..each {
                            let payload = Bytes::from(format!("[{p},{i}]"));
                            mine.push(broker.publish(&c, payload, StreamPolicy::default()).await.unwrap().offset);
                        }
                        mine
                    })
                }).collect();
                let mut all = Vec::new();
                for t in tasks {
                    let mine = t.await.unwrap();
                    prop_assert!(mine.windows(2).all(|w| w[0] < w[1]));
                    all.extend(mine);
                }
                all.sort_unstable();
                let n = (publishers * each) as u64;
                prop_assert_eq!(all, (1..=n).collect::<Vec<_>>());
                let seen: Vec<u64> = sink.0.lock().iter().map(|r| r.2).collect();
                prop_assert_eq!(seen, (1..=n).collect::<Vec<_>>());
                let h = broker.history(&c, HistoryQuery { since: None, limit: usize::MAX, max_bytes: None }).await.unwrap();
                let offsets: Vec<u64> = h.publications.iter().map(|p| p.offset).collect();
                let keep = (n as usize).min(StreamPolicy::default().history_size) as u64;
                prop_assert_eq!(offsets, ((n - keep + 1)..=n).collect::<Vec<_>>());
                Ok(())
            })?;
        }
    }
}

/// Issue #38, item 3: streams made by reads are bounded.
#[tokio::test]
async fn streams_made_by_reads_are_bounded_by_the_sweep() {
    let broker = MemoryBroker::new(Arc::new(Recorder::default()));
    let shared: crate::SharedBroker = broker.clone();
    crate::conformance::reads_are_bounded_by_the_sweep(&shared, || broker.sweep()).await;
}

//! The contract as tests: every broker runs this same suite (the memory and durable ones
//! here; Redis and NATS brokers from their own crates with the `testkit` feature).
//!
//! Deliveries may reach the sink after `publish` returns (a networked broker hands them
//! over from its own connection), so the suite awaits them, with a deadline.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Publication, Since};
use parking_lot::Mutex;

use crate::{BrokerError, HistoryQuery, PublicationSink, SharedBroker, StreamPolicy};

mod presence;
mod shared;
pub use presence::run_presence;
pub use shared::nodes_share_one_order;

/// A sink that remembers what it was handed: (channel, epoch, offset), and each record.
#[derive(Debug, Default)]
pub struct Recorder(
    pub Mutex<Vec<(String, String, u64)>>,
    tokio::sync::Notify,
    Mutex<Vec<(String, Bytes)>>,
);

impl PublicationSink for Recorder {
    fn on_publication(&self, channel: &ChannelName, epoch: &Epoch, p: &Publication) {
        self.2.lock().push((channel.to_string(), p.record.clone()));
        self.0
            .lock()
            .push((channel.to_string(), epoch.to_string(), p.offset));
        self.1.notify_waiters();
    }
}

impl Recorder {
    /// Records handed over for one channel, in order.
    pub fn records(&self, channel: &str) -> Vec<Bytes> {
        self.2
            .lock()
            .iter()
            .filter(|r| r.0 == channel)
            .map(|r| r.1.clone())
            .collect()
    }

    /// Offsets handed over for one channel, in order.
    pub fn offsets(&self, channel: &str) -> Vec<u64> {
        self.0
            .lock()
            .iter()
            .filter(|r| r.0 == channel)
            .map(|r| r.2)
            .collect()
    }

    /// Waits (at most 10 s) until `count` publications of `channel` were handed over, then
    /// returns their offsets in order.
    /// Waits until `done` holds for what was handed over, at most `within`; whether it did.
    pub async fn wait_until(&self, within: Duration, done: impl Fn(&Self) -> bool) -> bool {
        tokio::time::timeout(within, async {
            loop {
                let notified = self.1.notified();
                if done(self) {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }

    pub async fn await_offsets(&self, channel: &str, count: usize) -> Vec<u64> {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let notified = self.1.notified();
                if self.offsets(channel).len() >= count {
                    return;
                }
                notified.await;
            }
        })
        .await;
        let seen = self.offsets(channel);
        assert!(
            waited.is_ok(),
            "{channel}: {} of {count} publications handed over: {seen:?}",
            seen.len()
        );
        seen
    }
}

/// Runs every check; `make` builds a fresh, empty broker around a sink.
mod once;

pub async fn run_all(make: impl Fn(Arc<dyn PublicationSink>) -> SharedBroker) {
    offsets_count_from_one_and_history_reads_since_a_position(&make).await;
    gaps_history_cannot_cover_are_unrecoverable(&make).await;
    removing_history_changes_the_epoch(&make).await;
    concurrent_publishers_share_one_order(&make).await;
    history_pages_are_bounded_in_bytes(&make).await;
    records_keep_their_sender(&make).await;
    once::a_key_publishes_once_per_channel_within_its_window(&make).await;
    once::keys_past_the_cap_forget_the_oldest(&make).await;
}

/// The retention the suite's channels are published with (the suite's own publishes read it
/// here too), for brokers that take each channel's retention from their
/// [`crate::Policies`] (as the server gives them, from the namespaces) rather than from each
/// publish: build them with this.
pub fn policies() -> crate::Policies {
    Arc::new(|channel| match channel.as_str() {
        "conformance:b" => StreamPolicy {
            history_size: 3,
            ..StreamPolicy::default()
        },
        "conformance:once-cap" => StreamPolicy {
            history_size: 10,
            ..StreamPolicy::default()
        },
        _ => StreamPolicy::default(),
    })
}

fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).expect("test channel names are valid")
}

fn since(offset: u64, epoch: &Epoch) -> Option<Since> {
    Some(Since {
        offset,
        epoch: Some(epoch.clone()),
    })
}

fn offsets(publications: &[Publication]) -> Vec<u64> {
    publications.iter().map(|p| p.offset).collect()
}

async fn offsets_count_from_one_and_history_reads_since_a_position(
    make: &impl Fn(Arc<dyn PublicationSink>) -> SharedBroker,
) {
    let sink = Arc::new(Recorder::default());
    let broker = make(sink.clone());
    let c = ch("conformance:a");
    broker.subscribe(&c).await.unwrap();
    let empty = broker.history(&c, HistoryQuery::default()).await.unwrap();
    assert_eq!(empty.position.offset, 0, "an unused channel is at offset 0");
    for i in 1..=5 {
        let pos = broker
            .publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
            .await
            .unwrap();
        assert_eq!(pos.offset, i);
        assert_eq!(
            pos.epoch, empty.position.epoch,
            "the epoch a reader saw is the one publications get"
        );
    }
    let epoch = empty.position.epoch;
    let h = broker
        .history(
            &c,
            HistoryQuery {
                since: since(2, &epoch),
                limit: 100,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(offsets(&h.publications), [3, 4, 5]);
    assert_eq!(h.publications[0].record, Bytes::from("3"));
    let paged = broker
        .history(
            &c,
            HistoryQuery {
                since: since(2, &epoch),
                limit: 2,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(offsets(&paged.publications), [3, 4]);
    let at_top = broker
        .history(
            &c,
            HistoryQuery {
                since: since(5, &epoch),
                limit: 100,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert!(at_top.publications.is_empty());
    let newest = broker
        .history(
            &c,
            HistoryQuery {
                since: None,
                limit: 2,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(offsets(&newest.publications), [4, 5]);
    assert_eq!(
        sink.await_offsets("conformance:a", 5).await,
        [1, 2, 3, 4, 5]
    );
}

async fn gaps_history_cannot_cover_are_unrecoverable(
    make: &impl Fn(Arc<dyn PublicationSink>) -> SharedBroker,
) {
    let broker = make(Arc::new(Recorder::default()));
    let c = ch("conformance:b");
    // History holds 3 (see `policies`).
    let policy = policies()(&c);
    let mut epoch = None;
    for i in 1..=10 {
        epoch = Some(
            broker
                .publish(&c, Bytes::from(i.to_string()), policy)
                .await
                .unwrap()
                .epoch,
        );
    }
    let epoch = epoch.unwrap();
    // History holds 8, 9, 10: resuming after 7 works, after 6 would skip 7.
    let ok = broker
        .history(
            &c,
            HistoryQuery {
                since: since(7, &epoch),
                limit: 10,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(offsets(&ok.publications), [8, 9, 10]);
    let gap = broker
        .history(
            &c,
            HistoryQuery {
                since: since(6, &epoch),
                limit: 10,
                max_bytes: None,
            },
        )
        .await;
    assert!(matches!(gap, Err(BrokerError::Unrecoverable { current }) if current.offset == 10));
    let from_start = broker
        .history(
            &c,
            HistoryQuery {
                since: since(0, &epoch),
                limit: 10,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        offsets(&from_start.publications),
        [8, 9, 10],
        "offset 0 reads from the oldest kept; the first offset shows what is gone"
    );
    let wrong = broker
        .history(
            &c,
            HistoryQuery {
                since: since(9, &Epoch::new("other")),
                limit: 10,
                max_bytes: None,
            },
        )
        .await;
    assert!(
        matches!(wrong, Err(BrokerError::Unrecoverable { .. })),
        "another epoch is never trusted"
    );
    let wrong_at_top = broker
        .history(
            &c,
            HistoryQuery {
                since: since(10, &Epoch::new("other")),
                limit: 10,
                max_bytes: None,
            },
        )
        .await;
    assert!(
        matches!(wrong_at_top, Err(BrokerError::Unrecoverable { .. })),
        "another epoch is not trusted at the top either"
    );
    let future = broker
        .history(
            &c,
            HistoryQuery {
                since: since(11, &epoch),
                limit: 10,
                max_bytes: None,
            },
        )
        .await;
    assert!(matches!(future, Err(BrokerError::Unrecoverable { .. })));
    let any_epoch = Some(Since {
        offset: 8,
        epoch: None,
    });
    let h = broker
        .history(
            &c,
            HistoryQuery {
                since: any_epoch,
                limit: 10,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(offsets(&h.publications), [9, 10]);
}

async fn removing_history_changes_the_epoch(
    make: &impl Fn(Arc<dyn PublicationSink>) -> SharedBroker,
) {
    let broker = make(Arc::new(Recorder::default()));
    let c = ch("conformance:c");
    let before = broker
        .publish(&c, Bytes::from("1"), StreamPolicy::default())
        .await
        .unwrap();
    broker.remove_history(&c).await.unwrap();
    let after = broker
        .publish(&c, Bytes::from("2"), StreamPolicy::default())
        .await
        .unwrap();
    assert_eq!(after.offset, 1, "offsets restart with the new epoch");
    assert_ne!(after.epoch, before.epoch);
    // A reader that had nothing of the old epoch (offset 0) loses nothing: the new stream
    // replays from its start. (An empty channel's epoch is not stored, so a restart changes it.)
    let h = broker
        .history(
            &c,
            HistoryQuery {
                since: since(0, &before.epoch),
                limit: 10,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(offsets(&h.publications), [1]);
    assert_eq!(h.position.epoch, after.epoch);
}

async fn concurrent_publishers_share_one_order(
    make: &impl Fn(Arc<dyn PublicationSink>) -> SharedBroker,
) {
    let sink = Arc::new(Recorder::default());
    let broker = make(sink.clone());
    let c = ch("conformance:race");
    broker.subscribe(&c).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|p| {
            let (broker, c) = (broker.clone(), c.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for i in 0..50 {
                    let data = Bytes::from(format!("[{p},{i}]"));
                    mine.push(
                        broker
                            .publish(&c, data, StreamPolicy::default())
                            .await
                            .unwrap()
                            .offset,
                    );
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        let mine = t.await.unwrap();
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "one publisher's offsets only grow"
        );
        all.extend(mine);
    }
    all.sort_unstable();
    assert_eq!(all, (1..=400).collect::<Vec<_>>());
    assert_eq!(
        sink.await_offsets("conformance:race", 400).await,
        (1..=400).collect::<Vec<_>>(),
        "sinks see offset order"
    );
}

async fn history_pages_are_bounded_in_bytes(
    make: &impl Fn(Arc<dyn PublicationSink>) -> SharedBroker,
) {
    let broker = make(Arc::new(Recorder::default()));
    let c = ch("conformance:bytes");
    let mut epoch = None;
    for i in 1..=5u8 {
        let data = Bytes::from(vec![b'0' + i; 10]);
        let pos = broker
            .publish(&c, data, StreamPolicy::default())
            .await
            .unwrap();
        epoch = Some(pos.epoch);
    }
    let epoch = epoch.unwrap();
    let read = |since, max_bytes| {
        let broker = broker.clone();
        let c = c.clone();
        async move {
            let query = HistoryQuery {
                since,
                limit: 100,
                max_bytes: Some(max_bytes),
            };
            offsets(&broker.history(&c, query).await.unwrap().publications)
        }
    };
    assert_eq!(
        read(since(0, &epoch), 25).await,
        [1, 2],
        "the oldest that fit after a position"
    );
    assert_eq!(read(since(2, &epoch), 30).await, [3, 4, 5]);
    assert_eq!(
        read(None, 25).await,
        [4, 5],
        "the newest that fit without one"
    );
    assert_eq!(
        read(since(0, &epoch), 1).await,
        [1],
        "a page holds one publication even when it alone is larger than the bound"
    );
    assert_eq!(read(None, 1).await, [5]);
}

/// A record that carries its sender (a client's publication) comes back byte for byte,
/// live and from history, beside one that does not.
async fn records_keep_their_sender(make: &impl Fn(Arc<dyn PublicationSink>) -> SharedBroker) {
    let sink = Arc::new(Recorder::default());
    let broker = make(sink.clone());
    let c = ch("conformance:from");
    broker.subscribe(&c).await.unwrap();
    let records = [
        Publication::record(
            Bytes::from(r#"{"text":"hi"}"#),
            Some(br#"{"user":"42","info":{"name":"Ann"}}"#),
        ),
        Bytes::from("2"),
    ];
    for r in &records {
        broker
            .publish(&c, r.clone(), StreamPolicy::default())
            .await
            .unwrap();
    }
    sink.await_offsets("conformance:from", 2).await;
    assert_eq!(sink.records("conformance:from"), records);
    let h = broker.history(&c, HistoryQuery::newest(10)).await.unwrap();
    let stored: Vec<Bytes> = h.publications.into_iter().map(|p| p.record).collect();
    assert_eq!(stored, records);
}

/// For the embedded brokers (issue #38, item 3): however fast reads name new channels, one
/// `sweep` leaves at most [`crate::MAX_UNWRITTEN_STREAMS`] of the streams they made (the
/// longest unread go first, before their grace is over); a stream with a subscriber keeps
/// its epoch and one with publications its offsets.
pub async fn reads_are_bounded_by_the_sweep(broker: &SharedBroker, sweep: impl Fn()) {
    let ch = |name: &str| ChannelName::new(name).unwrap();
    let subscribed = ch("flood:subscribed");
    broker.subscribe(&subscribed).await.unwrap();
    let epoch = broker
        .history(&subscribed, HistoryQuery::default())
        .await
        .unwrap()
        .position
        .epoch;
    let published = ch("flood:published");
    broker
        .publish(&published, Bytes::from("1"), StreamPolicy::default())
        .await
        .unwrap();
    let made = crate::MAX_UNWRITTEN_STREAMS + 5_000;
    for i in 0..made {
        let c = ch(&format!("flood:{i}"));
        // As a poll does: subscribe, read the position, leave.
        broker.subscribe(&c).await.unwrap();
        broker.history(&c, HistoryQuery::default()).await.unwrap();
        broker.unsubscribe(&c).await.unwrap();
    }
    assert_eq!(broker.channel_count(), made + 2);
    sweep();
    // The subscribed stream counts among them; the published one does not.
    assert!(
        broker.channel_count() <= crate::MAX_UNWRITTEN_STREAMS + 1,
        "{} streams after a sweep",
        broker.channel_count()
    );
    let kept = broker
        .history(&subscribed, HistoryQuery::default())
        .await
        .unwrap();
    assert_eq!(kept.position.epoch, epoch, "a subscribed stream is kept");
    let h = broker
        .history(&published, HistoryQuery::default())
        .await
        .unwrap();
    assert_eq!(h.position.offset, 1, "a stream with publications is kept");
}

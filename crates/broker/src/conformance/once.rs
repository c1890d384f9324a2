//! Idempotent publishing: the same key publishes once per channel within its window, even
//! when both publishes come at once.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;

use super::{ch, offsets, Recorder};
use crate::{HistoryQuery, PublicationSink, SharedBroker, StreamPolicy};

pub(super) async fn a_key_publishes_once_per_channel_within_its_window(
    make: &impl Fn(Arc<dyn PublicationSink>) -> SharedBroker,
) {
    let sink = Arc::new(Recorder::default());
    let broker = make(sink.clone());
    let (c, other) = (ch("conformance:once"), ch("conformance:once-other"));
    let window = Duration::from_secs(60);
    let policy = StreamPolicy::default();
    let once = |channel, data: &'static str, key| {
        let broker = broker.clone();
        async move {
            broker
                .publish_once(&channel, Bytes::from(data), policy, key, window)
                .await
                .unwrap()
        }
    };
    let (first, repeat) = once(c.clone(), "1", "key-a").await;
    assert!(!repeat, "a new key publishes");
    let (again, repeat) = once(c.clone(), "1 again", "key-a").await;
    assert!(repeat, "the same key is a repeat");
    assert_eq!(
        again, first,
        "a repeat answers with the first one's position"
    );
    let (next, repeat) = once(c.clone(), "2", "key-b").await;
    assert!(!repeat);
    assert_eq!(next.offset, first.offset + 1);
    let (elsewhere, repeat) = once(other.clone(), "1", "key-a").await;
    assert!(!repeat, "keys are per channel");
    assert_eq!(elsewhere.offset, 1);

    // Two at once with one key: one publication.
    let (a, b) = tokio::join!(once(c.clone(), "3", "key-c"), once(c.clone(), "3", "key-c"));
    assert_eq!(a.0, b.0, "both answer with one position");
    assert!(
        a.1 != b.1,
        "one published, the other is its repeat: {a:?} {b:?}"
    );

    let history = broker.history(&c, HistoryQuery::newest(100)).await.unwrap();
    assert_eq!(offsets(&history.publications), [1, 2, 3]);
    let data: Vec<&[u8]> = history.publications.iter().map(|p| &p.record[..]).collect();
    assert_eq!(data, [&b"1"[..], b"2", b"3"], "a repeat stores nothing");
}

/// A publisher that sends a new key every time holds at most
/// [`crate::once::KEYS_PER_CHANNEL`] keys per channel: past it, the oldest is forgotten (and
/// publishes again), the newest is still a repeat.
pub(super) async fn keys_past_the_cap_forget_the_oldest(
    make: &impl Fn(Arc<dyn PublicationSink>) -> SharedBroker,
) {
    let broker = make(Arc::new(Recorder::default()));
    let c = ch("conformance:once-cap");
    let window = Duration::from_secs(60);
    // History holds 10 (see `policies`).
    let policy = super::policies()(&c);
    let once = |key: String| {
        let (broker, c) = (broker.clone(), c.clone());
        async move {
            broker
                .publish_once(&c, Bytes::from_static(b"{}"), policy, &key, window)
                .await
                .unwrap()
                .1
        }
    };
    assert!(!once("k0".into()).await);
    // The cap's worth more, a chunk at a time (a durable store commits each chunk at once).
    let cap = crate::once::KEYS_PER_CHANNEL;
    for chunk in (1..=cap).collect::<Vec<_>>().chunks(500) {
        let mut publishing = tokio::task::JoinSet::new();
        for i in chunk {
            publishing.spawn(once(format!("k{i}")));
        }
        let repeats = publishing.join_all().await;
        assert!(repeats.iter().all(|r| !r), "every new key publishes");
    }
    assert!(
        once(format!("k{cap}")).await,
        "the newest key is still a repeat"
    );
    assert!(
        !once("k0".into()).await,
        "the oldest, past the cap, was forgotten"
    );
}

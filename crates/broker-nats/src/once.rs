//! Idempotent publishing on NATS: each key a channel saw is a message of its own subject
//! in the `PREFIX_once` stream, claimed by a compare-and-set before the publication and
//! marked done with its position after it. Two publishes with one key, on any nodes: one
//! claims it, the other waits for its outcome and answers with the same position.
//!
//! JetStream's own de-duplication (`Nats-Msg-Id`) is not used: it cannot say where the
//! first publication went once it left history, and it has no bound per channel. Here a
//! key is forgotten once its window passes, or once the channel has had
//! [`KEYS_PER_CHANNEL`] publications since, whichever comes first, like the other brokers'
//! cap of that many keys per channel.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::{
    jetstream::{
        context::PublishErrorKind,
        stream::{Config, DirectGetErrorKind, DiscardPolicy, StorageType, Stream},
    },
    HeaderMap,
};
use bytes::Bytes;
use herald_broker::{once::KEYS_PER_CHANNEL, BrokerError, StreamPolicy};
use herald_protocol::{ChannelName, Epoch, StreamPosition};

use crate::{store::Store, unavailable};

/// Longest a key is kept: windows longer than this are cut to it.
pub const LONGEST_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How long a claim holds before another node may take the key over: a claimant that died
/// mid-publish leaves its key free after this.
const CLAIM_HOLDS: Duration = Duration::from_secs(15);

/// How often a publish that waits on another's claim looks again.
const LOOK_AGAIN: Duration = Duration::from_millis(5);

const EXPECTED_LAST: &str = "Nats-Expected-Last-Subject-Sequence";

pub(crate) async fn open_stream(store: &Store) -> Result<Stream, BrokerError> {
    store
        .js
        .get_or_create_stream(Config {
            name: store.names.once_stream(),
            subjects: vec![store.names.once_subjects()],
            max_messages_per_subject: 1,
            max_age: LONGEST_WINDOW,
            discard: DiscardPolicy::Old,
            allow_direct: true,
            storage: StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| BrokerError::Unavailable(format!("nats jetstream: {e}")))
}

/// What a key's message says.
#[derive(Debug, PartialEq)]
enum Seen {
    /// A node is publishing with it until this time (ms since the Unix epoch).
    Claimed(u64),
    /// Published at this position; the key holds until this time.
    Done(StreamPosition, u64),
}

impl Seen {
    fn encode(&self) -> Bytes {
        match self {
            Seen::Claimed(until) => format!("c {until}").into(),
            Seen::Done(p, until) => format!("d {until} {} {}", p.offset, p.epoch.as_str()).into(),
        }
    }

    fn decode(payload: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(payload).ok()?;
        let mut parts = text.split(' ');
        match (parts.next()?, parts.next()?.parse().ok()?) {
            ("c", until) => Some(Seen::Claimed(until)),
            ("d", until) => {
                let offset = parts.next()?.parse().ok()?;
                let epoch = Epoch::checked(parts.next()?)?;
                Some(Seen::Done(StreamPosition { offset, epoch }, until))
            }
            _ => None,
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Publishes `data` to `channel` unless `key` was published there within `window`: the
/// position, and whether it is a repeat.
pub(crate) async fn publish_once(
    store: &Store,
    keys: &Stream,
    channel: &ChannelName,
    data: &Bytes,
    policy: &StreamPolicy,
    key: &str,
    window: Duration,
) -> Result<(StreamPosition, bool), BrokerError> {
    let subject = store.names.once(channel, key);
    let window = window.min(LONGEST_WINDOW);
    loop {
        let (seq, seen) = match keys.direct_get_last_for_subject(subject.as_str()).await {
            Ok(message) => (message.sequence, Seen::decode(&message.payload)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => (0, None),
            Err(e) => return Err(unavailable(e)),
        };
        let now = now_ms();
        match seen {
            Some(Seen::Done(position, until))
                if until > now && still_kept(store, channel, policy, &position).await? =>
            {
                return Ok((position, true));
            }
            Some(Seen::Claimed(until)) if until > now => {
                tokio::time::sleep(LOOK_AGAIN).await;
                continue;
            }
            _ => {}
        }
        // Free (never seen, expired, forgotten, or its claimant gone): claim it.
        let claim = Seen::Claimed(now + CLAIM_HOLDS.as_millis() as u64);
        let claimed = match put(store, &subject, seq, claim.encode()).await? {
            Some(claimed) => claimed,
            // Another publish claimed it first: look at its outcome.
            None => continue,
        };
        return match store.publish(channel, data, policy).await {
            Ok((position, _)) => {
                let done = Seen::Done(position.clone(), now_ms() + window.as_millis() as u64);
                // Were this lost, repeats would wait out the claim and publish again: say
                // so, but the publication itself stands.
                if let Err(e) = put(store, &subject, claimed, done.encode()).await {
                    tracing::warn!(%channel, error = %e, "nats: an idempotency key was not recorded");
                }
                Ok((position, false))
            }
            Err(e) => {
                // Free the key again for a retry.
                let _ = put(store, &subject, claimed, Bytes::new()).await;
                Err(e)
            }
        };
    }
}

/// Whether the channel had fewer than [`KEYS_PER_CHANNEL`] publications since `position`,
/// in the same epoch, as this node last knows it.
async fn still_kept(
    store: &Store,
    channel: &ChannelName,
    policy: &StreamPolicy,
    position: &StreamPosition,
) -> Result<bool, BrokerError> {
    let top = store.top(channel, policy).await?;
    Ok(top.epoch == position.epoch && top.offset < position.offset + KEYS_PER_CHANNEL as u64)
}

/// Writes `payload` as the key's message if its newest is still `expected` (0: none): its
/// sequence, or `None` if another got there first.
async fn put(
    store: &Store,
    subject: &str,
    expected: u64,
    payload: Bytes,
) -> Result<Option<u64>, BrokerError> {
    let mut headers = HeaderMap::new();
    headers.insert(EXPECTED_LAST, expected.to_string().as_str());
    let acked = store
        .js
        .publish_with_headers(subject.to_string(), headers, payload)
        .await
        .map_err(unavailable)?
        .await;
    match acked {
        Ok(ack) => Ok(Some(ack.sequence)),
        Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(None),
        Err(e) => Err(unavailable(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_key_says_reads_back() {
        let epoch = Epoch::checked("abcd").unwrap();
        for seen in [
            Seen::Claimed(17),
            Seen::Done(StreamPosition { offset: 9, epoch }, 42),
        ] {
            assert_eq!(Seen::decode(&seen.encode()), Some(seen));
        }
        assert_eq!(Seen::decode(b""), None);
        assert_eq!(Seen::decode(b"d 1 x"), None);
    }
}

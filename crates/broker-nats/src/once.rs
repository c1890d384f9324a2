//! Idempotent publishing on NATS, in two parts:
//!
//! - The publication carries its key as JetStream's message id (`Nats-Msg-Id`), so
//!   JetStream stores one of two publishes with the key, on any nodes, at once or within
//!   its duplicate window (two minutes), and tells the other where the first one went.
//!   That holds whatever became of the first publisher: dead, cut off, or so slow that its
//!   answer never came.
//! - After it is stored, the key's record (its position, and until when it holds) is the
//!   one message of its subject in the `PREFIX_once` stream, so a repeat after the
//!   duplicate window, up to the key's window, is answered from it.
//!
//! A key is forgotten once its window passes, or once the channel has had
//! [`KEYS_PER_CHANNEL`] publications since, whichever comes first, like the other brokers'
//! cap of that many keys per channel. A key JetStream still remembers whose publication is
//! forgotten (or has left history) publishes anew, under an id of its own.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::stream::{Config, DiscardPolicy, StorageType, Stream};
use bytes::Bytes;
use herald_broker::{once::KEYS_PER_CHANNEL, BrokerError, StreamPolicy};
use herald_protocol::{ChannelName, Epoch, StreamPosition};

use crate::{
    store::{Published, Store},
    unavailable,
};

/// Longest a key is kept: windows longer than this are cut to it.
pub const LONGEST_WINDOW: Duration = Duration::from_secs(24 * 3600);

pub(crate) async fn open_stream(store: &Store) -> Result<Stream, BrokerError> {
    store
        .js
        .get_or_create_stream(Config {
            name: store.names.once_stream(),
            subjects: vec![store.names.once_subjects()],
            max_messages_per_subject: 1,
            max_age: LONGEST_WINDOW,
            discard: DiscardPolicy::Old,
            allow_direct: store.replicas == 1,
            num_replicas: store.replicas,
            storage: StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| BrokerError::Unavailable(format!("nats jetstream: {e}")))
}

/// A key's record: published at this position; the key holds until this time (ms since
/// the Unix epoch).
#[derive(Debug, PartialEq)]
struct Seen(StreamPosition, u64);

impl Seen {
    fn encode(&self) -> Bytes {
        let Seen(p, until) = self;
        format!("d {until} {} {}", p.offset, p.epoch.as_str()).into()
    }

    fn decode(payload: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(payload).ok()?;
        let mut parts = text.split(' ');
        if parts.next()? != "d" {
            return None;
        }
        let until = parts.next()?.parse().ok()?;
        let offset = parts.next()?.parse().ok()?;
        let epoch = Epoch::checked(parts.next()?)?;
        Some(Seen(StreamPosition { offset, epoch }, until))
    }
}

/// Decodes a key's record, for the fuzzer (see [`crate::decode_stored`]).
pub(crate) fn decode(payload: &[u8]) {
    let _ = Seen::decode(payload);
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
    let recorded = store
        .reader(keys)
        .newest(&subject)
        .await?
        .and_then(|message| Seen::decode(&message.payload));
    if let Some(Seen(position, until)) = recorded {
        if until > now_ms() && still_kept(store, channel, policy, &position).await? {
            return Ok((position, true));
        }
    }
    // The id names the channel too: JetStream's ids are per stream, keys per channel.
    let id = format!(
        "{}.{}",
        hex::encode(channel.as_str().as_bytes()),
        hex::encode(key.as_bytes())
    );
    let position = match store.publish(channel, data, policy, Some(&id)).await? {
        Published::New(position) => position,
        Published::Before(position) if still_kept(store, channel, policy, &position).await? => {
            return Ok((position, true));
        }
        // Remembered by JetStream but forgotten here: a new publication, under an id no
        // earlier one had.
        Published::Before(_) | Published::Gone => {
            let top = store.top(channel, policy).await?;
            let fresh = format!("{id}.{}.{}", top.epoch.as_str(), top.offset);
            match store.publish(channel, data, policy, Some(&fresh)).await? {
                Published::New(position) => position,
                Published::Before(position) => return Ok((position, true)),
                Published::Gone => {
                    return Err(BrokerError::Unavailable(
                        "nats: an idempotency key's publication left history at once".into(),
                    ))
                }
            }
        }
    };
    let record = Seen(position.clone(), now_ms() + window.as_millis() as u64);
    // Lost, it costs a repeat after JetStream's duplicate window its answer from the
    // record; the publication itself stands.
    if let Err(e) = record_key(store, &subject, record.encode()).await {
        tracing::warn!(%channel, error = %e, "nats: an idempotency key was not recorded");
    }
    Ok((position, false))
}

async fn record_key(store: &Store, subject: &str, record: Bytes) -> Result<(), BrokerError> {
    store
        .js
        .publish(subject.to_string(), record)
        .await
        .map_err(unavailable)?
        .await
        .map(|_| ())
        .map_err(unavailable)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_key_says_reads_back() {
        let epoch = Epoch::checked("abcd").unwrap();
        let seen = Seen(StreamPosition { offset: 9, epoch }, 42);
        assert_eq!(Seen::decode(&seen.encode()), Some(seen));
        assert_eq!(Seen::decode(b""), None);
        assert_eq!(Seen::decode(b"d 1 x"), None);
    }
}

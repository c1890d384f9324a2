use std::{fmt, sync::Arc};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Identifies one life of a channel's stream.
///
/// Offsets only mean something within an epoch. Whenever a store loses or resets a
/// channel's history (a memory store restarted, history removed through the API, data that
/// could not be restored), the channel gets a new epoch, so a client holding an old
/// position can tell that the gap cannot be filled.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Epoch(Arc<str>);

impl Epoch {
    /// Wraps an epoch string as read from a store or a client.
    pub fn new(epoch: &str) -> Self {
        Self(Arc::from(epoch))
    }

    /// An epoch read from somewhere others can write (a shared Redis): `None` unless it is
    /// 1 to 64 characters of `[0-9A-Za-z_-]`, which every framing carries unescaped.
    pub fn checked(epoch: &str) -> Option<Self> {
        let fits = (1..=64).contains(&epoch.len())
            && epoch
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        fits.then(|| Self::new(epoch))
    }

    /// A fresh random epoch: 12 characters of `[0-9a-z]`.
    pub fn random(mut next_u64: impl FnMut() -> u64) -> Self {
        const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
        let (mut a, mut b) = (next_u64(), next_u64());
        let s: String = (0..12)
            .map(|i| {
                let v = if i < 6 { &mut a } else { &mut b };
                let c = ALPHABET[(*v % 36) as usize] as char;
                *v /= 36;
                c
            })
            .collect();
        Self(Arc::from(s))
    }

    /// The epoch as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Epoch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Epoch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(Self::new(&s))
    }
}

/// Where a channel's stream stands: the offset of its newest publication (0 when it has
/// none yet) within an epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPosition {
    /// Offset of the newest publication; publications are numbered 1, 2, 3, …
    pub offset: u64,
    /// The stream's epoch.
    pub epoch: Epoch,
}

/// A client's resume point: "I have everything up to and including `offset`".
///
/// Without an epoch the client accepts whatever epoch the stream has now (for scripts
/// that only know an offset); with one, a different epoch means the gap is unrecoverable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Since {
    /// Last offset the client has.
    pub offset: u64,
    /// Epoch that offset belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
}

/// One publication in a channel, as stored and as delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// Position in the channel's stream (1-based, +1 each).
    pub offset: u64,
    /// What a broker stores, opaque to it: the payload (one complete JSON value, kept as its
    /// text so it is never re-parsed), or for a client's publication that says who sent it,
    /// [`FROM_MARK`], the sender (a JSON object), a zero byte and the payload. JSON text
    /// never starts with byte 1 nor holds a zero byte, so records stored before senders
    /// were kept read the same.
    pub record: Bytes,
}

/// The first byte of a record that carries its sender.
pub const FROM_MARK: u8 = 1;

/// The first byte of a record that carries a conflation key: [`KEY_MARK`], the key, a zero
/// byte, then the rest of the record (its sender, if any, and its payload).
pub const KEY_MARK: u8 = 2;

/// The longest conflation key.
pub const MAX_CONFLATION_KEY: usize = 128;

/// Whether `key` can be a conflation key: 1 to [`MAX_CONFLATION_KEY`] bytes of text
/// without control characters (so never a zero byte, which ends it in a record).
pub fn valid_conflation_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_CONFLATION_KEY && !key.chars().any(char::is_control)
}

impl Publication {
    /// A record of `data`, sent by `from` (a JSON object) when given.
    pub fn record(data: Bytes, from: Option<&[u8]>) -> Bytes {
        let Some(from) = from else { return data };
        let mut record = Vec::with_capacity(2 + from.len() + data.len());
        record.push(FROM_MARK);
        record.extend_from_slice(from);
        record.push(0);
        record.extend_from_slice(&data);
        Bytes::from(record)
    }

    /// A record of `data`, sent by `from` when given, with conflation key `key` when given
    /// (see [`Publication::conflation_key`]; checked with [`valid_conflation_key`]).
    pub fn keyed_record(data: Bytes, from: Option<&[u8]>, key: Option<&str>) -> Bytes {
        let inner = Self::record(data, from);
        let Some(key) = key else { return inner };
        debug_assert!(valid_conflation_key(key));
        let mut record = Vec::with_capacity(2 + key.len() + inner.len());
        record.push(KEY_MARK);
        record.extend_from_slice(key.as_bytes());
        record.push(0);
        record.extend_from_slice(&inner);
        Bytes::from(record)
    }

    /// Its conflation key: a later publication of the channel with the same key replaces
    /// it for a subscription that conflates and has not been sent it yet.
    pub fn conflation_key(&self) -> Option<&[u8]> {
        conflation_key(&self.record)
    }

    /// The payload: one JSON value.
    pub fn data(&self) -> &[u8] {
        self.parts().1
    }

    /// Who sent it (`{"user": …, "info": …}`), for a client's publication that says so.
    pub fn from(&self) -> Option<&[u8]> {
        self.parts().0
    }

    fn parts(&self) -> (Option<&[u8]>, &[u8]) {
        split_record(&self.record)
    }
}

/// A record's conflation key, if it has one.
pub fn conflation_key(record: &[u8]) -> Option<&[u8]> {
    split_key(record).0
}

/// A record's conflation key, and the rest of the record.
fn split_key(record: &[u8]) -> (Option<&[u8]>, &[u8]) {
    if record.first() != Some(&KEY_MARK) {
        return (None, record);
    }
    match record.iter().position(|b| *b == 0) {
        Some(zero) => (Some(&record[1..zero]), &record[zero + 1..]),
        None => (None, record),
    }
}

/// A record's sender and payload (past its conflation key, if it has one).
pub fn split_record(record: &[u8]) -> (Option<&[u8]>, &[u8]) {
    let (_, record) = split_key(record);
    if record.first() != Some(&FROM_MARK) {
        return (None, record);
    }
    match record.iter().position(|b| *b == 0) {
        Some(zero) => (Some(&record[1..zero]), &record[zero + 1..]),
        // Not a record Herald wrote; the readers that check records refuse it.
        None => (None, record),
    }
}

//! Long-poll sessions kept between requests. A long-poll answer parks its session here,
//! still subscribed, under a key the answer carries (`session`); the client's next request
//! sends the key back and takes the session up again with whatever queued meanwhile. So a
//! re-poll builds no session, joins and leaves no channel, and reads nothing from storage.
//!
//! A parked session waits `http.longpoll_grace` at most; then it is dropped, and a request
//! that comes later resumes from its cursor as if nothing had been parked. The key is 128
//! random bits, and a request takes the session up only with the same credentials (token,
//! subscription tokens, cookies), as the same client, and at the positions the session is at: anything else
//! (a stolen key, an answer that was lost so the client asks from an older position) drops
//! the parked session and starts afresh from the request's cursor, so nothing is lost.

use std::{
    collections::HashMap,
    hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState},
    sync::{Arc, Weak},
    time::Duration,
};

use herald_protocol::{ChannelName, Since};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{limits::AddressGuard, metrics::Reading, session::Session};

/// The key a long-poll answer carries as `session`: 32 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(u128);

/// Hashes a [`Key`] by taking 64 of its bits: they are random already (a key a client makes
/// up finds nothing, whatever bucket it lands in), so there is nothing for SipHash to add.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Sessions = HashMap<Key, Entry, BuildHasherDefault<KeyHasher>>;

impl Key {
    /// A new key, for a session parked for the first time.
    pub(super) fn random() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the operating system's random generator works");
        Self(u128::from_le_bytes(bytes))
    }

    /// The key a client sent; `None` if it cannot be one.
    pub fn parse(text: &str) -> Option<Self> {
        // A digit at a time, without the standard library's checks and radix arithmetic:
        // each long-poll that takes a session up reads one.
        if text.len() != 32 {
            return None;
        }
        let mut key = 0u128;
        for b in text.bytes() {
            let nibble = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                b'A'..=b'F' => b - b'A' + 10,
                _ => return None,
            };
            key = key << 4 | u128::from(nibble);
        }
        Some(Self(key))
    }

    /// The key's 32 hex digits, made without allocating (one per long-poll answer).
    pub fn hex(&self) -> KeyHex {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, digit) in out.iter_mut().enumerate() {
            *digit = DIGITS[(self.0 >> (124 - 4 * i) & 0xf) as usize];
        }
        KeyHex(out)
    }
}

/// A key as its 32 hex digits.
pub struct KeyHex([u8; 32]);

impl KeyHex {
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.hex().as_str())
    }
}

/// Who a request says it is, hashed: what a parked session is taken up with must match
/// what parked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials(u64);

/// A session waiting for its client's next long-poll.
#[derive(Debug)]
pub struct Resumed {
    pub session: Session,
    /// The client address's count of connections, kept while parked: a parked session is
    /// the same connection, not a new one.
    pub admitted: Option<AddressGuard>,
}

#[derive(Debug)]
struct Entry {
    resumed: Resumed,
    credentials: Credentials,
    until: Instant,
    /// The cursor of the answer that parked it: where a request that continues it exactly
    /// asks from.
    cursor: String,
}

#[derive(Debug)]
struct Inner {
    sessions: Mutex<Sessions>,
    hasher: RandomState,
    grace: Duration,
    /// How many were taken up: `[direct, routed]` (see [`Parked::take_exact`]).
    taken_up: [Counter; 2],
}

impl Inner {
    fn count(&self) -> usize {
        self.sessions.lock().len()
    }
}

/// A node's parked long-poll sessions: the long-poll transport's own state, which the
/// router hands its handlers.
#[derive(Debug, Clone)]
pub struct Parked(Arc<Inner>);

impl Parked {
    /// Parks sessions for `grace` (zero: never), and drops them all at `shutdown`; `count`
    /// says how many are parked, `taken_up` how many were taken up, directly and routed.
    pub fn new(
        grace: Duration,
        shutdown: CancellationToken,
        count: Reading,
        taken_up: [Counter; 2],
    ) -> Self {
        let parked = Self(Arc::new(Inner {
            sessions: Mutex::default(),
            hasher: RandomState::new(),
            grace,
            taken_up,
        }));
        count.follow(Arc::downgrade(&parked.0), Inner::count);
        if !grace.is_zero() && tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(sweep(Arc::downgrade(&parked.0), shutdown));
        }
        parked
    }

    /// Whether sessions are parked at all.
    pub fn enabled(&self) -> bool {
        !self.0.grace.is_zero()
    }

    /// The credentials a request carries (its connection token, subscription tokens and
    /// cookies), hashed with this node's secret key.
    pub fn credentials(
        &self,
        token: Option<&str>,
        sub_tokens: &[impl AsRef<str>],
        cookie: Option<&[u8]>,
    ) -> Credentials {
        let mut h = self.0.hasher.build_hasher();
        token.hash(&mut h);
        h.write_usize(sub_tokens.len());
        for t in sub_tokens {
            t.as_ref().hash(&mut h);
        }
        cookie.hash(&mut h);
        Credentials(h.finish())
    }

    /// Keeps `resumed` until a request takes it up with `key`, or the grace passes; its
    /// answer gave the client `cursor`.
    pub fn park(&self, key: Key, resumed: Resumed, credentials: Credentials, cursor: String) {
        let until = Instant::now() + self.0.grace;
        let entry = Entry {
            resumed,
            credentials,
            until,
            cursor,
        };
        let replaced = {
            let mut sessions = self.0.sessions.lock();
            sessions.insert(key, entry)
        };
        drop(replaced);
    }

    /// The session parked under `key`, if the request's `credentials` are the ones it was
    /// parked with, the `client` it continues (if it names one) is the session's, and it
    /// asks for exactly the session's channels (those its token subscribes it to may go
    /// unnamed) from exactly where the session is. A parked session that does not match is
    /// dropped: the request starts afresh from its cursor.
    pub fn take(
        &self,
        key: Key,
        credentials: Credentials,
        client: Option<&str>,
        channels: &[(ChannelName, Option<Since>)],
    ) -> Option<Resumed> {
        let entry = {
            let mut sessions = self.0.sessions.lock();
            sessions.remove(&key)?
        };
        let session = &entry.resumed.session;
        let fits = entry.credentials == credentials
            && entry.until > Instant::now()
            && client.is_none_or(|c| c == session.first_client())
            && session.continued_by(channels);
        if fits {
            self.0.taken_up[1].inc();
        }
        fits.then_some(entry.resumed)
    }

    /// The session parked under `key`, if the request's `credentials` and `client` are
    /// those of [`Parked::take`] and `continues` says the request asks from exactly the
    /// answer's cursor; otherwise it stays parked, for [`Parked::take`] to judge.
    pub fn take_exact(
        &self,
        key: Key,
        credentials: Credentials,
        client: Option<&str>,
        continues: impl FnOnce(&Session, &str) -> bool,
    ) -> Option<Resumed> {
        let mut sessions = self.0.sessions.lock();
        let entry = sessions.get(&key)?;
        let session = &entry.resumed.session;
        let fits = entry.credentials == credentials
            && entry.until > Instant::now()
            && client.is_none_or(|c| c == session.first_client())
            && continues(session, &entry.cursor);
        if !fits {
            return None;
        }
        let entry = sessions.remove(&key)?;
        drop(sessions);
        self.0.taken_up[0].inc();
        Some(entry.resumed)
    }
}

/// Drops sessions whose grace has passed (every second), and all of them at shutdown.
async fn sweep(parked: Weak<Inner>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            () = shutdown.cancelled() => true,
        };
        let Some(inner) = parked.upgrade() else {
            return;
        };
        let now = Instant::now();
        // Dropped outside the lock: a session's drop takes other locks and spawns its leave.
        let gone: Vec<Entry> = {
            let mut sessions = inner.sessions.lock();
            let gone = if stopping {
                sessions.drain().map(|(_, e)| e).collect()
            } else {
                let expired: Vec<Key> = sessions
                    .iter()
                    .filter(|(_, e)| e.until <= now)
                    .map(|(k, _)| *k)
                    .collect();
                expired.iter().filter_map(|k| sessions.remove(k)).collect()
            };
            gone
        };
        drop(gone);
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_and_nothing_else_is_one() {
        let key = Key::random();
        assert_eq!(Key::parse(&key.to_string()), Some(key));
        assert_eq!(key.to_string(), format!("{:032x}", key.0));
        assert_eq!(Key(0xf).to_string(), format!("{}f", "0".repeat(31)));
        assert_eq!(Key::parse("abc"), None);
        assert_eq!(Key::parse(&"g".repeat(32)), None);
        assert_eq!(Key::parse(&"+".repeat(32)), None);
        assert_eq!(Key::parse(&format!("-{}", "f".repeat(31))), None);
        assert_eq!(Key::parse(&"é".repeat(16)), None);
        let key = Key::parse("0123456789abcdefFEDCBA9876543210").unwrap();
        assert_eq!(key.0, 0x0123456789abcdef_fedcba9876543210);
    }
}

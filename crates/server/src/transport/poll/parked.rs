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
    hash::{BuildHasher, Hash, RandomState},
    sync::{Arc, Weak},
    time::Duration,
};

use herald_protocol::{ChannelName, Since};
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{limits::AddressGuard, session::Session};

/// The key a long-poll answer carries as `session`: 32 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(u128);

impl Key {
    /// A new key, for a session parked for the first time.
    pub(super) fn random() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the operating system's random generator works");
        Self(u128::from_le_bytes(bytes))
    }

    /// The key a client sent; `None` if it cannot be one.
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit());
        hex.then(|| u128::from_str_radix(text, 16).ok())
            .flatten()
            .map(Self)
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
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
}

#[derive(Debug)]
struct Inner {
    sessions: Mutex<HashMap<Key, Entry>>,
    hasher: RandomState,
    grace: Duration,
    /// How many are parked, for `/metrics`.
    count: Gauge,
}

impl Inner {
    fn counted(&self, sessions: &HashMap<Key, Entry>) {
        self.count.set(sessions.len() as i64);
    }
}

/// A node's parked long-poll sessions: the long-poll transport's own state, which the
/// router hands its handlers.
#[derive(Debug, Clone)]
pub struct Parked(Arc<Inner>);

impl Parked {
    /// Parks sessions for `grace` (zero: never), and drops them all at `shutdown`; `count`
    /// says how many are parked.
    pub fn new(grace: Duration, shutdown: CancellationToken, count: Gauge) -> Self {
        let parked = Self(Arc::new(Inner {
            sessions: Mutex::default(),
            hasher: RandomState::new(),
            grace,
            count,
        }));
        if !grace.is_zero() && tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(sweep(Arc::downgrade(&parked.0), shutdown));
        }
        parked
    }

    /// Whether sessions are parked at all.
    pub fn enabled(&self) -> bool {
        !self.0.grace.is_zero()
    }

    /// The credentials a request carries, hashed with this node's secret key.
    pub fn credentials(&self, parts: impl Hash) -> Credentials {
        Credentials(self.0.hasher.hash_one(parts))
    }

    /// Keeps `resumed` until a request takes it up with `key`, or the grace passes.
    pub fn park(&self, key: Key, resumed: Resumed, credentials: Credentials) {
        let until = Instant::now() + self.0.grace;
        let entry = Entry {
            resumed,
            credentials,
            until,
        };
        let replaced = {
            let mut sessions = self.0.sessions.lock();
            let replaced = sessions.insert(key, entry);
            self.0.counted(&sessions);
            replaced
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
            let entry = sessions.remove(&key);
            self.0.counted(&sessions);
            entry?
        };
        let session = &entry.resumed.session;
        let fits = entry.credentials == credentials
            && entry.until > Instant::now()
            && client.is_none_or(|c| c == session.first_client())
            && session.continued_by(channels);
        fits.then_some(entry.resumed)
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
            inner.counted(&sessions);
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
        assert_eq!(Key::parse("abc"), None);
        assert_eq!(Key::parse(&"g".repeat(32)), None);
        assert_eq!(Key::parse(&"+".repeat(32)), None);
    }
}

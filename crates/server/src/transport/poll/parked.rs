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
//! Parked sessions live in the store every polling transport shares ([`Waiting`]).

use std::{
    hash::{BuildHasher, Hash, Hasher, RandomState},
    sync::Arc,
    time::Duration,
};

use herald_protocol::{ChannelName, Since};
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::waiting::{Key, Store};
use crate::{limits::AddressGuard, session::Session};

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
    /// The cursor of the answer that parked it: where a request that continues it exactly
    /// asks from.
    cursor: String,
}

#[derive(Debug)]
struct Inner {
    /// The node's store of waiting sessions, which parked ones share with the Phoenix
    /// front's long-polls.
    sessions: Store,
    hasher: RandomState,
    grace: Duration,
    /// How many were taken up: `[direct, routed]` (see [`Parked::take_exact`]).
    taken_up: [Counter; 2],
}

/// A node's parked long-poll sessions: the long-poll transport's own state, which the
/// router hands its handlers.
#[derive(Debug, Clone)]
pub struct Parked(Arc<Inner>);

impl Parked {
    /// Parks sessions in `sessions` for `grace` (zero: never); `taken_up` counts how many
    /// were taken up, directly and routed.
    pub fn new(grace: Duration, sessions: Store, taken_up: [Counter; 2]) -> Self {
        Self(Arc::new(Inner {
            sessions,
            hasher: RandomState::new(),
            grace,
            taken_up,
        }))
    }

    /// The node's store of waiting sessions.
    pub fn store(&self) -> &Store {
        &self.0.sessions
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
            cursor,
        };
        self.0.sessions.insert(key, Box::new(entry), until);
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
        let entry = self.0.sessions.take(key, |v| v.is::<Entry>())?;
        let entry = entry.downcast::<Entry>().ok()?;
        let session = &entry.resumed.session;
        let fits = entry.credentials == credentials
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
        let entry = self.0.sessions.take(key, |entry| {
            let Some(entry) = entry.downcast_ref::<Entry>() else {
                return false;
            };
            let session = &entry.resumed.session;
            entry.credentials == credentials
                && client.is_none_or(|c| c == session.first_client())
                && continues(session, &entry.cursor)
        })?;
        let entry = entry.downcast::<Entry>().ok()?;
        self.0.taken_up[0].inc();
        Some(entry.resumed)
    }
}

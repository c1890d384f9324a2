//! The store contract every Herald broker fulfils, and the embedded memory broker.
//!
//! # The contract
//!
//! A broker keeps, per channel, a **stream**: an epoch, the offset of the newest
//! publication, and a bounded window of recent publications (history). It promises:
//!
//! 1. **Append and fan-out are one step per channel.** [`Broker::publish`] assigns the next
//!    offset (previous + 1, starting at 1), stores the publication in history, and hands it
//!    to the [`PublicationSink`] of every node that [subscribed](Broker::subscribe) to the
//!    channel. Publications of one channel reach each sink in offset order, with no offset
//!    skipped, even when many publishers race. A publication is handed to sinks only once
//!    it is stored as durably as the broker promises; where a failure can still take back
//!    something a client saw (a machine crash before a sync, a store restored from an older
//!    copy), the stream starts a new epoch afterwards, so no offset is ever reused for
//!    other data.
//! 2. **History is read since a position.** [`Broker::history`] returns the publications
//!    after a [`Since`] position, oldest first, or [`BrokerError::Unrecoverable`] when the
//!    epoch differs or history no longer reaches back that far: never a partial answer
//!    that looks complete.
//! 3. **The top position is always known.** A history query with `limit: 0` returns the
//!    stream position without publications, also for channels never published to
//!    (offset 0).
//! 4. **Epochs change when history is lost.** Whenever a stream's history is reset (removed
//!    through the API, lost on restart by a memory store, not fully restored from disk),
//!    the stream gets a new epoch and counts offsets from 1 again.
//!
//! Retention (how many publications, how old) is given per publish by the caller's
//! [`StreamPolicy`], so that namespaces can differ without the broker knowing them.
//!
//! Delivery to sinks is at most once; a node that notices a missing offset tells its
//! clients to resume from history (the `insufficient state` disconnect).

mod durable;
mod link;
mod memory;
pub mod once;
mod presence;
mod routed;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Publication, Since, StreamPosition};

/// The durable store's write-ahead log format, for the fuzzer.
pub use durable::wal;
pub use durable::{
    DurableBroker, OpenError, StoreOptions, SyncPolicy, DEFAULT_CHECKPOINT_BYTES,
    DEFAULT_SEGMENT_BYTES, DEFAULT_SYNC_INTERVAL, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES,
};
pub use link::{Engine, NodeLink, NodeRequests, SharedLink};
pub use memory::MemoryBroker;
pub use presence::{
    user_key, Member, MemoryPresence, PresenceEvents, PresenceStats, PresenceStore, Roster,
    SharedPresence,
};
pub use routed::Routed;

/// Receives the publications of the channels a node subscribed to.
///
/// Called by the broker in offset order per channel, possibly from several threads for
/// different channels. Must not block: it runs inside the broker's per-channel ordering.
pub trait PublicationSink: Send + Sync + 'static {
    /// A publication was appended to `channel`'s stream of epoch `epoch`.
    fn on_publication(&self, channel: &ChannelName, epoch: &Epoch, publication: &Publication);
}

/// How long a channel's history is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamPolicy {
    /// Most publications kept (0 = none: offsets still count, history stays empty).
    pub history_size: usize,
    /// Publications older than this are dropped.
    pub history_ttl: Duration,
    /// How long an idle stream's epoch and offset are remembered after its last
    /// publication, so clients can still resume with nothing to replay.
    pub meta_ttl: Duration,
}

impl Default for StreamPolicy {
    fn default() -> Self {
        Self {
            history_size: 1000,
            history_ttl: Duration::from_secs(300),
            meta_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

/// Each channel's retention as the node's configuration says (its namespace's rules).
/// Brokers get it at start, so that streams they load after a restart, or make for a
/// reader, keep their namespace's rules instead of [`StreamPolicy::default`] until their
/// next publication.
pub type Policies = Arc<dyn Fn(&ChannelName) -> StreamPolicy + Send + Sync>;

/// [`StreamPolicy::default`] for every channel.
pub fn default_policies() -> Policies {
    Arc::new(|_| StreamPolicy::default())
}

/// How long a broker remembers a stream nobody published to after its last reader or
/// subscriber left: long enough for a poller's next request to see the same epoch, short
/// enough that naming channels costs a client nothing lasting.
pub const EMPTY_STREAM_GRACE: Duration = Duration::from_secs(60);

/// Most streams nobody published to (made by readers and subscribers) a broker keeps past
/// their readers: beyond it, the longest unread are forgotten before their
/// [`EMPTY_STREAM_GRACE`] is over, so that reads naming new channels, however fast, never
/// grow the process by more than this many (a few hundred bytes each). Streams with a
/// subscriber are kept whatever their number.
pub const MAX_UNWRITTEN_STREAMS: usize = 50_000;

/// What to read from history.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HistoryQuery {
    /// Only publications after this position; `None` means the newest ones.
    pub since: Option<Since>,
    /// At most this many publications (0 = only the position).
    pub limit: usize,
    /// At most about this many bytes of publication data: the page stops before the
    /// publication that would pass it, but holds at least one, so paging always moves on.
    /// With `since`, the page is the oldest that fit; without, the newest. `None`: no bound.
    pub max_bytes: Option<usize>,
}

impl HistoryQuery {
    /// The newest `limit` publications, unbounded in bytes (0: only the position).
    pub fn newest(limit: usize) -> Self {
        Self {
            since: None,
            limit,
            max_bytes: None,
        }
    }

    /// Whether a page that holds `count` publications of `bytes` bytes so far may take
    /// one of `next` bytes more.
    pub fn fits(&self, count: usize, bytes: usize, next: usize) -> bool {
        count < self.limit && (count == 0 || self.max_bytes.is_none_or(|max| bytes + next <= max))
    }

    /// The publications of `candidates` (oldest first) that make this query's page: the
    /// oldest that fit after a `since`, the newest that fit without one.
    pub fn page<'a>(
        &self,
        candidates: impl DoubleEndedIterator<Item = &'a Publication>,
    ) -> Vec<Publication> {
        let (mut count, mut bytes) = (0, 0);
        let mut fits = |p: &&Publication| {
            let ok = self.fits(count, bytes, p.record.len());
            count += 1;
            bytes += p.record.len();
            ok
        };
        if self.since.is_some() {
            candidates.take_while(|p| fits(p)).cloned().collect()
        } else {
            let mut newest: Vec<_> = candidates.rev().take_while(|p| fits(p)).cloned().collect();
            newest.reverse();
            newest
        }
    }
}

/// A history answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// The stream's position when it was read.
    pub position: StreamPosition,
    /// Publications, oldest first.
    pub publications: Vec<Publication>,
}

/// Why a broker call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// History does not cover the requested position; `current` is where the stream is now.
    #[error("history does not cover the requested position (stream is at {} in epoch {})", current.offset, current.epoch)]
    Unrecoverable {
        /// The stream's position now.
        current: StreamPosition,
    },
    /// The backing store cannot be reached or refused the operation.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The operation was carried out (a publication stored and delivered) but could not be
    /// confirmed as lasting: a retry may repeat it.
    #[error("outcome unknown: {0}")]
    Unconfirmed(String),
}

/// A store of channel streams shared by every node that uses it. See the crate docs for
/// the contract.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Appends `data` (a publication record, opaque here: see [`Publication::record`]) to
    /// `channel` and fans it out; returns its position.
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError>;

    /// [`Broker::publish`], once per `key` and channel within `window`: a publish whose
    /// key the channel saw within it publishes nothing and answers with the first one's
    /// position, `true` (a repeat). Checked with the offset's assignment, so two at once
    /// publish once; on every node that shares the broker.
    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: std::time::Duration,
    ) -> Result<(StreamPosition, bool), BrokerError>;

    /// Reads history; see [`HistoryQuery`].
    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError>;

    /// Forgets `channel`'s history; the stream gets a new epoch.
    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError>;

    /// Starts handing `channel`'s publications to this node's sink.
    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError>;

    /// Stops handing `channel`'s publications to this node's sink.
    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError>;

    /// How many channels have a stream, for stats.
    fn channel_count(&self) -> usize;

    /// Whether the broker can take publications now; the error says why not (for example,
    /// storage writes fail). Health checks report it, so load balancers route elsewhere.
    fn health(&self) -> Result<(), String> {
        Ok(())
    }

    /// How long publications take, at the last check, from being published to reaching
    /// this node's sink; `None` for a broker that hands them over inside
    /// [`Broker::publish`] (nothing to lag behind).
    fn delivery_lag(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether this node reaches a remote broker, as it last found; `None` for a broker in
    /// the node's own process (nothing to lose the way to).
    fn reach(&self) -> Option<Reach> {
        None
    }
}

/// What a node knows of its way to a remote broker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    /// Why it cannot reach it now; `None` while it can.
    pub lost: Option<String>,
    /// Why publications cannot be sent to it now (the connection they go through failed);
    /// `None` while it answers, or is only not confirmed yet since another part was lost.
    pub writes_lost: Option<String>,
    /// Times it lost it, since the node started.
    pub losses: u64,
    /// Times it found it again.
    pub recoveries: u64,
    /// How it is laid out (Redis: `single`, `sentinel` or `cluster`).
    pub topology: &'static str,
    /// Times the node followed its primary: connected anew to the one its Sentinels name
    /// after losing the one it had (a failover, or the same primary back), or, on a
    /// cluster, lost a node's pub/sub connection or a shard channel to a moved slot.
    pub moves: u64,
    /// Times its subscriptions were made again on a new connection (each one followed by a
    /// catch-up from history).
    pub resubscriptions: u64,
}

/// A broker behind a shared handle.
pub type SharedBroker = Arc<dyn Broker>;

/// Whether a resume from `since` can be served when the stream is at `current` and its
/// oldest readable publication is `first` (top + 1 when history is empty): the epoch must
/// match (or not be given), and `since + 1` must still be in history or be the next offset.
/// Offset 0 is "from the start": it reads from the oldest publication kept, whatever was
/// trimmed before it, and a reader tells from the first offset whether that is offset 1
/// (a resume does: see the server's replay). Brokers in other crates use it too, so every
/// broker answers alike.
pub fn check_since(since: &Since, current: &StreamPosition, first: u64) -> Result<(), BrokerError> {
    // Offset 0 holds nothing of its epoch, so any epoch's stream, replayed from its start,
    // is exactly what such a reader lacks.
    let from_start = since.offset == 0;
    let epoch_ok = from_start || since.epoch.as_ref().is_none_or(|e| *e == current.epoch);
    if !epoch_ok || since.offset > current.offset || (!from_start && since.offset + 1 < first) {
        return Err(BrokerError::Unrecoverable {
            current: current.clone(),
        });
    }
    Ok(())
}

/// `url` without its credentials (`scheme://***@host…`), for logs and errors: remote
/// brokers' URLs may carry a password or a token.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// Inside a Tokio runtime, calls `sweep` on the broker every second until it is dropped.
pub(crate) fn spawn_sweeper<B: Send + Sync + 'static>(broker: &Arc<B>, sweep: fn(&B)) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let broker = Arc::downgrade(broker);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match broker.upgrade() {
                Some(broker) => sweep(&broker),
                None => return,
            }
        }
    });
}

#[cfg(any(test, feature = "testkit"))]
pub mod certs;
#[cfg(any(test, feature = "testkit"))]
pub mod conformance;
#[cfg(any(test, feature = "testkit"))]
pub mod ports;
#[cfg(any(test, feature = "testkit"))]
pub mod relay;

#[cfg(test)]
mod tests {
    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(
            super::redacted("redis://u:secret@h:1/0"),
            "redis://***@h:1/0"
        );
        assert_eq!(super::redacted("nats://token@h:1"), "nats://***@h:1");
        assert_eq!(super::redacted("nats://h:1"), "nats://h:1");
    }
}

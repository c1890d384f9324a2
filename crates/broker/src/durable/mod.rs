//! The embedded durable broker: streams kept in a write-ahead log, so acknowledged
//! publications survive `kill -9` and restarts, with their offsets and epochs.
//!
//! Offsets are assigned under the channel's lock, in the order records are queued for the
//! writer (`committer`). Its leader appends everything that has queued up since the last
//! append to the log ([`wal`]) as one batch, synced as [`SyncPolicy`] says, and only then
//! makes it readable, fans it out and acknowledges it. The log is the store: a
//! publication is written once. The applier tells the index (`index`) where each one
//! lies, many at a time, and checkpoints it (`checkpoint`) so that an open reads little of
//! the log (`recovery`); files whose publications are gone are deleted or compacted
//! (`compact`). Reads go through the index, joined with what it does not hold yet
//! ([`unapplied`]). A data directory of an earlier version, which kept history in a redb
//! database file, is moved over at its first open (`migrate`).

mod applier;
mod apply;
mod checkpoint;
mod checkpointer;
mod committer;
mod compact;
#[cfg(test)]
mod crash_harness;
mod disk;
mod index;
mod migrate;
mod options;
mod pack;
mod rebuild;
mod recovery;
mod segment;
#[cfg(test)]
mod sim_disk;
pub(crate) mod store;
mod torn;
mod unapplied;
pub mod wal;

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    hash::BuildHasher,
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, StreamPosition};
use parking_lot::Mutex;
use tokio::sync::oneshot;

pub use options::{
    StoreOptions, SyncPolicy, DEFAULT_CHECKPOINT_BYTES, DEFAULT_SEGMENT_BYTES,
    DEFAULT_SYNC_INTERVAL, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES,
};
pub use store::OpenError;
use store::{Job, ReadError, Record, Store};

use crate::{Broker, BrokerError, History, HistoryQuery, Policies, PublicationSink, StreamPolicy};

const SHARDS: usize = 64;

/// Most channels one sweep looks at; the rest wait for the next second.
const SWEEP_BATCH: usize = 10_000;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A channel's stream as this process knows it.
#[derive(Debug)]
pub(crate) struct Meta {
    pub(crate) epoch: Epoch,
    /// Highest offset handed out.
    pub(crate) assigned: u64,
    /// Highest offset committed: what readers may see.
    pub(crate) committed: u64,
    pub(crate) policy: StreamPolicy,
    pub(crate) last_publish_ms: u64,
    pub(crate) subscribed: bool,
    /// When the oldest kept publication was published, if any is kept (known after the
    /// first trim or publication): tells the sweeper when a trim is due.
    pub(crate) oldest_ms: Option<u64>,
    /// The sweeper removed this stream: a publisher that still holds it must look again.
    pub(crate) forgotten: bool,
    /// The earliest time this stream is filed in [`Deadlines`] for, so that it is filed
    /// again only for something sooner: the heap holds few entries per stream however
    /// often it is subscribed to and left.
    pub(crate) filed_ms: Option<u64>,
    /// Counts write failures that took offsets back: records handed out before one carry an
    /// older generation and are refused, because their offsets are handed out again.
    pub(crate) generation: u64,
    /// Made here by a reader or subscriber, with nothing of it in the store: forgetting it
    /// writes nothing, and it counts against [`crate::MAX_UNWRITTEN_STREAMS`].
    pub(crate) unwritten: bool,
}

impl Meta {
    pub(crate) fn new(epoch: Epoch, top: u64, policy: StreamPolicy, last_publish_ms: u64) -> Self {
        Self {
            epoch,
            assigned: top,
            committed: top,
            policy,
            last_publish_ms,
            subscribed: false,
            oldest_ms: None,
            forgotten: false,
            generation: 0,
            filed_ms: None,
            unwritten: false,
        }
    }

    /// How long the stream is remembered after its last publication; a stream nobody
    /// published to, after its last reader.
    fn keep_ms(&self) -> u64 {
        let keep = if self.committed == 0 {
            crate::EMPTY_STREAM_GRACE
        } else {
            self.policy.meta_ttl
        };
        keep.as_millis() as u64
    }

    fn ttl_ms(&self) -> u64 {
        self.policy.history_ttl.as_millis() as u64
    }

    /// The next time the sweeper has something to do for this stream.
    pub(crate) fn next_due_ms(&self) -> Option<u64> {
        let trim = self.oldest_ms.map(|at| at + self.ttl_ms());
        let forget = (!self.subscribed).then(|| self.last_publish_ms + self.keep_ms());
        trim.into_iter().chain(forget).min()
    }
}

type Metas = HashMap<ChannelName, Arc<Mutex<Meta>>>;

/// When the sweeper should look at which channel: a channel is here only when something
/// may fall due (history to trim, an idle stream to forget), so a sweep costs what changed,
/// not every channel known. Entries may be stale; the sweeper checks and re-files them.
#[derive(Default)]
pub(crate) struct Deadlines(Mutex<BinaryHeap<Reverse<(u64, ChannelName)>>>);

impl Deadlines {
    /// Files `channel` (whose meta is `m`) to be looked at by `due_ms`.
    pub(crate) fn file(&self, m: &mut Meta, channel: &ChannelName, due_ms: u64) {
        if m.filed_ms.is_none_or(|filed| due_ms < filed) {
            m.filed_ms = Some(due_ms);
            self.0.lock().push(Reverse((due_ms, channel.clone())));
        }
    }

    /// Files a stream for whatever falls due next, if anything does.
    pub(crate) fn refile(&self, m: &mut Meta, channel: &ChannelName, now: u64) {
        if let Some(due) = m.next_due_ms() {
            self.file(m, channel, due.max(now + 1));
        }
    }

    fn take_due(&self, now: u64) -> Vec<ChannelName> {
        self.take(SWEEP_BATCH, now)
            .into_iter()
            .map(|(_, channel)| channel)
            .collect()
    }

    /// At most `n` entries due by `by_ms`, earliest first, with the time each was filed for.
    fn take(&self, n: usize, by_ms: u64) -> Vec<(u64, ChannelName)> {
        let mut heap = self.0.lock();
        let mut due = Vec::new();
        while due.len() < n && heap.peek().is_some_and(|Reverse((at, _))| *at <= by_ms) {
            let Some(Reverse(entry)) = heap.pop() else {
                break;
            };
            due.push(entry);
        }
        due
    }
}

/// A broker whose streams live in a write-ahead log under a data directory.
pub struct DurableBroker {
    shards: Box<[Mutex<Metas>]>,
    hasher: std::collections::hash_map::RandomState,
    store: Arc<Store>,
    policies: Policies,
    deadlines: Arc<Deadlines>,
    /// How many streams are `unwritten` (see [`Meta::unwritten`]).
    unwritten: AtomicUsize,
    /// Idempotency keys seen (in memory: a restart forgets them).
    once: crate::once::Once,
}

impl std::fmt::Debug for DurableBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableBroker")
            .field("dir", &self.store.dir)
            .finish_non_exhaustive()
    }
}

impl DurableBroker {
    /// Bytes of the store's files, and of the entries in them still kept.
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> (u64, u64) {
        self.store.footprint()
    }

    /// Opens (or creates) the store in `dir` with [`StreamPolicy::default`] for every
    /// channel; see [`DurableBroker::open_with`].
    pub fn open(
        dir: &Path,
        options: impl Into<StoreOptions>,
        sink: Arc<dyn PublicationSink>,
    ) -> Result<Arc<Self>, OpenError> {
        Self::open_with(dir, options, sink, crate::default_policies())
    }

    /// Opens (or creates) the store in `dir`. A checkpoint that cannot be read is an error
    /// naming it: Herald never starts on data it cannot trust. Streams found in it
    /// are kept by `policies`, as they were before the restart.
    pub fn open_with(
        dir: &Path,
        options: impl Into<StoreOptions>,
        sink: Arc<dyn PublicationSink>,
        policies: Policies,
    ) -> Result<Arc<Self>, OpenError> {
        Self::open_on(disk::Dir::os(dir), options.into(), sink, policies)
    }

    /// [`DurableBroker::open_with`] on any disk (the crash tests' simulated one).
    pub(crate) fn open_on(
        dir: disk::Dir,
        options: StoreOptions,
        sink: Arc<dyn PublicationSink>,
        policies: Policies,
    ) -> Result<Arc<Self>, OpenError> {
        let deadlines = Arc::new(Deadlines::default());
        let (store, streams) = Store::open(dir, options, sink, deadlines.clone())?;
        let broker = Arc::new(Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            store,
            policies,
            deadlines,
            unwritten: AtomicUsize::new(0),
            once: Default::default(),
        });
        let now = now_ms();
        // Replayed publications were indexed without their retention; this is it.
        broker
            .store
            .keep_newest(|c| (broker.policies)(c).history_size);
        for (channel, mut meta) in streams {
            meta.policy = (broker.policies)(&channel);
            // What a loaded stream keeps is unknown until its first trim: look at it soon.
            broker.deadlines.file(&mut meta, &channel, now);
            broker
                .shard(&channel)
                .lock()
                .insert(channel, Arc::new(Mutex::new(meta)));
        }
        crate::spawn_sweeper(&broker, Self::sweep);
        Ok(broker)
    }

    fn shard(&self, channel: &ChannelName) -> &Mutex<Metas> {
        &self.shards[(self.hasher.hash_one(channel) as usize) % SHARDS]
    }

    fn existing(&self, channel: &ChannelName) -> Option<Arc<Mutex<Meta>>> {
        self.shard(channel).lock().get(channel).cloned()
    }

    fn meta(&self, channel: &ChannelName) -> Arc<Mutex<Meta>> {
        self.shard(channel)
            .lock()
            .entry(channel.clone())
            .or_insert_with(|| {
                let now = now_ms();
                let epoch = Epoch::random(|| fastrand::u64(..));
                let mut meta = Meta::new(epoch, 0, (self.policies)(channel), now);
                meta.unwritten = true;
                self.unwritten.fetch_add(1, Ordering::Relaxed);
                let due = now + meta.keep_ms();
                self.deadlines.file(&mut meta, channel, due);
                Arc::new(Mutex::new(meta))
            })
            .clone()
    }

    /// Drops `channel`'s history and starts it again in a new epoch; with `only_in`, only
    /// if the stream is still in that epoch. Whether it did.
    async fn reset(
        &self,
        channel: &ChannelName,
        only_in: Option<&Epoch>,
    ) -> Result<bool, BrokerError> {
        let (done, removed) = oneshot::channel();
        loop {
            let meta = self.meta(channel);
            let mut m = meta.lock();
            if m.forgotten {
                continue;
            }
            if only_in.is_some_and(|e| *e != m.epoch) {
                return Ok(false);
            }
            self.written(&mut m);
            m.epoch = Epoch::random(|| fastrand::u64(..));
            m.assigned = 0;
            m.committed = 0;
            m.oldest_ms = None;
            self.store.submit(Job::Reset {
                channel: channel.clone(),
                epoch: m.epoch.clone(),
                at_ms: now_ms(),
                done,
            });
            break;
        }
        self.store.drive();
        removed.await.unwrap_or_else(|_| {
            Err(BrokerError::Unavailable(
                "the storage thread stopped".into(),
            ))
        })?;
        Ok(true)
    }

    /// The stream is about to be written (a publication, a reset): it counts as unwritten
    /// no more.
    fn written(&self, m: &mut Meta) {
        if std::mem::take(&mut m.unwritten) {
            self.unwritten.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Removes `channel`'s stream (whose shard is locked as `shard`), telling the store
    /// when it has something of it.
    fn forget(&self, shard: &mut Metas, channel: &ChannelName, m: &mut Meta) {
        m.forgotten = true;
        if std::mem::take(&mut m.unwritten) {
            self.unwritten.fetch_sub(1, Ordering::Relaxed);
        } else {
            // Submitted under the shard's lock: a publication that makes the channel anew
            // is queued after this, so it cannot be deleted by it.
            self.store.submit(Job::Forget {
                channel: channel.clone(),
            });
        }
        shard.remove(channel);
    }

    /// Forgets the streams readers made (unwritten, with no subscriber) longest unread
    /// first, beyond [`crate::MAX_UNWRITTEN_STREAMS`], before their grace is over: a flood
    /// of reads naming new channels must not grow the process faster than the grace lets
    /// them go. What it costs a reader: a poller of an empty channel that was forgotten
    /// is told a new epoch at offset 0, which loses nothing.
    fn evict_unwritten(&self, now: u64) {
        let mut excess = self
            .unwritten
            .load(Ordering::Relaxed)
            .saturating_sub(crate::MAX_UNWRITTEN_STREAMS);
        if excess == 0 {
            return;
        }
        // One pass over the earliest filed: entries that are not evictable (subscribed,
        // written) are filed again, so looking at more than this could find them again.
        for (due, channel) in self.deadlines.take(2 * excess + 1024, u64::MAX) {
            let mut shard = self.shard(&channel).lock();
            let Some(meta) = shard.get(&channel).cloned() else {
                continue;
            };
            let mut m = meta.lock();
            if m.filed_ms == Some(due) {
                m.filed_ms = None;
            }
            if excess > 0 && m.unwritten && !m.subscribed && m.assigned == 0 {
                self.forget(&mut shard, &channel, &mut m);
                excess -= 1;
            } else {
                // Not one to evict: filed again for what it has due.
                drop(shard);
                self.deadlines.refile(&mut m, &channel, now);
            }
        }
    }

    /// Drops expired history and forgets idle streams, through the writer. Looks only at
    /// channels with something due (see [`Deadlines`]).
    pub fn sweep(&self) {
        let now = now_ms();
        self.evict_unwritten(now);
        for channel in self.deadlines.take_due(now) {
            let mut shard = self.shard(&channel).lock();
            let Some(meta) = shard.get(&channel).cloned() else {
                continue;
            };
            let mut m = meta.lock();
            if m.filed_ms.is_some_and(|filed| filed <= now) {
                m.filed_ms = None;
            }
            let idle = now.saturating_sub(m.last_publish_ms);
            if !m.subscribed && m.assigned == m.committed && idle >= m.keep_ms() {
                self.forget(&mut shard, &channel, &mut m);
                continue;
            }
            drop(shard);
            let trim_due = m.oldest_ms.is_none_or(|at| at + m.ttl_ms() <= now);
            if trim_due && m.committed > 0 {
                // The applier files the next deadline once it knows the new oldest.
                m.oldest_ms = None;
                self.store.submit(Job::Trim {
                    channel: channel.clone(),
                    meta: meta.clone(),
                    older_than_ms: now.saturating_sub(m.ttl_ms()),
                });
            } else {
                self.deadlines.refile(&mut m, &channel, now);
            }
        }
        self.store.drive();
    }
}

#[async_trait]
impl Broker for DurableBroker {
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError> {
        let (done, acked) = oneshot::channel();
        loop {
            let meta = self.meta(channel);
            let mut m = meta.lock();
            if m.forgotten {
                // Swept away after we found it: the next look makes it anew.
                continue;
            }
            self.written(&mut m);
            m.assigned += 1;
            m.policy = policy;
            m.last_publish_ms = now_ms();
            let record = Record {
                channel: channel.clone(),
                meta: meta.clone(),
                epoch: m.epoch.clone(),
                offset: m.assigned,
                generation: m.generation,
                at_ms: m.last_publish_ms,
                data,
                history_size: policy.history_size,
                done,
            };
            // Queued under the lock: the writer sees one channel's records in offset
            // order.
            self.store.submit(Job::Publish(record));
            break;
        }
        self.store.drive();
        acked.await.unwrap_or_else(|_| {
            Err(BrokerError::Unavailable(
                "the storage thread stopped".into(),
            ))
        })
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: std::time::Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        self.once
            .publish(channel, key, window, || self.publish(channel, data, policy))
            .await
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        // A reader of a channel nobody published to makes its stream (in memory only), so
        // that the epoch it is told is the one the first publication will carry. Such a
        // stream is forgotten [`EMPTY_STREAM_GRACE`] after its last reader.
        let meta = self.meta(channel);
        // The committed top, read under the lock; the store is read without it (the writer
        // needs the lock for every record it writes) and off the async workers.
        let (position, cutoff, size) = {
            let mut m = meta.lock();
            if m.assigned == 0 {
                // Still read: remembered a while longer.
                m.last_publish_ms = now_ms();
            }
            let position = StreamPosition {
                offset: m.committed,
                epoch: m.epoch.clone(),
            };
            let cutoff = now_ms().saturating_sub(m.ttl_ms());
            (position, cutoff, m.policy.history_size)
        };
        // Nothing to read: no publications asked for, or a reader already at the top (every
        // long-poll that follows a delivery is; the store read would cost a thread handoff).
        let at_top = query.since.as_ref().is_some_and(|since| {
            since.offset == position.offset
                && crate::check_since(since, &position, position.offset + 1).is_ok()
        });
        if at_top || (query.limit == 0 && query.since.is_none()) {
            return Ok(History {
                position,
                publications: Vec::new(),
            });
        }
        let store = self.store.clone();
        let (c, q) = (channel.clone(), query.clone());
        let epoch = position.epoch.clone();
        let read = tokio::task::spawn_blocking(move || store.read(&c, &position, cutoff, size, &q))
            .await
            .unwrap_or_else(|e| {
                Err(BrokerError::Unavailable(format!("history read failed: {e}")).into())
            });
        match read {
            Ok(history) => Ok(history),
            Err(ReadError::Broker(e)) => Err(e),
            Err(ReadError::Damaged(why)) => {
                // Checked as it is read rather than all at every start: the channel's
                // history is dropped and it starts a new epoch, as a reset does, so clients
                // resuming in the old one are told (recovered: false), never served it.
                // Only in the epoch read: readers that reached the same damage at once
                // reset it once, and a later one never drops what was published since.
                if self.reset(channel, Some(&epoch)).await? {
                    tracing::error!(channel = %channel, dir = %self.store.dir.display(), "{why}: the channel's history is dropped and it starts a new epoch");
                }
                self.history(channel, query).await
            }
        }
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.reset(channel, None).await.map(drop)
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        loop {
            let meta = self.meta(channel);
            let mut m = meta.lock();
            if !m.forgotten {
                m.subscribed = true;
                return Ok(());
            }
        }
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        let Some(meta) = self.existing(channel) else {
            return Ok(());
        };
        let mut m = meta.lock();
        m.subscribed = false;
        if m.assigned == 0 {
            m.last_publish_ms = now_ms();
        }
        self.deadlines.refile(&mut m, channel, now_ms());
        Ok(())
    }

    fn channel_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    fn health(&self) -> Result<(), String> {
        self.store.health()
    }
}

#[cfg(test)]
mod crash_tests;
#[cfg(test)]
mod damage_tests;
#[cfg(test)]
mod log_tests;
#[cfg(test)]
mod tests;

//! The embedded durable broker: streams in a redb database file, so acknowledged
//! publications survive `kill -9` and restarts, with their offsets and epochs.
//!
//! Offsets are assigned under the channel's lock, in the order records are handed to one
//! committer thread. The committer writes everything that has queued up since its last
//! commit in one transaction (group commit: concurrent publications share one fsync),
//! and only after the commit marks them readable, fans them out and acknowledges them.
//! So nothing a client saw or was acknowledged can be lost, and history reads never show
//! a publication that is not yet durable.

pub(crate) mod store;

use std::{
    collections::HashMap,
    hash::BuildHasher,
    path::Path,
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, StreamPosition};
use parking_lot::Mutex;
use tokio::sync::oneshot;

pub use store::OpenError;
use store::{Job, Record, Store};

use crate::{Broker, BrokerError, History, HistoryQuery, PublicationSink, StreamPolicy};

const SHARDS: usize = 64;

/// When a commit reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Every publication is its own transaction with its own fsync. Slowest, simplest.
    Always,
    /// Publications waiting while a commit runs go together into the next one, with one
    /// fsync for all of them. As safe as `Always`; the default.
    Group,
    /// No fsync: a crash of the machine (not just the process) may lose recent
    /// publications. The process can still be killed safely only after a clean shutdown.
    None,
}

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
}

type Metas = HashMap<ChannelName, Arc<Mutex<Meta>>>;

/// A broker whose streams live in a database file under a data directory.
pub struct DurableBroker {
    shards: Box<[Mutex<Metas>]>,
    hasher: std::collections::hash_map::RandomState,
    store: Arc<Store>,
}

impl std::fmt::Debug for DurableBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableBroker")
            .field("path", &self.store.path)
            .finish_non_exhaustive()
    }
}

impl DurableBroker {
    /// Opens (or creates) `dir/herald.redb`. A file that cannot be read as a database is
    /// an error naming it: Herald never starts on data it cannot trust.
    pub fn open(
        dir: &Path,
        sync: SyncPolicy,
        sink: Arc<dyn PublicationSink>,
    ) -> Result<Arc<Self>, OpenError> {
        let (store, streams) = Store::open(dir, sync, sink)?;
        let broker = Arc::new(Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            store,
        });
        for (channel, meta) in streams {
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

    fn meta(&self, channel: &ChannelName) -> Arc<Mutex<Meta>> {
        self.shard(channel)
            .lock()
            .entry(channel.clone())
            .or_insert_with(|| {
                Arc::new(Mutex::new(Meta {
                    epoch: Epoch::random(|| fastrand::u64(..)),
                    assigned: 0,
                    committed: 0,
                    policy: StreamPolicy::default(),
                    last_publish_ms: now_ms(),
                    subscribed: false,
                }))
            })
            .clone()
    }

    /// Drops expired history and forgets idle streams, through the committer.
    pub fn sweep(&self) {
        let now = now_ms();
        let mut jobs = Vec::new();
        for shard in self.shards.iter() {
            shard.lock().retain(|channel, meta| {
                let m = meta.lock();
                let idle = now.saturating_sub(m.last_publish_ms);
                let keep = if m.committed == 0 {
                    m.policy.history_ttl
                } else {
                    m.policy.meta_ttl
                };
                if !m.subscribed && m.assigned == m.committed && idle >= keep.as_millis() as u64 {
                    jobs.push(Job::Forget {
                        channel: channel.clone(),
                    });
                    return false;
                }
                let cutoff = now.saturating_sub(m.policy.history_ttl.as_millis() as u64);
                jobs.push(Job::Trim {
                    channel: channel.clone(),
                    older_than_ms: cutoff,
                });
                true
            });
        }
        for job in jobs {
            self.store.submit(job);
        }
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
        let meta = self.meta(channel);
        let (done, acked) = oneshot::channel();
        {
            let mut m = meta.lock();
            m.assigned += 1;
            m.policy = policy;
            m.last_publish_ms = now_ms();
            let record = Record {
                channel: channel.clone(),
                meta: meta.clone(),
                epoch: m.epoch.clone(),
                offset: m.assigned,
                at_ms: m.last_publish_ms,
                data,
                done,
            };
            // Handed over under the lock: the committer sees one channel's records in
            // offset order.
            self.store.submit(Job::Publish(record));
        }
        acked.await.unwrap_or_else(|_| {
            Err(BrokerError::Unavailable(
                "the storage thread stopped".into(),
            ))
        })
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        let meta = self.meta(channel);
        let m = meta.lock();
        let position = StreamPosition {
            offset: m.committed,
            epoch: m.epoch.clone(),
        };
        let cutoff = now_ms().saturating_sub(m.policy.history_ttl.as_millis() as u64);
        self.store
            .read(channel, &position, cutoff, m.policy.history_size, &query)
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        let meta = self.meta(channel);
        let (done, removed) = oneshot::channel();
        {
            let mut m = meta.lock();
            m.epoch = Epoch::random(|| fastrand::u64(..));
            m.assigned = 0;
            m.committed = 0;
            self.store.submit(Job::Reset {
                channel: channel.clone(),
                epoch: m.epoch.clone(),
                done,
            });
        }
        removed.await.unwrap_or_else(|_| {
            Err(BrokerError::Unavailable(
                "the storage thread stopped".into(),
            ))
        })
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.meta(channel).lock().subscribed = true;
        Ok(())
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        if let Some(meta) = self.shard(channel).lock().get(channel) {
            meta.lock().subscribed = false;
        }
        Ok(())
    }

    fn channel_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests;

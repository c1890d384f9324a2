//! ③ The hub: which local connections listen to which channel, and fan-out to them.
//!
//! The broker calls [`Hub::on_publication`] once per publication, in offset order per
//! channel. The hub encodes the publication once and hands the same bytes to every
//! subscriber's queue; it never waits for a connection.

use std::{
    collections::{hash_map::RandomState, HashMap},
    hash::BuildHasher,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use herald_broker::{BrokerError, PublicationSink, SharedBroker};
use herald_protocol::{json, ChannelName, Epoch, Publication};
use parking_lot::RwLock;

use crate::queue::{Delivery, Queue};

const SHARDS: usize = 64;

type Subscribers = HashMap<ChannelName, Vec<(u64, Arc<Queue>)>>;

/// Local subscriptions, sharded by channel.
pub struct Hub {
    shards: Box<[Shard]>,
    hasher: RandomState,
    deliveries: AtomicU64,
    publications: AtomicU64,
}

struct Shard {
    subscribers: RwLock<Subscribers>,
    /// Serialises membership changes with the broker calls they imply, so the broker's
    /// interest never lags behind the hub's.
    membership: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("channels", &self.channel_count())
            .finish()
    }
}

impl Default for Hub {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    subscribers: RwLock::default(),
                    membership: tokio::sync::Mutex::new(()),
                })
                .collect(),
            hasher: RandomState::new(),
            deliveries: AtomicU64::new(0),
            publications: AtomicU64::new(0),
        }
    }
}

impl Hub {
    fn shard(&self, channel: &ChannelName) -> &Shard {
        &self.shards[(self.hasher.hash_one(channel) as usize) % SHARDS]
    }

    /// Adds a session's queue to a channel; the first local subscriber makes the node
    /// subscribe at the broker. Publications fanned out from now on reach the queue.
    pub async fn subscribe(
        &self,
        broker: &SharedBroker,
        channel: &ChannelName,
        session: u64,
        queue: Arc<Queue>,
    ) -> Result<(), BrokerError> {
        let shard = self.shard(channel);
        let _membership = shard.membership.lock().await;
        let first = {
            let mut subs = shard.subscribers.write();
            let list = subs.entry(channel.clone()).or_default();
            list.push((session, queue));
            list.len() == 1
        };
        if first {
            if let Err(e) = broker.subscribe(channel).await {
                remove(&mut shard.subscribers.write(), channel, session);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Removes a session from a channel; the last local subscriber makes the node
    /// unsubscribe at the broker.
    pub async fn unsubscribe(&self, broker: &SharedBroker, channel: &ChannelName, session: u64) {
        let shard = self.shard(channel);
        let _membership = shard.membership.lock().await;
        let last = remove(&mut shard.subscribers.write(), channel, session);
        if last {
            if let Err(e) = broker.unsubscribe(channel).await {
                tracing::warn!(%channel, error = %e, "broker unsubscribe failed");
            }
        }
    }

    /// Channels with at least one local subscriber.
    pub fn channel_count(&self) -> usize {
        self.shards.iter().map(|s| s.subscribers.read().len()).sum()
    }

    /// Publications fanned out and deliveries queued since start.
    pub fn counters(&self) -> (u64, u64) {
        (
            self.publications.load(Ordering::Relaxed),
            self.deliveries.load(Ordering::Relaxed),
        )
    }
}

/// Returns true when the channel has no local subscribers left.
fn remove(subs: &mut Subscribers, channel: &ChannelName, session: u64) -> bool {
    let Some(list) = subs.get_mut(channel) else {
        return false;
    };
    let before = list.len();
    list.retain(|(id, _)| *id != session);
    if list.is_empty() && before > 0 {
        subs.remove(channel);
        return true;
    }
    false
}

impl PublicationSink for Hub {
    fn on_publication(&self, channel: &ChannelName, epoch: &Epoch, publication: &Publication) {
        let subs = self.shard(channel).subscribers.read();
        let Some(list) = subs.get(channel) else {
            return;
        };
        let delivery = Arc::new(Delivery {
            channel: channel.clone(),
            epoch: epoch.clone(),
            offset: publication.offset,
            json: json::encode_pub(channel, publication),
        });
        for (_, queue) in list {
            queue.push(delivery.clone());
        }
        self.publications.fetch_add(1, Ordering::Relaxed);
        self.deliveries
            .fetch_add(list.len() as u64, Ordering::Relaxed);
    }
}

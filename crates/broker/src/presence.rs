//! Presence: who is subscribed to a channel, in a store every node of a cluster shares.
//!
//! A **member** is one client in one channel: an id (public, derived by the server from a
//! secret the client holds, so it never reveals the connection's own id), the user it
//! signed in as (if any) and its public info as JSON. Several connections may hold the
//! same member at once (a client that reconnected before its old connection was noticed
//! gone): the store counts holders, and the member leaves with its last holder.
//!
//! The contract, checked by [`crate::conformance::run_presence`]:
//!
//! 1. [`PresenceStore::join`] adds a holder and says whether the member is new;
//!    [`PresenceStore::leave`] removes one and says whether the member is gone.
//! 2. [`PresenceStore::stats`] counts members and distinct users in constant time, however
//!    many members the channel has.
//! 3. [`PresenceStore::members`] pages through members in id order after a cursor, at most
//!    `limit` at a time: a member present for the whole paging is listed exactly once.
//! 4. A store shared by several nodes removes the members of a node that stopped (killed,
//!    cut off) within a bounded time, and tells the surviving nodes
//!    ([`PresenceEvents::expired`]). It carries batches of joins and leaves between
//!    nodes ([`PresenceStore::announce`]).

use std::{
    collections::{hash_map::RandomState, BTreeMap, HashMap},
    hash::BuildHasher,
    sync::{Arc, Weak},
};

use async_trait::async_trait;
use bytes::Bytes;
use herald_protocol::ChannelName;
use parking_lot::Mutex;

use crate::BrokerError;

/// One client in one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Public id, unique within the channel.
    pub id: u64,
    /// Its public JSON object (`{"user": …, "info": …, "channel_info": …}`), empty for an
    /// anonymous client.
    pub info: Bytes,
}

/// How many are in a channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PresenceStats {
    /// Members (clients).
    pub clients: u64,
    /// Distinct users among them (anonymous clients count for none).
    pub users: u64,
}

/// What a node hears from the store about other nodes.
pub trait PresenceEvents: Send + Sync + 'static {
    /// Another node's batch (see [`PresenceStore::announce`]).
    fn heard(&self, batch: Bytes);
    /// Members held only by a node that stopped were removed (each with the info it had,
    /// or empty when the store no longer knows it).
    fn expired(&self, channel: &ChannelName, members: Vec<Member>);
}

/// Where a cluster's presence lives. See the module docs for the contract.
#[async_trait]
pub trait PresenceStore: Send + Sync + 'static {
    /// One more holder of `member` in `channel`; true when the member is new there. `user`
    /// (none for an anonymous client) is counted for [`PresenceStats::users`].
    async fn join(
        &self,
        channel: &ChannelName,
        member: &Member,
        user: Option<&str>,
    ) -> Result<bool, BrokerError>;

    /// One holder less of member `id`; true when it was the last (the member left).
    async fn leave(&self, channel: &ChannelName, id: u64) -> Result<bool, BrokerError>;

    /// Members and distinct users, in constant time.
    async fn stats(&self, channel: &ChannelName) -> Result<PresenceStats, BrokerError>;

    /// At most `limit` members with ids above `after`, in id order.
    async fn members(
        &self,
        channel: &ChannelName,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Member>, BrokerError>;

    /// Hands `batch` to every other node's [`PresenceEvents::heard`]; nothing for a store
    /// that serves one node.
    async fn announce(&self, batch: Bytes) {
        let _ = batch;
    }

    /// Where this node hears other nodes' batches and expiries.
    fn listen(&self, events: Weak<dyn PresenceEvents>) {
        let _ = events;
    }
}

/// A shared presence store.
pub type SharedPresence = Arc<dyn PresenceStore>;

/// One channel's members, in id order, with their distinct users counted as they come and
/// go: stats in constant time, pages as ranges. `H` is what a store keeps per member
/// beside its info (how many hold it, which nodes do).
#[derive(Debug)]
pub struct Roster<H> {
    members: BTreeMap<u64, Listed<H>>,
    /// Members per user (by the user's key): its length is the distinct users.
    users: HashMap<u64, u32>,
}

#[derive(Debug)]
struct Listed<H> {
    info: Bytes,
    /// The user's key, 0 for none.
    user: u64,
    holders: H,
}

impl<H> Default for Roster<H> {
    fn default() -> Self {
        Self {
            members: BTreeMap::new(),
            users: HashMap::new(),
        }
    }
}

impl<H> Roster<H> {
    /// What is kept beside member `id`, if it is here.
    pub fn holders(&mut self, id: u64) -> Option<&mut H> {
        self.members.get_mut(&id).map(|listed| &mut listed.holders)
    }

    /// The info of member `id`, if it is here.
    pub fn info(&self, id: u64) -> Option<&Bytes> {
        self.members.get(&id).map(|listed| &listed.info)
    }

    /// Adds `member` of user `user` (its key: never 0; 0 for none), unless it is here.
    /// True when it was not.
    pub fn add(&mut self, member: &Member, user: u64, holders: H) -> bool {
        if self.members.contains_key(&member.id) {
            return false;
        }
        self.members.insert(
            member.id,
            Listed {
                info: member.info.clone(),
                user,
                holders,
            },
        );
        if user != 0 {
            *self.users.entry(user).or_default() += 1;
        }
        true
    }

    /// Removes member `id`; true when it was here.
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(listed) = self.members.remove(&id) else {
            return false;
        };
        if listed.user != 0 {
            if let Some(count) = self.users.get_mut(&listed.user) {
                *count -= 1;
                if *count == 0 {
                    self.users.remove(&listed.user);
                }
            }
        }
        true
    }

    /// Whether nobody is here.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members and distinct users.
    pub fn stats(&self) -> PresenceStats {
        PresenceStats {
            clients: self.members.len() as u64,
            users: self.users.len() as u64,
        }
    }

    /// At most `limit` members with ids above `after`, in id order.
    pub fn page(&self, after: Option<u64>, limit: usize) -> Vec<Member> {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = after.map_or(Unbounded, Excluded);
        self.members
            .range((from, Unbounded))
            .take(limit)
            .map(|(id, listed)| Member {
                id: *id,
                info: listed.info.clone(),
            })
            .collect()
    }
}

/// A user's key in a [`Roster`]: a hash of its name (never 0, which stands for "no user").
pub fn user_key(hasher: &RandomState, user: Option<&str>) -> u64 {
    user.map_or(0, |u| hasher.hash_one(u) | 1)
}

const SHARDS: usize = 32;

/// One shard's channels, each with its members and how many connections hold each.
type Rosters = HashMap<ChannelName, Roster<u32>>;

/// Presence of one node, in memory: for the memory and durable brokers (presence is about
/// who is connected now, so there is nothing to keep over a restart).
#[derive(Debug)]
pub struct MemoryPresence {
    /// Per channel, its members and how many connections hold each.
    shards: Box<[Mutex<Rosters>]>,
    hasher: RandomState,
}

impl Default for MemoryPresence {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl MemoryPresence {
    /// An empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn shard(&self, channel: &ChannelName) -> &Mutex<Rosters> {
        &self.shards[self.hasher.hash_one(channel) as usize % SHARDS]
    }
}

#[async_trait]
impl PresenceStore for MemoryPresence {
    async fn join(
        &self,
        channel: &ChannelName,
        member: &Member,
        user: Option<&str>,
    ) -> Result<bool, BrokerError> {
        let user = user_key(&self.hasher, user);
        let mut shard = self.shard(channel).lock();
        let roster = shard.entry(channel.clone()).or_default();
        if let Some(holders) = roster.holders(member.id) {
            *holders += 1;
            return Ok(false);
        }
        Ok(roster.add(member, user, 1))
    }

    async fn leave(&self, channel: &ChannelName, id: u64) -> Result<bool, BrokerError> {
        let mut shard = self.shard(channel).lock();
        let Some(roster) = shard.get_mut(channel) else {
            return Ok(false);
        };
        let Some(holders) = roster.holders(id) else {
            return Ok(false);
        };
        *holders -= 1;
        if *holders > 0 {
            return Ok(false);
        }
        roster.remove(id);
        if roster.is_empty() {
            shard.remove(channel);
        }
        Ok(true)
    }

    async fn stats(&self, channel: &ChannelName) -> Result<PresenceStats, BrokerError> {
        let shard = self.shard(channel).lock();
        Ok(shard
            .get(channel)
            .map_or_else(Default::default, Roster::stats))
    }

    async fn members(
        &self,
        channel: &ChannelName,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Member>, BrokerError> {
        let shard = self.shard(channel).lock();
        Ok(shard
            .get(channel)
            .map_or_else(Vec::new, |roster| roster.page(after, limit)))
    }
}

//! Presence on this node: who joins and leaves, kept in the cluster's presence store, and
//! join/leave pushes that do not flood.
//!
//! **Members.** A client is a member of each channel it subscribes to in a namespace with
//! `presence`. Its public id is derived from a secret only it knows (its first
//! connection's client id, which it sends again when it reconnects: see [`member_id`]),
//! so a reconnecting client is the same member, and nobody can learn a connection's own
//! id (the capability for `send?session=`) from a presence page.
//!
//! **Grace.** When a connection ends, its memberships are held for `presence.grace`
//! (pollers: `presence.poll_grace`) before they leave. A connection that takes a held
//! membership over in time (the same client reconnecting) causes neither a leave nor a
//! join; store calls are not even made.
//!
//! **Batches.** Joins and leaves of namespaces with `join_leave` are gathered per channel
//! for `presence.join_leave_window`; then a member that joined and left again meanwhile
//! cancels out, and the rest goes to the channel's subscribers as one `presence` push
//! (on this node, and through the store to every other node). A channel with more than
//! `presence.join_leave_max_members` members gets no lists: only its count of members
//! (every push carries it), at most every [`COUNT_EVERY_WINDOWS`] windows. So a mass
//! reconnect of N clients sends each subscriber at most one push per window per node, of
//! a size that does not grow with N above the threshold: never N² bytes in all.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Weak},
    time::Duration,
};

use bytes::Bytes;
use herald_broker::{BrokerError, Member, PresenceEvents, PresenceStats, SharedPresence};
use herald_protocol::{json, results, ChannelName, Encoding, Push};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::Hub;
use crate::{config::PresenceConfig, error::Failure};
use herald_protocol::ErrorCode;

/// Members per page when the caller gives no limit.
const DEFAULT_PAGE: usize = 100;

/// Above `presence.join_leave_max_members`, a channel's count is pushed at most once in
/// this many windows (5 s with the default 500 ms): a crowded channel's count changes
/// all the time, and each push goes to every subscriber.
const COUNT_EVERY_WINDOWS: u32 = 10;

/// A channel above the member threshold on this node: only its count is pushed.
#[derive(Debug)]
struct Over {
    /// When its count was last pushed.
    told: Instant,
    /// Whether members changed since.
    due: bool,
}

/// A member's public id: the first 8 bytes of SHA-256 over the client's secret and its
/// user. The same on every node (and every version), so a client that reconnects to
/// another node is still the same member; one-way, so the id reveals nothing of the
/// secret; and bound to the user, so a secret replayed under another token is another
/// member.
pub fn member_id(secret: &str, user: &str) -> u64 {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    hash.update(secret.as_bytes());
    hash.update([0]);
    hash.update(user.as_bytes());
    let digest = hash.finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The member id of a user who is one member however many connections it has (for a
/// front whose protocol counts users, not connections): each connection is a holder of
/// it, so the store says when the user's first connection arrives and when its last
/// leaves, on any node. Keyed apart from [`member_id`]'s ids by a secret no client id can
/// be.
pub fn user_member_id(user: &str) -> u64 {
    member_id(user, "\0user")
}

/// A membership of one connection, as the session hands it over.
#[derive(Debug, Clone)]
pub struct Joining {
    /// The member.
    pub member: Member,
    /// Its user, counted in stats.
    pub user: Option<Box<str>>,
    /// Whether its joins and leaves are pushed (the namespace's `join_leave`).
    pub announce: bool,
    /// The client's address, when the transport knows it: memberships held through their
    /// grace are counted per address (`presence.max_held_per_address`).
    pub address: Option<IpAddr>,
}

/// A membership whose last connection ended, kept until its deadline.
#[derive(Debug)]
struct Held {
    deadline: Instant,
    /// Connections that ended and were not taken over (each is a holder in the store).
    holders: u32,
    announce: bool,
    info: Bytes,
    address: Option<IpAddr>,
}

/// Memberships held through their grace, and how many each client address holds.
#[derive(Debug, Default)]
struct Holds {
    members: HashMap<(ChannelName, u64), Held>,
    per_address: HashMap<IpAddr, usize>,
}

impl Holds {
    fn remove(&mut self, key: &(ChannelName, u64)) -> Option<Held> {
        let held = self.members.remove(key)?;
        if let Some(ip) = held.address {
            if let std::collections::hash_map::Entry::Occupied(mut count) =
                self.per_address.entry(ip)
            {
                *count.get_mut() -= 1;
                if *count.get() == 0 {
                    count.remove();
                }
            }
        }
        Some(held)
    }

    /// Gives back what a flood made the maps allocate once it has drained: a `HashMap`
    /// keeps its largest capacity otherwise.
    fn shrink(&mut self) {
        if self.members.capacity() > 1024 && self.members.len() < self.members.capacity() / 4 {
            self.members.shrink_to(self.members.len() * 2);
        }
        if self.per_address.capacity() > 1024
            && self.per_address.len() < self.per_address.capacity() / 4
        {
            self.per_address.shrink_to(self.per_address.len() * 2);
        }
    }
}

/// Members as a codec writes them.
pub fn listed(members: &[Member]) -> Vec<results::Member<'_>> {
    members
        .iter()
        .map(|m| results::Member {
            id: m.id,
            info: &m.info,
        })
        .collect()
}

/// One join or leave, waiting for its window to end.
#[derive(Debug)]
struct Change {
    member: Member,
    joined: bool,
}

/// Presence on one node.
pub struct Presence {
    store: SharedPresence,
    config: PresenceConfig,
    hub: Weak<Hub>,
    window: Mutex<HashMap<ChannelName, Vec<Change>>>,
    held: Mutex<Holds>,
    /// Channels whose changes this node stopped listing (above the member threshold).
    over: Mutex<HashMap<ChannelName, Over>>,
    /// Who is told of the expiries of the server's own presence channels (`$…`, which no
    /// client subscribes to: a front's count of who occupies a channel).
    internal: Mutex<Option<Weak<dyn PresenceEvents>>>,
    /// Who is told when a member arrives in the store and when it leaves it (a front's
    /// webhooks): set once, read on every arrival and leave.
    arrivals: std::sync::OnceLock<Weak<dyn MemberEvents>>,
}

/// What a front learns of members as the store records them: a member's first holder
/// arriving on any node, and its last leaving (at once for an unsubscribe or a connection
/// closed on purpose, after the grace for a drop, when the store expires a dead node's).
/// Told after the store changed, so whoever hears it and reads the store sees the change:
/// one moment for every reader.
pub trait MemberEvents: Send + Sync {
    /// `member` arrived in `channel` (`arrived`), or left it.
    fn member(&self, channel: &ChannelName, member: &Member, arrived: bool);
}

impl std::fmt::Debug for Presence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presence")
            .field("held", &self.held.lock().members.len())
            .finish_non_exhaustive()
    }
}

impl Presence {
    /// Presence kept in `store`, pushing to `hub`'s subscribers. Inside a Tokio runtime,
    /// a task ends each window (expiring held memberships, pushing batches) until the
    /// presence is dropped.
    pub fn start(store: SharedPresence, config: PresenceConfig, hub: &Arc<Hub>) -> Arc<Self> {
        let presence = Arc::new(Self {
            store,
            config,
            hub: Arc::downgrade(hub),
            window: Mutex::default(),
            held: Mutex::default(),
            over: Mutex::default(),
            internal: Mutex::default(),
            arrivals: std::sync::OnceLock::new(),
        });
        let events: Weak<dyn PresenceEvents> = Arc::downgrade(&presence) as _;
        presence.store.listen(events);
        if tokio::runtime::Handle::try_current().is_ok() {
            let weak = Arc::downgrade(&presence);
            let every = presence.config.join_leave_window;
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(presence) = weak.upgrade() else {
                        return;
                    };
                    presence.end_window().await;
                }
            });
        }
        presence
    }

    /// Adds a connection's membership: takes over a held one of the same member (no
    /// join), or joins it in the store (a join, if the member is new).
    pub async fn join(&self, channel: &ChannelName, joining: &Joining) -> Result<(), BrokerError> {
        let key = (channel.clone(), joining.member.id);
        {
            let mut held = self.held.lock();
            if let Some(h) = held.members.get_mut(&key) {
                h.holders -= 1;
                if h.holders == 0 {
                    held.remove(&key);
                }
                return Ok(());
            }
        }
        let new = self
            .store
            .join(channel, &joining.member, joining.user.as_deref())
            .await?;
        if new {
            self.tell(channel, &joining.member, true);
            if joining.announce {
                self.record(channel, joining.member.clone(), true);
            }
        }
        Ok(())
    }

    /// Ends a connection's membership: at once (`grace` zero: it unsubscribed), or after
    /// `grace` unless a connection takes it over meanwhile.
    pub async fn leave(&self, channel: &ChannelName, joining: Joining, grace: Duration) {
        if !grace.is_zero() && self.hold(channel, &joining, Instant::now() + grace) {
            return;
        }
        self.release(channel, joining.member, joining.announce, 1)
            .await;
    }

    /// Holds a membership until `deadline`; false when as many are held as allowed, on
    /// this node (`presence.max_held`) or for the client's address
    /// (`presence.max_held_per_address`): a flood of polls naming channels, say. Then this
    /// one must leave now, as after an unsubscribe.
    fn hold(&self, channel: &ChannelName, joining: &Joining, deadline: Instant) -> bool {
        let mut held = self.held.lock();
        let held = &mut *held;
        let key = (channel.clone(), joining.member.id);
        if let Some(h) = held.members.get_mut(&key) {
            h.holders += 1;
            h.deadline = deadline;
            return true;
        }
        if held.members.len() >= self.config.max_held {
            return false;
        }
        if let Some(ip) = joining.address {
            let count = held.per_address.entry(ip).or_default();
            if *count >= self.config.max_held_per_address {
                return false;
            }
            *count += 1;
        }
        held.members.insert(
            key,
            Held {
                deadline,
                holders: 1,
                announce: joining.announce,
                info: joining.member.info.clone(),
                address: joining.address,
            },
        );
        true
    }

    /// Removes `holders` holders of `member`; a leave if it was the last.
    async fn release(&self, channel: &ChannelName, member: Member, announce: bool, holders: u32) {
        for _ in 0..holders {
            match self.store.leave(channel, member.id).await {
                Ok(true) => {
                    self.tell(channel, &member, false);
                    if announce {
                        self.record(channel, member.clone(), false);
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(%channel, error = %e, "presence leave failed"),
            }
        }
    }

    fn record(&self, channel: &ChannelName, member: Member, joined: bool) {
        self.window
            .lock()
            .entry(channel.clone())
            .or_default()
            .push(Change { member, joined });
    }

    /// Tells the front watching arrivals and leaves, if one is.
    fn tell(&self, channel: &ChannelName, member: &Member, arrived: bool) {
        if let Some(watcher) = self.arrivals.get().and_then(Weak::upgrade) {
            watcher.member(channel, member, arrived);
        }
    }

    /// Tells `events` of every member's arrival and leave (once: the node's one front
    /// that posts webhooks about members).
    pub fn watch_members(&self, events: Weak<dyn MemberEvents>) {
        let _ = self.arrivals.set(events);
    }

    /// The store itself, for the server's own presence channels (`$…`): no grace, no
    /// pushes.
    pub fn store(&self) -> &SharedPresence {
        &self.store
    }

    /// Tells `events` of the expiries of the server's own presence channels.
    pub fn watch_internal(&self, events: Weak<dyn PresenceEvents>) {
        *self.internal.lock() = Some(events);
    }

    /// Members and distinct users.
    pub async fn stats(&self, channel: &ChannelName) -> Result<PresenceStats, BrokerError> {
        self.store.stats(channel).await
    }

    /// A page of members, and the cursor of the next page if it was full: the `presence`
    /// command's and API call's answer. `cursor` is the previous page's;
    /// `limit` is capped by `presence.max_page` (default 100).
    pub async fn page(
        &self,
        channel: &ChannelName,
        cursor: Option<&str>,
        limit: Option<usize>,
    ) -> Result<(Vec<Member>, Option<String>), Failure> {
        let after = match cursor {
            None => None,
            Some(c) => Some(json::decode_member_id(c).ok_or_else(|| {
                Failure::new(
                    ErrorCode::BadRequest,
                    "cursor must be the cursor of a presence answer",
                )
            })?),
        };
        let limit = limit.unwrap_or(DEFAULT_PAGE).clamp(1, self.config.max_page);
        let members = self.store.members(channel, after, limit).await?;
        let next = (members.len() == limit)
            .then(|| members.last().map(|m| format!("{:016x}", m.id)))
            .flatten();
        Ok((members, next))
    }

    /// Ends a window: held memberships past their deadline leave, then each channel's
    /// changes go out as one push.
    pub async fn end_window(&self) {
        let now = Instant::now();
        let expired: Vec<_> = {
            let mut held = self.held.lock();
            let keys: Vec<_> = held
                .members
                .iter()
                .filter(|(_, h)| h.deadline <= now)
                .map(|(k, _)| k.clone())
                .collect();
            let expired = keys
                .into_iter()
                .filter_map(|k| held.remove(&k).map(|h| (k, h)))
                .collect();
            held.shrink();
            expired
        };
        for ((channel, id), h) in expired {
            let member = Member { id, info: h.info };
            self.release(&channel, member, h.announce, h.holders).await;
        }
        let mut changes = std::mem::take(&mut *self.window.lock());
        // Channels above the threshold whose count changed and may be told again.
        let every = self.config.join_leave_window * COUNT_EVERY_WINDOWS;
        let counts_due: Vec<ChannelName> = self
            .over
            .lock()
            .iter()
            .filter(|(c, o)| o.due && o.told.elapsed() >= every && !changes.contains_key(*c))
            .map(|(c, _)| c.clone())
            .collect();
        for channel in counts_due {
            changes.insert(channel, Vec::new());
        }
        let mut announced = Vec::new();
        for (channel, changes) in changes {
            let Some(push) = self.batch(&channel, changes).await else {
                continue;
            };
            self.push(&channel, push.clone());
            announced.extend_from_slice(channel.as_str().as_bytes());
            announced.push(b'\n');
            announced.extend_from_slice(&push);
            announced.push(b'\n');
        }
        if !announced.is_empty() {
            self.store.announce(announced.into()).await;
        }
    }

    /// One channel's push for a window's changes (none: a count that is due, above the
    /// threshold): none when they cancel out. Above the member count that gets lists, only
    /// the count, at most every [`COUNT_EVERY_WINDOWS`] windows. Crossing that count either
    /// way is pushed with `"missed": true`: subscribers that keep a member list learn that
    /// changes were (or are about to be) left out, and read the list again.
    async fn batch(&self, channel: &ChannelName, changes: Vec<Change>) -> Option<Bytes> {
        let count_due = changes.is_empty();
        // Net change per member, in the order members first appeared.
        let mut net: Vec<(Member, i32)> = Vec::new();
        let mut index: HashMap<u64, usize> = HashMap::new();
        for c in changes {
            let step = if c.joined { 1 } else { -1 };
            match index.get(&c.member.id) {
                Some(&i) => net[i].1 += step,
                None => {
                    index.insert(c.member.id, net.len());
                    net.push((c.member, step));
                }
            }
        }
        if !count_due && net.iter().all(|(_, n)| *n == 0) {
            return None;
        }
        let clients = match self.store.stats(channel).await {
            Ok(stats) => stats.clients,
            Err(e) => {
                tracing::warn!(%channel, error = %e, "presence stats failed; joins and leaves not pushed");
                return None;
            }
        };
        let over = clients > self.config.join_leave_max_members;
        let missed = {
            let mut channels = self.over.lock();
            let every = self.config.join_leave_window * COUNT_EVERY_WINDOWS;
            if over {
                net.clear();
                match channels.get_mut(channel) {
                    // Above already: its count, when it is time to tell it again.
                    Some(o) if o.told.elapsed() < every => {
                        o.due = true;
                        return None;
                    }
                    Some(o) => {
                        *o = Over {
                            told: Instant::now(),
                            due: false,
                        };
                        false
                    }
                    None => {
                        let told = Instant::now();
                        channels.insert(channel.clone(), Over { told, due: false });
                        true
                    }
                }
            } else {
                // Back under (a count that was due, too: with other nodes' changes).
                channels.remove(channel).is_some()
            }
        };
        let list = |joined: bool| -> Vec<results::Member> {
            net.iter()
                .filter(|(_, n)| (*n > 0) == joined && *n != 0)
                .map(|(m, _)| results::Member {
                    id: m.id,
                    info: &m.info,
                })
                .collect()
        };
        let (join, leave) = (list(true), list(false));
        // One encoding for every watcher, as for publications (one codec today).
        let push = Encoding::Json.codec().push(&Push::Presence {
            channel,
            join: &join,
            leave: &leave,
            missed,
            clients: Some(clients),
        });
        Some(push.into())
    }

    fn push(&self, channel: &ChannelName, push: Bytes) {
        if let Some(hub) = self.hub.upgrade() {
            hub.push_presence(channel, push);
        }
    }
}

impl PresenceEvents for Presence {
    fn heard(&self, batch: Bytes) {
        let mut lines = batch.split(|b| *b == b'\n');
        while let (Some(name), Some(push)) = (lines.next(), lines.next()) {
            let name = std::str::from_utf8(name).ok();
            let Some(channel) = name.and_then(|n| ChannelName::new(n).ok()) else {
                tracing::warn!("undecodable presence batch from another node");
                return;
            };
            self.push(&channel, batch.slice_ref(push));
        }
    }

    fn expired(&self, channel: &ChannelName, members: Vec<Member>) {
        if channel.as_str().starts_with('$') {
            let internal = self.internal.lock().as_ref().and_then(Weak::upgrade);
            if let Some(internal) = internal {
                internal.expired(channel, members);
            }
            return;
        }
        for member in members {
            self.tell(channel, &member, false);
            self.record(channel, member, false);
        }
    }
}

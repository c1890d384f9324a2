//! Who occupies a Pusher app's channels, across every node, for the webhooks Pusher posts
//! about it: `channel_occupied` and `channel_vacated` (a channel's first subscriber and
//! its last) and `member_added` and `member_removed` (a presence channel's user: its first
//! connection and its last).
//!
//! **Members** are the presence channel's own: a Pusher connection's membership is its
//! user's (every connection of the user holds the one member, see `user_member_id`), so
//! the presence store says when a user arrives and when it leaves, once across the
//! cluster, and [`Presence`](crate::hub::presence::Presence) tells this module right
//! after the store changed. The member webhooks thus keep the presence clock that the
//! channel's clients (`pusher:member_removed`), `GET /users` and `GET /channels/{name}`
//! keep: a connection closed on purpose leaves at once, a dropped one after
//! `presence.grace`. A leave is posted once the store, read again [`SETTLE`] later, still
//! lacks the member (on NATS a join another node made a moment before arrives late).
//!
//! **Channels** are counted in presence channels of the server's own that no client can
//! name: `$NS:NAME!occupied` has one member, which every connection subscribed to
//! `NS:NAME` holds. The store says when it is new (its first holder on any node) and when
//! it left (its last): atomically on Redis and in memory, so exactly one node posts each
//! change. A vacated channel waits the app's `webhook_leave_delay`, then is posted only if
//! still vacated, read again from the store: a page reload posts nothing.
//!
//! **Subscription counts** are presence counts too (see the speaker's `counts`): each
//! subscription holds a member of `NAME`'s count, so the store says when one arrives or
//! leaves; the count is read once [`COUNT_SETTLE`] later and posted as
//! `subscription_count`, one post per channel per window on the node that saw the change.
//!
//! When a node dies, the store expires what it held (telling the node that swept it on
//! Redis, every survivor on NATS: each then posts, so at least once), and those are leaves
//! like any other.

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
    time::Duration,
};

use bytes::Bytes;
use herald_broker::{Member, PresenceEvents};
use herald_protocol::{pusher, ChannelName};
use parking_lot::Mutex;

use crate::{
    config::PusherApp,
    hub::presence::{user_member_id, MemberEvents},
    node::Node,
};

/// How long after the store says a member left the leave is read again before it is
/// posted: long beside a NATS node's view of another's join (about a millisecond), short
/// beside the window in which clients hear of it (`presence.join_leave_window`).
const SETTLE: Duration = Duration::from_millis(100);

/// How long after a subscription arrives or leaves its channel's count is read and posted:
/// the changes meanwhile make one post.
const COUNT_SETTLE: Duration = Duration::from_millis(500);

/// The webhook of a channel's count of subscriptions.
const COUNT_EVENT: &str = "subscription_count";

/// What a webhook is about.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Watched {
    /// A channel's subscribers: occupied or vacated.
    Channel,
    /// One user of a presence channel: added or removed.
    User(Box<str>),
}

/// The webhook events of a channel's first and last subscriber.
pub const CHANNEL_EVENTS: [&str; 2] = ["channel_occupied", "channel_vacated"];
/// The webhook events of a presence channel user's first connection and its last.
const USER_EVENTS: [&str; 2] = ["member_added", "member_removed"];

impl Watched {
    /// The webhook events of a first holder and of a last.
    fn events(&self) -> [&'static str; 2] {
        match self {
            Watched::Channel => CHANNEL_EVENTS,
            Watched::User(_) => USER_EVENTS,
        }
    }
}

const OCCUPIED: &str = "!occupied";

/// The one member of a channel's count of subscribers, which every subscriber holds.
const SUBSCRIBER: u64 = 1;

/// One connection's part in a channel's count of subscribers, given back when it leaves
/// the channel.
#[derive(Debug)]
pub struct Held {
    counted: ChannelName,
}

/// Where `channel`'s subscribers are counted; none when the name would be too long for
/// the store to read back.
fn counted(channel: &ChannelName) -> Option<Held> {
    let name = format!("${channel}{OCCUPIED}");
    ChannelName::stored(&name).ok()?;
    Some(Held {
        counted: ChannelName::internal(&name),
    })
}

/// The channel a count of subscribers is of, read back from its name.
fn counted_of(counted: &ChannelName) -> Option<ChannelName> {
    let name = counted.as_str().strip_prefix('$')?.strip_suffix(OCCUPIED)?;
    ChannelName::new(name).ok()
}

/// The user a presence member is, when it is a Pusher user's member (not a Herald
/// client's in the same channel).
fn user_of(member: &Member) -> Option<Box<str>> {
    #[derive(serde::Deserialize)]
    struct Info {
        user: Box<str>,
    }
    let user = serde_json::from_slice::<Info>(&member.info).ok()?.user;
    (user_member_id(&user) == member.id).then_some(user)
}

/// The counts of one node, and its leaves waiting out their delay.
pub struct Occupancy {
    node: Weak<Node>,
    me: Weak<Occupancy>,
    /// Leaves waiting out their delay.
    leaving: Mutex<Leaving>,
    /// Counts of subscriptions whose change is to be posted.
    counting: Mutex<std::collections::HashSet<ChannelName>>,
}

/// Each count or member whose last holder left (by the store channel it is in and its
/// member id), with the number of that leave: an arrival meanwhile takes it out (nothing
/// is posted), a later leave replaces it.
#[derive(Debug, Default)]
struct Leaving {
    counts: HashMap<(ChannelName, u64), u64>,
    numbered: u64,
}

impl std::fmt::Debug for Occupancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Occupancy").finish_non_exhaustive()
    }
}

impl Occupancy {
    /// The counts of `node`, when one of its apps posts any of these webhooks.
    pub fn start(node: &Arc<Node>) -> Option<Arc<Self>> {
        let apps = &node.settings.config.pusher.apps;
        let posts = |events: &[&str]| events.iter().any(|e| apps.iter().any(|a| a.posts(e)));
        let counts = posts(&[COUNT_EVENT]);
        if !posts(&CHANNEL_EVENTS) && !posts(&USER_EVENTS) && !counts {
            return None;
        }
        let occupancy = Arc::new_cyclic(|me| Self {
            node: Arc::downgrade(node),
            me: me.clone(),
            leaving: Mutex::default(),
            counting: Mutex::default(),
        });
        if posts(&CHANNEL_EVENTS) {
            let events: Weak<dyn PresenceEvents> = Arc::downgrade(&occupancy) as _;
            node.presence.watch_internal(events);
        }
        if posts(&USER_EVENTS) || counts {
            let events: Weak<dyn MemberEvents> = Arc::downgrade(&occupancy) as _;
            node.presence.watch_members(events);
        }
        Some(occupancy)
    }

    /// Counts one connection of `app` in `channel`'s subscribers, if the app posts their
    /// events; what to give back when the connection leaves.
    pub async fn enter(&self, app: &PusherApp, channel: &ChannelName) -> Option<Held> {
        if !CHANNEL_EVENTS.iter().any(|e| app.posts(e)) {
            return None;
        }
        let node = self.node.upgrade()?;
        let held = counted(channel)?;
        let member = Member {
            id: SUBSCRIBER,
            info: Bytes::new(),
        };
        match node
            .presence
            .store()
            .join(&held.counted, &member, None)
            .await
        {
            Ok(true) => self.arrived(&node, &held.counted, SUBSCRIBER, channel, &Watched::Channel),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%channel, error = %e, "pusher: could not count a subscriber for webhooks");
                return None;
            }
        }
        Some(held)
    }

    /// Gives a connection's part back.
    pub async fn leave(&self, held: Held) {
        let Some(node) = self.node.upgrade() else {
            return;
        };
        match node.presence.store().leave(&held.counted, SUBSCRIBER).await {
            Ok(true) => self.vacated(held.counted),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(channel = %held.counted, error = %e, "pusher: could not count a subscriber out for webhooks")
            }
        }
    }

    /// A channel's last subscriber left (or a dead node's count of it expired): posted
    /// after the app's delay, unless one is back.
    fn vacated(&self, counted: ChannelName) {
        let Some(node) = self.node.upgrade() else {
            return;
        };
        let Some(channel) = counted_of(&counted) else {
            return;
        };
        let Some((app, _)) = app_of(&node, &channel) else {
            return;
        };
        let delay = app.webhook_leave_delay;
        self.left(counted, SUBSCRIBER, channel, Watched::Channel, delay);
    }

    /// A first holder arrived in `store` (a count, or the presence channel itself) as
    /// member `id`: posted, unless its leave is still waiting (then the webhook's receiver
    /// never saw it go, and nothing is).
    fn arrived(
        &self,
        node: &Node,
        store: &ChannelName,
        id: u64,
        channel: &ChannelName,
        watched: &Watched,
    ) {
        let back = self
            .leaving
            .lock()
            .counts
            .remove(&(store.clone(), id))
            .is_some();
        if !back {
            self.post(node, channel, watched, true);
        }
    }

    /// The last holder of member `id` left `store`: after `delay`, unless it is back,
    /// posts.
    fn left(
        &self,
        store: ChannelName,
        id: u64,
        channel: ChannelName,
        watched: Watched,
        delay: Duration,
    ) {
        let (Some(node), Some(me)) = (self.node.upgrade(), self.me.upgrade()) else {
            return;
        };
        let key = (store, id);
        let number = {
            let mut leaving = self.leaving.lock();
            leaving.numbered += 1;
            let number = leaving.numbered;
            leaving.counts.insert(key.clone(), number);
            number
        };
        let shutdown = node.shutdown.clone();
        // Tracked, so a node that stops posts what its last connections left (at once then).
        node.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => {}
            }
            {
                let mut leaving = me.leaving.lock();
                if leaving.counts.get(&key) != Some(&number) {
                    return;
                }
                leaving.counts.remove(&key);
            }
            let Some(node) = me.node.upgrade() else {
                return;
            };
            let (store, id) = key;
            let back = node
                .presence
                .store()
                .members(&store, id.checked_sub(1), 1)
                .await
                .map(|page| page.first().is_some_and(|m| m.id == id));
            match back {
                Ok(false) => me.post(&node, &channel, &watched, false),
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(channel = %store, error = %e, "pusher: could not read a count again; its leave is not posted")
                }
            }
        });
    }

    /// A subscription arrived in or left `count` (a channel's count of subscriptions):
    /// the count is read and posted [`COUNT_SETTLE`] later, once for every change until
    /// then.
    fn count_changed(&self, count: &ChannelName) {
        let (Some(node), Some(me)) = (self.node.upgrade(), self.me.upgrade()) else {
            return;
        };
        if !self.counting.lock().insert(count.clone()) {
            return;
        }
        let count = count.clone();
        let shutdown = node.shutdown.clone();
        node.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(COUNT_SETTLE) => {}
                _ = shutdown.cancelled() => {}
            }
            me.counting.lock().remove(&count);
            let Some(node) = me.node.upgrade() else {
                return;
            };
            let Some((app, index)) = app_of(&node, &count) else {
                return;
            };
            let inside = &count.as_str()[app.namespace().len() + 1..];
            let Some(name) = inside.strip_prefix(pusher::SUBSCRIPTIONS_CHANNEL_INSIDE) else {
                return;
            };
            match node.presence.store().stats(&count).await {
                Ok(stats) => super::post_webhook(&node, index, COUNT_EVENT, || {
                    serde_json::json!({
                        "name": COUNT_EVENT,
                        "channel": name,
                        "subscription_count": stats.clients,
                    })
                }),
                Err(e) => {
                    tracing::warn!(channel = %count, error = %e, "pusher: could not read a count of subscriptions; not posted")
                }
            }
        });
    }

    /// Records the webhook of `channel`'s `watched` arriving (`arrived`) or leaving.
    fn post(&self, node: &Node, channel: &ChannelName, watched: &Watched, arrived: bool) {
        let Some((app, index)) = app_of(node, channel) else {
            return;
        };
        let event = watched.events()[usize::from(!arrived)];
        super::post_webhook(node, index, event, || {
            let name = pusher::outside_name(&channel.as_str()[app.namespace().len() + 1..]);
            let mut body = serde_json::json!({ "name": event, "channel": name });
            if let Watched::User(user) = watched {
                body["user_id"] = user.as_ref().into();
            }
            body
        });
    }
}

/// The app whose namespace `channel` is in, and its index.
fn app_of<'n>(node: &'n Node, channel: &ChannelName) -> Option<(&'n PusherApp, usize)> {
    let apps = &node.settings.config.pusher.apps;
    let index = apps
        .iter()
        .position(|a| a.namespace() == channel.namespace())?;
    Some((&apps[index], index))
}

impl PresenceEvents for Occupancy {
    fn heard(&self, _batch: Bytes) {}

    /// A dead node's counts: each channel it was the last subscriber of is vacated.
    fn expired(&self, channel: &ChannelName, _members: Vec<Member>) {
        self.vacated(channel.clone());
    }
}

impl MemberEvents for Occupancy {
    /// A Pusher user arrived in a presence channel of an app that posts its webhooks, or
    /// left it.
    fn member(&self, channel: &ChannelName, member: &Member, arrived: bool) {
        let Some(node) = self.node.upgrade() else {
            return;
        };
        let Some((app, _)) = app_of(&node, channel) else {
            return;
        };
        let name = &channel.as_str()[app.namespace().len() + 1..];
        if name.starts_with(pusher::SUBSCRIPTIONS_CHANNEL_INSIDE) {
            if app.posts(COUNT_EVENT) {
                self.count_changed(channel);
            }
            return;
        }
        if pusher::Kind::of(name) != pusher::Kind::Presence {
            return;
        }
        let Some(user) = user_of(member) else {
            return;
        };
        let watched = Watched::User(user);
        if arrived {
            self.arrived(&node, channel, member.id, channel, &watched);
        } else {
            self.left(channel.clone(), member.id, channel.clone(), watched, SETTLE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_names_its_channel_and_no_client_can_name_it() {
        let channel = ChannelName::new("app:presence-room").unwrap();
        let held = counted(&channel).unwrap();
        assert!(ChannelName::new(held.counted.as_str()).is_err());
        assert_eq!(
            ChannelName::stored(held.counted.as_str()).unwrap(),
            held.counted
        );
        assert_eq!(counted_of(&held.counted), Some(channel));
        let long = ChannelName::new(&format!("app:{}", "x".repeat(250))).unwrap();
        assert!(counted(&long).is_none());
    }

    #[test]
    fn a_member_is_a_pusher_user_only_when_its_id_is_the_users() {
        let info = crate::token::sender("ann \"the\" 1", Some(b"{}"), None);
        let user = Member {
            id: user_member_id("ann \"the\" 1"),
            info: info.clone(),
        };
        assert_eq!(user_of(&user).as_deref(), Some("ann \"the\" 1"));
        // A Herald client of the same user in the same channel is a member of its own.
        let client = Member { id: 7, info };
        assert_eq!(user_of(&client), None);
    }
}

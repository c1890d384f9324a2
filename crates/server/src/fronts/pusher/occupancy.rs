//! Who occupies a Pusher app's channels, across every node, for the webhooks Pusher posts
//! about it: `channel_occupied` and `channel_vacated` (a channel's first subscriber and
//! its last) and `member_added` and `member_removed` (a presence channel's user: its first
//! connection and its last).
//!
//! Counted in the cluster's presence store, in presence channels of the server's own
//! that no client can name: `$NS:NAME!occupied` has one member, which every connection
//! subscribed to `NS:NAME` holds; `$NS:NAME!users` has a member per user, which each of
//! the user's connections holds. The store says when a member is new (its first holder on
//! any node) and when it left (its last): atomically on Redis and in memory, so exactly one
//! node posts each change. A leave waits the app's `webhook_leave_delay`, then is posted
//! only if the member is still gone, read again from the store: a page reload posts
//! nothing, and on NATS, where a node sees the others' holders a moment late, a leave that
//! another node's join undid is not posted. When a node dies, the store expires what it
//! held (telling the node that swept it on Redis, every survivor on NATS: each then posts,
//! so at least once), and those are leaves like any other.

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
};

use bytes::Bytes;
use herald_broker::{Member, PresenceEvents};
use herald_protocol::ChannelName;
use parking_lot::Mutex;

use crate::{config::PusherApp, hub::presence::member_id, node::Node};

/// What is counted of a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched {
    /// Its subscribers: occupied or vacated.
    Channel,
    /// One user of a presence channel: added or removed.
    User(Box<str>),
}

/// The webhook events of a channel's first and last subscriber.
const CHANNEL_EVENTS: [&str; 2] = ["channel_occupied", "channel_vacated"];
/// The webhook events of a presence channel user's first and last connection.
const USER_EVENTS: [&str; 2] = ["member_added", "member_removed"];

impl Watched {
    /// The webhook events of a first holder and of a last.
    fn events(&self) -> [&'static str; 2] {
        match self {
            Watched::Channel => CHANNEL_EVENTS,
            Watched::User(_) => USER_EVENTS,
        }
    }

    fn suffix(&self) -> &'static str {
        match self {
            Watched::Channel => OCCUPIED,
            Watched::User(_) => USERS,
        }
    }
}

const OCCUPIED: &str = "!occupied";
const USERS: &str = "!users";

/// One connection's part in a count, given back when it leaves the channel.
#[derive(Debug)]
pub struct Held {
    counted: ChannelName,
    member: Member,
}

/// Where `channel`'s `watched` is counted, and the member a connection holds there; none
/// when the name would be too long for the store to read back.
fn counted(channel: &ChannelName, watched: &Watched) -> Option<Held> {
    let name = format!("${channel}{}", watched.suffix());
    ChannelName::stored(&name).ok()?;
    let member = match watched {
        Watched::Channel => Member {
            id: 1,
            info: Bytes::new(),
        },
        Watched::User(user) => Member {
            id: member_id(user, "pusher user"),
            info: serde_json::to_vec(user).expect("strings serialise").into(),
        },
    };
    Some(Held {
        counted: ChannelName::internal(&name),
        member,
    })
}

/// The channel and what of it a count is, read back from the count's name and member.
fn parse(counted: &ChannelName, member: &Member) -> Option<(ChannelName, Watched)> {
    let name = counted.as_str().strip_prefix('$')?;
    if let Some(channel) = name.strip_suffix(OCCUPIED) {
        return Some((ChannelName::new(channel).ok()?, Watched::Channel));
    }
    let channel = name.strip_suffix(USERS)?;
    let user: String = serde_json::from_slice(&member.info).ok()?;
    Some((ChannelName::new(channel).ok()?, Watched::User(user.into())))
}

/// The counts of one node, and its leaves waiting out their delay.
pub struct Occupancy {
    node: Weak<Node>,
    me: Weak<Occupancy>,
    /// Leaves waiting out their delay.
    leaving: Mutex<Leaving>,
}

/// Each count whose last holder left, with the number of that leave: a join meanwhile
/// takes it out (nothing is posted), a later leave replaces it.
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
        let wanted = CHANNEL_EVENTS
            .iter()
            .chain(&USER_EVENTS)
            .any(|event| apps.iter().any(|app| app.posts(event)));
        if !wanted {
            return None;
        }
        let occupancy = Arc::new_cyclic(|me| Self {
            node: Arc::downgrade(node),
            me: me.clone(),
            leaving: Mutex::default(),
        });
        let events: Weak<dyn PresenceEvents> = Arc::downgrade(&occupancy) as _;
        node.presence.watch_internal(events);
        Some(occupancy)
    }

    /// Counts one connection of `app` in `channel`'s `watched`, if the app posts its
    /// events; what to give back when the connection leaves.
    pub async fn enter(
        &self,
        app: &PusherApp,
        channel: &ChannelName,
        watched: Watched,
    ) -> Option<Held> {
        if !watched.events().iter().any(|e| app.posts(e)) {
            return None;
        }
        let node = self.node.upgrade()?;
        let held = counted(channel, &watched)?;
        match node
            .presence
            .store()
            .join(&held.counted, &held.member, None)
            .await
        {
            Ok(true) => {
                let key = (held.counted.clone(), held.member.id);
                // Back before its leave was posted: the webhook's receiver never saw it go.
                if self.leaving.lock().counts.remove(&key).is_none() {
                    self.post(&node, &held.counted, &held.member, true);
                }
            }
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
        match node
            .presence
            .store()
            .leave(&held.counted, held.member.id)
            .await
        {
            Ok(true) => self.left(held.counted, held.member),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(channel = %held.counted, error = %e, "pusher: could not count a subscriber out for webhooks")
            }
        }
    }

    /// The last holder of a count left: after the app's delay, unless it is back, posts.
    fn left(&self, counted: ChannelName, member: Member) {
        let (Some(node), Some(me)) = (self.node.upgrade(), self.me.upgrade()) else {
            return;
        };
        let Some(delay) = parse(&counted, &member)
            .and_then(|(channel, _)| app_of(&node, &channel))
            .map(|(app, _)| app.webhook_leave_delay)
        else {
            return;
        };
        let key = (counted.clone(), member.id);
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
            let id = member.id;
            let back = node
                .presence
                .store()
                .members(&counted, id.checked_sub(1), 1)
                .await
                .map(|page| page.first().is_some_and(|m| m.id == id));
            match back {
                Ok(false) => me.post(&node, &counted, &member, false),
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(channel = %counted, error = %e, "pusher: could not read a count again; its leave is not posted")
                }
            }
        });
    }

    /// Records the webhook of a count's first holder (`joined`) or of its last.
    fn post(&self, node: &Node, counted: &ChannelName, member: &Member, joined: bool) {
        let Some((channel, watched)) = parse(counted, member) else {
            return;
        };
        let Some((app, index)) = app_of(node, &channel) else {
            return;
        };
        let event = watched.events()[usize::from(!joined)];
        super::post_webhook(node, index, event, || {
            let name = &channel.as_str()[app.namespace().len() + 1..];
            let mut body = serde_json::json!({ "name": event, "channel": name });
            if let Watched::User(user) = &watched {
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

    /// A dead node's holders: each count it was the last holder of has left.
    fn expired(&self, channel: &ChannelName, members: Vec<Member>) {
        for member in members {
            self.left(channel.clone(), member);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_names_its_channel_and_user_and_no_client_can_name_it() {
        let channel = ChannelName::new("app:presence-room").unwrap();
        for watched in [Watched::Channel, Watched::User("ann \"the\" 1".into())] {
            let held = counted(&channel, &watched).unwrap();
            assert!(ChannelName::new(held.counted.as_str()).is_err());
            assert_eq!(
                ChannelName::stored(held.counted.as_str()).unwrap(),
                held.counted
            );
            assert_eq!(
                parse(&held.counted, &held.member),
                Some((channel.clone(), watched))
            );
        }
        let long = ChannelName::new(&format!("app:{}", "x".repeat(250))).unwrap();
        assert!(counted(&long, &Watched::Channel).is_none());
    }
}

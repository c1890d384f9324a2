//! Presence per user, as one Pusher connection follows a `presence-` channel.
//!
//! Herald's presence counts connections (members); Pusher's counts users. The connection
//! keeps which member is which user: the list read when it joined, then Herald's join and
//! leave pushes (which every node of the cluster receives). A user's first member arriving
//! is `member_added`, its last leaving `member_removed`: once per user, whichever nodes
//! its connections are on.

use std::collections::HashMap;

use herald_protocol::{pusher, ChannelName};
use serde_json::value::RawValue;

use crate::fronts::members::{Changes, Member};

/// Who is in a presence channel, as one connection follows it.
#[derive(Debug)]
pub struct Roster {
    pub channel: ChannelName,
    /// The connection's own user.
    pub me: Box<str>,
    /// Each member (its id, as Herald's presence pushes write it) and its user.
    members: HashMap<String, Box<str>>,
    /// Each user's members.
    users: HashMap<Box<str>, u32>,
    /// The ids written as other than strings (numbers), by user: given back as they came.
    typed: HashMap<Box<str>, Box<RawValue>>,
}

impl Roster {
    /// Counts a member in; true when its user is new.
    fn join(&mut self, member: String, user: &str, typed: Option<&RawValue>) -> bool {
        if self.members.contains_key(&member) {
            return false;
        }
        self.members.insert(member, user.into());
        let count = self.users.entry(user.into()).or_default();
        *count += 1;
        if let Some(typed) = typed {
            self.typed.insert(user.into(), typed.to_owned());
        }
        *count == 1
    }

    /// Counts a member out; its user and that user's id when that was the user's last
    /// member.
    fn leave(&mut self, member: &str) -> Option<(Box<str>, Box<RawValue>)> {
        let user = self.members.remove(member)?;
        let count = self.users.get_mut(&user)?;
        *count -= 1;
        if *count > 0 {
            return None;
        }
        self.users.remove(&user);
        let id = self.typed.remove(&user).unwrap_or_else(|| string_id(&user));
        Some((user, id))
    }
}

/// A user id that came as a string, as JSON.
fn string_id(user: &str) -> Box<RawValue> {
    let text = serde_json::to_string(user).expect("strings serialise");
    RawValue::from_string(text).expect("a JSON string is JSON")
}

impl Roster {
    /// The roster of `channel`, which the connection is in as user `me`.
    pub fn new(channel: ChannelName, me: Box<str>) -> Self {
        Self {
            channel,
            me,
            members: HashMap::new(),
            users: HashMap::new(),
            typed: HashMap::new(),
        }
    }

    /// Counts `members` in and says who is there (`subscription_succeeded`).
    pub fn list(&mut self, name: &str, members: &[herald_broker::Member]) -> Vec<u8> {
        let parsed: Vec<(String, Member)> = members
            .iter()
            .filter_map(|m| Some((format!("{:016x}", m.id), Member::of(&m.info)?)))
            .collect();
        let null: &RawValue = serde_json::from_str("null").expect("null is JSON");
        let mut hash = std::collections::BTreeMap::new();
        let mut ids = std::collections::BTreeMap::new();
        for (id, member) in &parsed {
            let Some(user) = member.user.as_deref() else {
                continue;
            };
            self.join(id.clone(), user, member.user_id);
            hash.entry(user).or_insert(member.info.unwrap_or(null));
            ids.entry(user).or_insert(member.user_id);
        }
        let ids: Vec<Box<RawValue>> = ids
            .iter()
            .map(|(user, typed)| typed.map_or_else(|| string_id(user), ToOwned::to_owned))
            .collect();
        let list = pusher::Members {
            ids: ids.iter().map(|id| &**id).collect(),
            count: hash.len(),
            hash,
        };
        pusher::subscription_succeeded(name, Some(&list))
    }

    /// Turns one of Herald's presence pushes into member events, once per user.
    pub fn changed(&mut self, push: &[u8], emit: &mut dyn FnMut(&[u8])) {
        let Some(changes) = Changes::of(push) else {
            tracing::warn!(channel = %self.channel, "undecodable presence push");
            return;
        };
        let channel = self.channel.clone();
        let name = channel
            .as_str()
            .split_once(':')
            .map_or(channel.as_str(), |(_, n)| n);
        let null: &RawValue = serde_json::from_str("null").expect("null is JSON");
        for m in &changes.join {
            let (Some(id), Some(user)) = (&m.client, &m.user) else {
                continue;
            };
            if self.join(id.clone(), user, m.user_id) && **user != *self.me {
                let typed = m.user_id.map_or_else(|| string_id(user), ToOwned::to_owned);
                emit(&pusher::member_added(name, &typed, m.info.unwrap_or(null)));
            }
        }
        for m in &changes.leave {
            let Some(id) = &m.client else { continue };
            if let Some((user, typed)) = self.leave(id) {
                if *user != *self.me {
                    emit(&pusher::member_removed(name, &typed));
                }
            }
        }
    }
}

//! Watchlists (`pusher.user.watchlist`): a signed-in user hears when the users its signin
//! lists in `watchlist` come online and go offline.
//!
//! A user is online while it is signed in on at least one connection, on any node: that is
//! a presence membership. Each connection signed in as the user holds the user's one
//! member (`user_member_id`) of the app's channel `!online-{user}`, which no Pusher client
//! can name, so the presence store says once across the cluster when the user's first
//! connection arrives and when its last leaves, on presence's own clock (a tab closed on
//! purpose at once, a dropped connection after `presence.grace`). A watcher follows each
//! watched user's channel without being a member of it, and the join and leave pushes of
//! that channel become `pusher_internal:watchlist_events`. Nothing is stored: the events
//! travel as every presence change does.

use herald_protocol::{
    pusher::{self, codes, ONLINE_CHANNEL_INSIDE},
    ChannelName,
};
use serde::Deserialize;

use super::{Pusher, UserId};
use crate::{fronts::line, fronts::members::Changes, session::GrantedMember};

/// Most users one signin may watch (Pusher's limit).
const MAX_WATCHLIST: usize = 100;

/// A watched user, as its watcher was last told of it.
#[derive(Debug)]
pub(super) struct Watched {
    /// The user's online channel.
    pub channel: ChannelName,
    pub online: bool,
}

impl Pusher {
    /// After a signin as `me` with `user_data`: counts the connection in its user's online
    /// membership, then follows the watchlist's users and says which of them are online
    /// now and which are not.
    pub(super) async fn watch(&mut self, me: &str, user_data: &str, out: &mut Vec<u8>) {
        if self.more.as_ref().is_some_and(|m| !m.watching.is_empty()) {
            // Signed in again on the same connection: it already follows its list.
            return;
        }
        #[derive(Deserialize)]
        struct Listed {
            #[serde(default)]
            watchlist: Vec<UserId>,
        }
        let watchlist = match serde_json::from_str::<Listed>(user_data) {
            Ok(l) if l.watchlist.len() <= MAX_WATCHLIST => l.watchlist,
            Ok(_) => {
                let said = format!("a watchlist holds at most {MAX_WATCHLIST} users");
                return line(out, pusher::error(Some(codes::UNAUTHORIZED), &said));
            }
            Err(e) => {
                let said = format!("user_data's watchlist must be a list of ids: {e}");
                return line(out, pusher::error(Some(codes::UNAUTHORIZED), &said));
            }
        };
        let own = match self.online_channel(me) {
            Ok(c) => c,
            Err(e) => return line(out, pusher::error(None, &e)),
        };
        if !self.session.subscribed(&own) {
            let member = GrantedMember {
                user: me.into(),
                info: bytes::Bytes::from_static(b"null"),
                typed_id: None,
            };
            self.session.grant_channel(own.clone(), Some(member));
            if let Err(f) = self.session.open(&own, None, None).await {
                return line(out, pusher::error(None, &f.message));
            }
        }
        let (mut online, mut offline) = (Vec::new(), Vec::new());
        for user in watchlist {
            let user = user.into_string();
            let channel = match self.online_channel(&user) {
                Ok(c) => c,
                Err(e) => return line(out, pusher::error(None, &e)),
            };
            if channel != own {
                self.session.watch_channel(channel.clone());
                if let Err(f) = self.session.open(&channel, None, None).await {
                    return line(out, pusher::error(None, &f.message));
                }
            }
            let is_online = match self.session.members(&channel).await {
                Ok(members) => !members.is_empty(),
                Err(f) => return line(out, pusher::error(None, &f.message)),
            };
            self.more().watching.push(Watched {
                channel,
                online: is_online,
            });
            match is_online {
                true => online.push(user),
                false => offline.push(user),
            }
        }
        if !online.is_empty() || !offline.is_empty() {
            line(out, pusher::watchlist_events(&ids(&online), &ids(&offline)));
        }
    }

    /// The channel whose member says `user` is online.
    fn online_channel(&self, user: &str) -> Result<ChannelName, String> {
        pusher::check_channel(user).map_err(|e| format!("user id {user:?}: {}", e.0))?;
        let name = format!("{}:{ONLINE_CHANNEL_INSIDE}{user}", self.app().namespace());
        ChannelName::new(&name).map_err(|e| e.to_string())
    }
}

fn ids(users: &[String]) -> Vec<&str> {
    users.iter().map(String::as_str).collect()
}

/// One of the hub's presence pushes on a watched user's online channel, as a watchlist
/// event when it changes what the watcher was told: a join says the user came online, a
/// leave that it went offline. (A push can repeat what the watcher read when it began
/// watching: changes are pushed a window after they were made.)
pub(super) fn changed(watched: &mut Watched, push: &[u8], emit: &mut dyn FnMut(&[u8])) {
    let channel = &watched.channel;
    let Some(user) = channel
        .as_str()
        .split_once(':')
        .and_then(|(_, name)| name.strip_prefix(ONLINE_CHANNEL_INSIDE))
    else {
        return;
    };
    let Some(changes) = Changes::of(push) else {
        tracing::warn!(%channel, "undecodable presence push");
        return;
    };
    // The channel's one member either joined or left: the hub nets each member's changes
    // within its window, and pushes a join only when the store says the member is new.
    let online = match (changes.join.is_empty(), changes.leave.is_empty()) {
        (false, _) => true,
        (true, false) => false,
        (true, true) => return,
    };
    if online != watched.online {
        watched.online = online;
        let (on, off): (&[&str], &[&str]) = match online {
            true => (&[user], &[]),
            false => (&[], &[user]),
        };
        emit(&pusher::watchlist_events(on, off));
    }
}

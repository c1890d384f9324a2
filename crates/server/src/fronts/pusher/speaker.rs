//! A Pusher connection over a Herald session: what its client sends, done with the
//! session's own steps, and what the hub queues for it, in Pusher's words (presence per
//! user: [`super::roster`]).

use std::sync::Arc;

use bytes::Bytes;
use herald_protocol::{
    json,
    pusher::{self, codes, ClientMessage, Kind},
    ChannelName, Since,
};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    occupancy::{Held, Occupancy, CHANNEL_EVENTS},
    resume::{Bookmarks, Page},
    roster::Roster,
    sign,
    socket::SocketId,
};
use crate::{
    config::PusherApp,
    error::Disconnect,
    fronts::line,
    limits::{Bucket, Rate},
    queue::Delivery,
    session::{Drained, GrantedMember, Positions, Session},
    transport::driver::Speaker,
};

mod client_events;
mod counts;
mod watchlist;

/// One Pusher client's connection.
#[derive(Debug)]
pub struct Pusher {
    session: Session,
    /// Its app (an index into `pusher.apps`).
    app: u16,
    socket_id: SocketId,
    /// What only some connections need, made when first needed: most never send a client
    /// event nor join a presence channel, and each byte here is in every connection's task
    /// (inline, these made an idle Pusher connection 0.5 KB larger than Herald's own).
    more: Option<Box<More>>,
    /// The node's counts of who occupies channels, when an app posts webhooks about it.
    occupancy: Option<Arc<Occupancy>>,
}

/// A connection's client-event allowance, presence channels and part in the counts.
#[derive(Debug)]
struct More {
    /// Client events per second (the app's `client_events_per_second`).
    client_events: Bucket,
    /// The presence channels it is in (a few at most: a list).
    rosters: Vec<Roster>,
    /// Its part in the counts of who occupies each channel it is in.
    held: HeldParts,
    /// The page it resumes, and where pages are kept, when it opted in.
    page: Option<(Arc<Bookmarks>, Page)>,
    /// The user it signed in as (`pusher:signin`), whose channel it may subscribe to.
    signed_in: Option<Box<str>>,
    /// The users its signin watches (see [`watchlist`]).
    watching: Vec<watchlist::Watched>,
}

/// A connection's parts in the counts of who occupies channels, by channel.
pub type HeldParts = Vec<(ChannelName, Held)>;

/// A presence channel's signed `channel_data`.
#[derive(Deserialize)]
struct ChannelData {
    user_id: UserId,
    #[serde(default)]
    user_info: Option<Box<RawValue>>,
}

/// A user id, which clients write as a string or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum UserId {
    Text(String),
    Number(serde_json::Number),
}

impl UserId {
    fn into_string(self) -> String {
        match self {
            UserId::Text(s) => s,
            UserId::Number(n) => n.to_string(),
        }
    }
}

/// Longest user id accepted (Pusher's limit).
const MAX_USER_ID: usize = 128;

/// Longest `channel_data` accepted.
const MAX_CHANNEL_DATA: usize = 4096;

impl Pusher {
    /// The connection of `session`, a client of app `app` (its index in `pusher.apps`).
    pub fn new(
        session: Session,
        app: u16,
        socket_id: SocketId,
        occupancy: Option<Arc<Occupancy>>,
    ) -> Self {
        Self {
            session,
            app,
            socket_id,
            more: None,
            occupancy,
        }
    }

    /// Herald's client id of the connection.
    pub fn client(&self) -> &str {
        self.session.client()
    }

    /// The connection is page `page`'s, kept in `bookmarks` when it ends.
    pub fn resumes(&mut self, bookmarks: Arc<Bookmarks>, page: Page) {
        self.more().page = Some((bookmarks, page));
    }

    fn page(&mut self) -> Option<&mut Page> {
        self.more.as_mut()?.page.as_mut().map(|(_, p)| p)
    }

    /// Keeps where the page's channels stand, for its next connection.
    pub fn keep_page(&mut self) {
        if let Some((bookmarks, mut page)) = self.more.as_mut().and_then(|m| m.page.take()) {
            let bookmark = page.bookmark(self.socket_id);
            let node = self.session.node();
            let account = self.session.address().map(|ip| node.limits.hold(ip));
            let window = self.app().resume_window;
            let (page_of, client) = ((self.app, &*page.proof), self.session.client());
            bookmarks.keep(page_of, client, bookmark, window, account);
        }
    }

    /// Gives back a connection's part in the counts of who occupies its channels (when
    /// it ends, after the session has left them, or when it leaves a channel).
    pub async fn leave_counts(occupancy: Arc<Occupancy>, held: HeldParts) {
        for (_, held) in held {
            occupancy.leave(held).await;
        }
    }

    /// What [`Self::leave_counts`] gives back when the connection ends: none when it holds
    /// no part.
    pub fn take_counts(&mut self) -> Option<(Arc<Occupancy>, HeldParts)> {
        let held = std::mem::take(&mut self.more.as_mut()?.held);
        if held.is_empty() {
            return None;
        }
        Some((self.occupancy.clone()?, held))
    }

    /// Counts the connection in `channel`'s subscribers, for the app's webhooks (its
    /// user's are the presence channel's own membership).
    async fn count_in(&mut self, channel: &ChannelName) {
        let Some(occupancy) = self.occupancy.clone() else {
            return;
        };
        if let Some(held) = occupancy.enter(self.app(), channel).await {
            self.more().held.push((channel.clone(), held));
        }
    }

    /// Counts the connection out of `channel`.
    async fn count_out(&mut self, channel: &ChannelName) {
        let (Some(occupancy), Some(more)) = (self.occupancy.clone(), self.more.as_mut()) else {
            return;
        };
        let (out, kept) = std::mem::take(&mut more.held)
            .into_iter()
            .partition(|(c, _)| c == channel);
        more.held = kept;
        Self::leave_counts(occupancy, out).await;
    }

    fn more(&mut self) -> &mut More {
        let rate = self.app().client_events_per_second;
        self.more.get_or_insert_with(|| {
            Box::new(More {
                client_events: Bucket::full(Rate::strictly_per_second(rate)),
                rosters: Vec::new(),
                held: Vec::new(),
                page: None,
                signed_in: None,
                watching: Vec::new(),
            })
        })
    }

    /// The page proved it is the one whose connection was given `proof`: what that
    /// connection left is resumed as the page subscribes again.
    async fn resume(&mut self, proof: &str) {
        let Some((bookmarks, _)) = self.more.as_ref().and_then(|m| m.page.as_ref()) else {
            return;
        };
        let bookmarks = bookmarks.clone();
        let node = self.session.node().clone();
        let found = Box::pin(bookmarks.resume(&node, self.app, proof)).await;
        if let Some(page) = self.page() {
            page.found = found;
        }
    }

    fn rosters(&self) -> &[Roster] {
        self.more.as_ref().map_or(&[], |m| &m.rosters)
    }

    fn roster(&mut self, channel: &ChannelName) -> Option<&mut Roster> {
        let more = self.more.as_mut()?;
        more.rosters.iter_mut().find(|r| &r.channel == channel)
    }

    fn app(&self) -> &PusherApp {
        &self.session.node().settings.config.pusher.apps[self.app as usize]
    }

    /// The Herald channel of Pusher channel `name` in this app.
    fn channel(&self, name: &str) -> Result<ChannelName, String> {
        let inside = pusher::inside_name(name).map_err(|e| e.0)?;
        ChannelName::new(&format!("{}:{inside}", self.app().namespace())).map_err(|e| e.to_string())
    }

    async fn handle_message(&mut self, message: &[u8], out: &mut Vec<u8>) {
        if let Err(f) = self.session.charge_command() {
            let said = f.message.replace("commands", "messages");
            line(out, pusher::error(None, &said));
            return;
        }
        let message = match pusher::decode(message) {
            Ok(m) => m,
            Err(e) => return line(out, pusher::error(None, &e.0)),
        };
        // A page proves it resumes before anything else, or not at all.
        let resumable = self
            .page()
            .is_some_and(|p| std::mem::take(&mut p.resumable));
        match message {
            // Answered with nothing, whatever the proof: a wrong one tells nothing.
            ClientMessage::Resume { proof } if resumable => self.resume(&proof).await,
            ClientMessage::Resume { .. } => {}
            ClientMessage::Ping => line(out, pusher::pong()),
            ClientMessage::Pong => {}
            ClientMessage::Subscribe(s) => self.subscribe(s, out).await,
            ClientMessage::Unsubscribe { channel } => {
                if let Ok(c) = self.channel(&channel) {
                    if let Some(more) = self.more.as_mut() {
                        more.rosters.retain(|r| r.channel != c);
                    }
                    if let Some(page) = self.page() {
                        page.closed(&c);
                    }
                    if self.session.close(&c).await {
                        self.count_out(&c).await;
                        self.count_out_of_subscriptions(&c).await;
                    }
                }
            }
            ClientMessage::Signin { auth, user_data } => self.sign_in(&auth, &user_data, out).await,
            ClientMessage::ClientEvent {
                event,
                channel,
                data,
            } => {
                if let Err(said) = self.client_event(&event, &channel, &data).await {
                    line(out, said);
                }
            }
        }
    }

    async fn subscribe(&mut self, s: pusher::Subscribe, out: &mut Vec<u8>) {
        let name = s.channel.clone();
        let refuse =
            |status: u16, message: &str| pusher::subscription_error(&name, status, message);
        let channel = match self.channel(&s.channel) {
            Ok(c) => c,
            Err(e) => return line(out, refuse(400, &e)),
        };
        let kind = Kind::of(&s.channel);
        let member = match self.admitted(kind, &s) {
            Ok(member) => member,
            Err(e) => return line(out, refuse(401, &e)),
        };
        let mut replay = None;
        if !self.session.subscribed(&channel) {
            let posts = CHANNEL_EVENTS.iter().any(|e| self.app().posts(e));
            if posts && self.session.node().hub.subscriber_count(&channel) == 0 {
                // Likely a channel's first subscriber, whose webhook (and its last's) the
                // app posts: charged to the address's calls to the backend, so that one
                // address cannot post thousands by subscribing to new names.
                if let Err(f) = self.session.charge_backend() {
                    return line(out, refuse(429, &f.message));
                }
            }
            let me = member.as_ref().map(|m| m.user.clone());
            let resume = self.page().and_then(|p| p.resume(&channel));
            self.session.grant_channel(channel.clone(), member);
            let since = resume.as_ref().map(|(since, _)| since.clone());
            let opened = match self.session.open(&channel, since.clone(), None).await {
                Ok(opened) => opened,
                Err(f) => return line(out, refuse(f.status().as_u16(), &f.message)),
            };
            if let Some(page) = self.page() {
                // The client has what it had before; a replay is confirmed by its pong.
                page.opened(
                    &channel,
                    since.unwrap_or(Since {
                        offset: opened.position.offset,
                        epoch: Some(opened.position.epoch.clone()),
                    }),
                );
            }
            if let Some((_, before)) = resume {
                replay = Some((opened, before));
            }
            self.count_in(&channel).await;
            self.count_in_subscriptions(&channel, &name).await;
            if let Some(me) = me {
                self.more().rosters.push(Roster::new(channel.clone(), me));
            }
        }
        let succeeded = match kind {
            Kind::Presence => match self.session.members(&channel).await {
                Ok(members) => match self.roster(&channel) {
                    Some(roster) => roster.list(&name, &members),
                    None => pusher::subscription_succeeded(&name, Some(&Default::default())),
                },
                Err(f) => return line(out, refuse(f.status().as_u16(), &f.message)),
            },
            _ => pusher::subscription_succeeded(&name, None),
        };
        line(out, succeeded);
        if let Some((opened, before)) = replay {
            // What the page missed, after the confirmation as a live event would be; not
            // what its last connection sent itself.
            for p in &opened.publications {
                let event = pusher::event(&name, p.data());
                if !event.except.as_deref().is_some_and(|e| before.is(e)) {
                    line(out, event.frame);
                }
            }
            if opened.recovered == Some(false) {
                let gap = serde_json::json!({
                    "event": "herald:gap",
                    "channel": name,
                    "data": r#"{"reason":"history no longer holds everything missed"}"#,
                });
                line(out, serde_json::to_vec(&gap).expect("json"));
            }
            return;
        }
        if pusher::cached(&name) {
            // Its last event, read after joining: anything newer arrives through the
            // queue, after this.
            match self.session.last_publication(&channel).await {
                Ok(Some(last)) => line(out, pusher::event(&name, last.data()).frame),
                Ok(None) => {
                    // Posted within the address's calls to the backend (see client events).
                    if !self.app().posts("cache_miss") || self.session.charge_backend().is_ok() {
                        self.webhook(
                            "cache_miss",
                            || serde_json::json!({ "name": "cache_miss", "channel": name }),
                        );
                    }
                    line(out, pusher::cache_miss(&name))
                }
                Err(f) => line(out, pusher::error(None, &f.message)),
            }
        }
    }

    /// Whether the client may subscribe to a channel of `kind`: for private and presence
    /// channels, the app's signature over `socket_id:channel[:channel_data]`; for presence,
    /// the member it makes the connection (user id, `user_info`).
    fn admitted(&self, kind: Kind, s: &pusher::Subscribe) -> Result<Option<GrantedMember>, String> {
        if kind == Kind::User {
            // As Pusher: a user's channel is its signed-in connections', no one else's.
            let me = self.more.as_ref().and_then(|m| m.signed_in.as_deref());
            if pusher::user_of_channel(&s.channel) != me {
                return Err(format!(
                    "{} is only for its user, signed in (pusher:signin)",
                    s.channel
                ));
            }
            return Ok(None);
        }
        if !kind.signed() {
            return Ok(None);
        }
        let app = self.app();
        let auth = s
            .auth
            .as_deref()
            .ok_or_else(|| format!("{} needs a signature (auth)", s.channel))?;
        let mut text = format!("{}:{}", self.socket_id, s.channel);
        if kind == Kind::Presence {
            let data = s
                .channel_data
                .as_deref()
                .ok_or("a presence channel needs channel_data")?;
            text.push(':');
            text.push_str(data);
        }
        let signed = auth.split_once(':').is_some_and(|(key, signature)| {
            key == app.key && sign::verify(&app.secret, &text, signature)
        });
        if !signed {
            return Err(format!("invalid signature for {}", s.channel));
        }
        if kind != Kind::Presence {
            return Ok(None);
        }
        let data = s.channel_data.as_deref().unwrap_or_default();
        if data.len() > MAX_CHANNEL_DATA {
            return Err(format!("channel_data is over {MAX_CHANNEL_DATA} bytes"));
        }
        let parsed: ChannelData = serde_json::from_str(data)
            .map_err(|e| format!("channel_data must hold a user_id: {e}"))?;
        // A number is given back as a number (pusher-js's `members.me.id` keeps it).
        let typed_id = match &parsed.user_id {
            UserId::Number(n) => Some(Bytes::from(n.to_string())),
            UserId::Text(_) => None,
        };
        let user = parsed.user_id.into_string();
        if user.is_empty() || user.len() > MAX_USER_ID {
            return Err(format!("user_id must be 1 to {MAX_USER_ID} bytes"));
        }
        let info = match parsed.user_info {
            Some(raw) => json::payload(&raw)?,
            None => Bytes::from_static(b"null"),
        };
        Ok(Some(GrantedMember {
            user: user.into(),
            info,
            typed_id,
        }))
    }

    /// `pusher:signin`: checks the app's signature over `socket_id::user::user_data`; then,
    /// when the app tells watchlists, the user is online and follows its watchlist.
    async fn sign_in(&mut self, auth: &str, user_data: &str, out: &mut Vec<u8>) {
        let app = self.app();
        let text = format!("{}::user::{user_data}", self.socket_id);
        let signed = auth.split_once(':').is_some_and(|(key, signature)| {
            key == app.key && sign::verify(&app.secret, &text, signature)
        });
        #[derive(Deserialize)]
        struct User {
            id: UserId,
        }
        let user = serde_json::from_str::<User>(user_data).ok();
        match (signed, user) {
            (true, Some(user)) => {
                // Known to the registry as the app's user, so that the app's backend can
                // end its connections (`terminate_connections`).
                let id = user.id.into_string();
                self.session.known_as(&user_key(self.app(), &id));
                self.more().signed_in = Some(id.as_str().into());
                line(out, pusher::signin_success(user_data));
                if self.app().watchlist_events {
                    self.watch(&id, user_data, out).await;
                }
            }
            (true, None) => line(
                out,
                pusher::error(Some(codes::UNAUTHORIZED), "user_data must hold an id"),
            ),
            (false, _) => line(
                out,
                pusher::error(Some(codes::UNAUTHORIZED), "invalid signature for signin"),
            ),
        }
    }

    /// Records webhook event `name` (its body made by `body`) when the app posts it.
    fn webhook(&self, name: &str, body: impl FnOnce() -> serde_json::Value) {
        super::post_webhook(self.session.node(), self.app as usize, name, body);
    }
}

/// How a signed-in user of `app` is known to the node's registry (users of two apps are
/// two users).
pub fn user_key(app: &PusherApp, user: &str) -> String {
    format!("{}:{user}", app.namespace())
}

impl Speaker for Pusher {
    fn session(&self) -> &Session {
        &self.session
    }

    fn confirm_writes(&mut self) -> Option<[u8; 8]> {
        let (_, page) = self.more.as_mut()?.page.as_mut()?;
        Some(page.written(self.session.written_positions()))
    }

    fn confirmed(&mut self, payload: &[u8]) {
        if let Some(page) = self.page() {
            page.pong(payload);
        }
    }

    fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    async fn handle<'f>(
        &mut self,
        frame: &'f [u8],
        out: &mut Vec<u8>,
        _flush_at: usize,
    ) -> Result<&'f [u8], Disconnect> {
        // A WebSocket message is one Pusher message.
        self.handle_message(frame, out).await;
        Ok(&[])
    }

    /// Pusher's protocol has no word for a subscription the server ended: the channel is
    /// left (its roster with it) and nothing is said. (A Pusher client's channels are
    /// granted by signatures, which do not expire; only a hook's grant can.)
    async fn expire(&mut self) -> Result<Vec<Vec<u8>>, Disconnect> {
        self.session.expire().await?;
        let Self { session, more, .. } = self;
        if let Some(more) = more.as_mut() {
            more.rosters.retain(|r| session.subscribed(&r.channel));
        }
        Ok(Vec::new())
    }

    fn drain(
        &mut self,
        max_bytes: usize,
        mut emit: impl FnMut(&[u8], Option<&Delivery>, Positions<'_>),
    ) -> Result<(), Disconnect> {
        let Self {
            session,
            more,
            socket_id,
            ..
        } = self;
        session.drain_deliveries(max_bytes, |drained, at| match drained {
            // An operator's unsubscribe has no Pusher words: the channel's roster goes.
            Drained::Unsubscribed(channel, _) => {
                if let Some(more) = more.as_mut() {
                    more.rosters.retain(|r| r.channel != *channel);
                }
            }
            // Herald's other notices (a conflated run) never reach a front.
            Drained::Notice(_) => {}
            Drained::Delivery(d) if d.offset == 0 => {
                if counts::counted(&d.channel).is_some() {
                    if let Some(count) = counts::changed(d) {
                        emit(count, None, at);
                    }
                } else if let Some(more) = more.as_mut() {
                    if let Some(r) = more.rosters.iter_mut().find(|r| r.channel == d.channel) {
                        r.changed(d.json(), &mut |m| emit(m, None, at));
                    } else if let Some(w) =
                        more.watching.iter_mut().find(|w| w.channel == d.channel)
                    {
                        watchlist::changed(w, d.json(), &mut |m| emit(m, None, at));
                    }
                }
            }
            Drained::Delivery(d) => {
                let event = super::event_of(d);
                if !event.except.as_deref().is_some_and(|e| socket_id.is(e)) {
                    emit(&event.frame, Some(d), at);
                }
            }
        })
    }
}

//! A Phoenix connection over a Herald session: joins, leaves, heartbeats and client events
//! done with the session's own steps; broadcasts in Phoenix's words.

use std::collections::HashMap;

use herald_protocol::{
    json,
    phoenix::{self, Message, Vsn},
    pusher, ChannelName, DisconnectCode,
};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{presence::Tracked, Sender};
use crate::{
    error::Disconnect,
    fronts::line,
    queue::Delivery,
    session::{raw_json, Drained, Positions, Session},
    transport::driver::Speaker,
};

/// One Phoenix client's connection.
#[derive(Debug)]
pub struct Phoenix {
    session: Session,
    vsn: Vsn,
    /// What it joined. Boxed: every idle connection's task holds its `Phoenix` inline,
    /// and these 72 bytes kept that task a size class (256 bytes) larger.
    topics: Box<Topics>,
    /// Who it is as the sender of its client events (`broadcast_from`).
    sender: Sender,
    /// Whether its transport carries binary messages (the WebSocket; the long-poll's
    /// answers are text, where binary payloads go as base64).
    binary: bool,
}

/// The topics a Phoenix connection joined.
#[derive(Debug, Default)]
struct Topics {
    /// Each with the `join_ref` of its join (what phoenix.js matches the server's
    /// messages of a join by).
    joined: HashMap<ChannelName, Option<String>>,
    /// The joined topics whose presence it is shown (Phoenix Presence).
    presence: Vec<Tracked>,
}

impl Phoenix {
    /// The connection of `session`, speaking serializer `vsn`, over a transport that
    /// carries `binary` messages or not.
    pub fn new(session: Session, vsn: Vsn, sender: Sender, binary: bool) -> Self {
        Self {
            session,
            vsn,
            sender,
            topics: Box::default(),
            binary,
        }
    }

    fn reply(&self, out: &mut Vec<u8>, m: &Message, ok: bool, response: &RawValue) {
        if m.reference.is_some() {
            line(out, phoenix::reply(self.vsn, m, ok, response));
        }
    }

    fn refuse(&self, out: &mut Vec<u8>, m: &Message, reason: &str, code: Option<u16>) {
        self.reply(out, m, false, &phoenix::reason(reason, code));
    }

    async fn handle_message(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), Disconnect> {
        if let Some((m, data)) = phoenix::decode_binary_push(bytes) {
            // A binary push (a message of its own kind, never JSON text): broadcast as
            // bytes. Whatever goes wrong is answered, and the socket stays.
            match self.session.charge_command() {
                Err(f) => self.refuse(out, &m, &f.message, Some(f.wire_code())),
                Ok(()) => self.binary_event(&m, data, out).await,
            }
            return Ok(());
        }
        let m = phoenix::decode(self.vsn, bytes)
            .map_err(|e| Disconnect::because(DisconnectCode::BadRequest, e.0))?;
        // Every message, heartbeats included, is one command of the connection's (and,
        // for sessions that live one request each, its address's) allowance, as on
        // Herald's own protocol: over it, the message is refused, not executed.
        if let Err(f) = self.session.charge_command() {
            self.refuse(out, &m, &f.message, Some(f.wire_code()));
            return Ok(());
        }
        match (m.topic.as_str(), m.event.as_str()) {
            (phoenix::SOCKET_TOPIC, "heartbeat") => self.reply(out, &m, true, phoenix::empty()),
            (_, "phx_join") => self.join(&m, out).await,
            (_, "phx_leave") => {
                if let Ok(channel) = ChannelName::new(&m.topic) {
                    self.leave(&channel).await;
                }
                self.reply(out, &m, true, phoenix::empty());
                line(
                    out,
                    ended(self.vsn, &m.topic, m.join_ref.as_deref(), "phx_close"),
                );
            }
            _ => self.event(&m, out).await,
        }
        Ok(())
    }

    async fn join(&mut self, m: &Message, out: &mut Vec<u8>) {
        let channel = match ChannelName::new(&m.topic) {
            Ok(c) => c,
            Err(e) => return self.refuse(out, m, &e.to_string(), None),
        };
        match self.topics.joined.get(&channel) {
            // The same join asked again: it goes on.
            Some(join_ref) if *join_ref == m.join_ref => {
                return self.reply(out, m, true, phoenix::empty());
            }
            // A new join of a joined topic (phoenix.js rejoining after a timeout or an
            // error): as Phoenix does, the old join is closed (`phx_close` with its ref,
            // which phoenix.js's new join ignores) and the topic joined afresh.
            Some(_) => {
                let old = self.leave(&channel).await.flatten();
                line(
                    out,
                    ended(self.vsn, channel.as_str(), old.as_deref(), "phx_close"),
                );
            }
            None => {}
        }
        #[derive(Deserialize)]
        struct Params {
            #[serde(default)]
            token: Option<String>,
        }
        let payload: Option<&RawValue> = serde_json::from_str(&m.payload).ok();
        let params = serde_json::from_str::<Params>(&m.payload).ok();
        if let Some(token) = params.and_then(|p| p.token) {
            if let Err(f) = self.session.accept_token(&channel, &token).await {
                return self.refuse(out, m, &f.message, Some(f.wire_code()));
            }
        }
        match self.session.open(&channel, None, payload).await {
            Ok(_) => {
                self.topics
                    .joined
                    .insert(channel.clone(), m.join_ref.clone());
                self.reply(out, m, true, phoenix::empty());
                self.present(&channel, m, out).await;
            }
            Err(f) => self.refuse(out, m, &f.message, Some(f.wire_code())),
        }
    }

    /// Phoenix Presence: when the namespace keeps presence and shows it to this client,
    /// the topic's members as `presence_state`, then its changes as `presence_diff`.
    async fn present(&mut self, channel: &ChannelName, m: &Message, out: &mut Vec<u8>) {
        let Ok(members) = self.session.members(channel).await else {
            return;
        };
        let (tracked, state) = Tracked::start(channel.clone(), &members);
        self.topics.presence.push(tracked);
        let state = serde_json::value::to_raw_value(&state).expect("state serialises");
        let push = phoenix::encode(
            self.vsn,
            m.join_ref.as_deref(),
            None,
            &m.topic,
            "presence_state",
            &state,
        );
        line(out, push);
    }

    /// The joined topic of a client's event; `None` (and the refusal said) if it has not
    /// joined it.
    fn joined_topic(&self, m: &Message, out: &mut Vec<u8>) -> Option<ChannelName> {
        match ChannelName::new(&m.topic) {
            Ok(channel) if self.topics.joined.contains_key(&channel) => Some(channel),
            _ => {
                self.refuse(out, m, "unmatched topic", None);
                None
            }
        }
    }

    /// A client's event on a joined topic: published through the session (the rules, the
    /// publish hook), as the event `[phoenix] events` names.
    async fn event(&mut self, m: &Message, out: &mut Vec<u8>) {
        let Some(channel) = self.joined_topic(m, out) else {
            return;
        };
        let node = self.session.node().clone();
        if node.settings.config.phoenix.rpc_events.contains(&m.event) {
            return self.answer_by_hook(&channel, m, out).await;
        }
        let events = &node.settings.config.phoenix.events;
        let event = events.get(&m.event).unwrap_or(&m.event);
        let tag = self.sender_tag(&channel);
        let stored = pusher::stored(event, payload(m), None, tag.as_deref());
        self.publish(channel, m, &stored, out).await;
    }

    /// A client's binary push on a joined topic: stored with its bytes in base64 (so that
    /// every reader of the channel can take it as JSON), broadcast as bytes where the
    /// transport carries them.
    async fn binary_event(&mut self, m: &Message, data: &[u8], out: &mut Vec<u8>) {
        let Some(channel) = self.joined_topic(m, out) else {
            return;
        };
        let config = &self.session.node().settings.config.phoenix;
        if config.rpc_events.contains(&m.event) {
            let reason = "the rpc hook answers JSON payloads only";
            return self.refuse(out, m, reason, None);
        }
        let event = config.events.get(&m.event).unwrap_or(&m.event).clone();
        let tag = self.sender_tag(&channel);
        let stored = phoenix::stored_binary(&event, data, tag.as_deref());
        self.publish(channel, m, &stored, out).await;
    }

    /// The tag its events carry in a `broadcast_from` namespace, whose sender does not
    /// hear its own.
    fn sender_tag(&self, channel: &ChannelName) -> Option<String> {
        let config = &self.session.node().settings.config.phoenix;
        config.broadcast_from(channel).then(|| self.sender.tag())
    }

    /// Publishes a client's event (`stored`, JSON) and replies to its push.
    async fn publish(
        &mut self,
        channel: ChannelName,
        m: &Message,
        stored: &[u8],
        out: &mut Vec<u8>,
    ) {
        let stored: &RawValue = serde_json::from_slice(stored).expect("stored events are JSON");
        let payload = match json::payload(stored) {
            Ok(p) => p,
            Err(e) => return self.refuse(out, m, &e, None),
        };
        match self.session.publish_checked(&channel, payload).await {
            Ok(_) => self.reply(out, m, true, phoenix::empty()),
            Err(f) => self.refuse(out, m, &f.message, Some(f.wire_code())),
        }
    }
}

impl Phoenix {
    /// Leaves `channel` (its subscription, its presence): the `join_ref` of the join it
    /// ends, if it was joined.
    async fn leave(&mut self, channel: &ChannelName) -> Option<Option<String>> {
        let join_ref = self.topics.joined.remove(channel);
        self.topics.presence.retain(|t| t.channel != *channel);
        self.session.close(channel).await;
        join_ref
    }

    /// A push of one of `[phoenix] rpc_events`: the rpc hook's answer is its reply, as a
    /// channel's `handle_in` replies; nothing is broadcast.
    async fn answer_by_hook(&mut self, channel: &ChannelName, m: &Message, out: &mut Vec<u8>) {
        match self
            .session
            .call_rpc(&m.event, payload(m), Some(channel))
            .await
        {
            Ok(answer) => self.reply(out, m, true, raw_json(&answer)),
            Err(f) => self.refuse(out, m, &f.message, Some(f.wire_code())),
        }
    }
}

impl Speaker for Phoenix {
    fn session(&self) -> &Session {
        &self.session
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
        // A WebSocket message is one Phoenix message.
        self.handle_message(frame, out).await?;
        Ok(&[])
    }

    /// A topic whose subscription token expired is left and told `phx_error`, as Phoenix
    /// tells a channel that crashed: phoenix.js rejoins it after its backoff, with its
    /// join params (a function of them may fetch a new token), and is refused if the
    /// client may no longer read it.
    async fn expire(&mut self) -> Result<Vec<Vec<u8>>, Disconnect> {
        // Herald's `unsubscribe` pushes have no Phoenix words: which topics went is read
        // from the session.
        self.session.expire().await?;
        let Self {
            session,
            vsn,
            topics,
            ..
        } = self;
        let Topics { joined, presence } = &mut **topics;
        let mut errors = Vec::new();
        joined.retain(|topic, join_ref| {
            let kept = session.subscribed(topic);
            if !kept {
                errors.push(ended(
                    *vsn,
                    topic.as_str(),
                    join_ref.as_deref(),
                    "phx_error",
                ));
            }
            kept
        });
        presence.retain(|t| session.subscribed(&t.channel));
        Ok(errors)
    }

    fn drain(
        &mut self,
        max_bytes: usize,
        mut emit: impl FnMut(&[u8], Option<&Delivery>, Positions<'_>),
    ) -> Result<(), Disconnect> {
        let Self {
            session,
            vsn,
            topics,
            sender,
            binary,
        } = self;
        let Topics { joined, presence } = &mut **topics;
        let (me, binary) = (*sender, *binary);
        let vsn = *vsn;
        session.drain_deliveries(max_bytes, |drained, at| match drained {
            // An operator ended the join (Herald's 120: not to be joined again by itself):
            // told as Phoenix tells a channel that stopped normally, `phx_close`, which
            // phoenix.js does not rejoin.
            Drained::Unsubscribed(channel, _) => {
                presence.retain(|t| t.channel != *channel);
                if let Some(join_ref) = joined.remove(channel) {
                    emit(
                        &ended(vsn, channel.as_str(), join_ref.as_deref(), "phx_close"),
                        None,
                        at,
                    );
                }
            }
            // Herald's other notices (a conflated run) never reach a front.
            Drained::Notice(_) => {}
            Drained::Delivery(d) if d.offset == 0 => {
                let Some(tracked) = presence.iter_mut().find(|t| t.channel == d.channel) else {
                    return;
                };
                if let Some(diff) = tracked.diff(d.json()) {
                    let diff = serde_json::value::to_raw_value(&diff).expect("diffs serialise");
                    let topic = d.channel.as_str();
                    emit(
                        &phoenix::encode(vsn, None, None, topic, "presence_diff", &diff),
                        None,
                        at,
                    );
                }
            }
            Drained::Delivery(d) => {
                let broadcast = super::broadcast_of(d, vsn);
                if broadcast.for_connection(me) {
                    emit(broadcast.frame(binary), Some(d), at);
                }
            }
        })
    }
}

/// What tells a client its join of `topic` (made with `join_ref`) ended: `event` is
/// `phx_error` (phoenix.js rejoins after its backoff) or `phx_close` (it does not). The
/// ref is the join's own, as Phoenix sends it.
fn ended(vsn: Vsn, topic: &str, join_ref: Option<&str>, event: &str) -> Vec<u8> {
    phoenix::encode(vsn, join_ref, join_ref, topic, event, phoenix::empty())
}

/// A decoded message's payload: JSON, as [`phoenix::decode`] checked it.
fn payload(m: &Message) -> &RawValue {
    serde_json::from_str(&m.payload).expect("a decoded message's payload is JSON")
}

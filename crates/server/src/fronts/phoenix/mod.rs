//! The Phoenix Channels front: `phoenix.js` (and Tsung's Phoenix sessions) connect to
//! `/socket/websocket` unchanged.
//!
//! A topic is Herald's channel of the same name, so everything about it is Herald's: the
//! namespace's rules, tokens (the socket's `token` param is the connection token, a join
//! payload's `token` a subscription token; phoenix.js's `authToken` option is the
//! connection token too, [`auth_token`]), the connect hook (told the socket's params)
//! and the subscribe hook (told the join payload), the publish hook. A client's event on a
//! joined topic is published as `{"event": E, "data": payload}` (`E` renamed by
//! `[phoenix] events`) and broadcast to every member, the sender included, as Phoenix's
//! `broadcast!` does; publications from Herald's API and the other fronts arrive the same
//! way (see [`herald_protocol::phoenix`]).
//!
//! - [`socket`]: the WebSocket endpoint and the framing the hub writes with;
//! - [`speaker`]: joins, leaves, heartbeats and events, over the session;
//! - [`longpoll`]: phoenix.js's long-poll fallback (`/socket/longpoll`), the same speaker.

mod auth_token;
mod longpoll;
mod presence;
mod socket;
mod speaker;

pub use longpoll::Polls;

use std::sync::Arc;

use axum::{routing::get, Router};

use crate::node::Node;

/// The front's WebSocket route.
pub fn routes() -> Router<Arc<Node>> {
    Router::new().route("/socket/websocket", get(socket::connect))
}

/// The long-poll fallback's routes (with the HTTP transports: their CORS and body limit),
/// given the node's long-poll sessions as an extension.
pub fn polling_routes() -> Router<Arc<Node>> {
    Router::new().route("/socket/longpoll", get(longpoll::poll).post(longpoll::send))
}

/// The publication `d` as a Phoenix broadcast on its topic (the channel) for serializer
/// `vsn`, made once per delivery and shared by every Phoenix connection of that serializer.
pub(crate) fn broadcast_of(
    d: &crate::queue::Delivery,
    vsn: herald_protocol::phoenix::Vsn,
) -> &Broadcast {
    use herald_protocol::phoenix::{broadcast, Vsn};
    let i = match vsn {
        Vsn::V1 => 0,
        Vsn::V2 => 1,
    };
    d.encoded(crate::fronts::slots::PHOENIX[i], |d| {
        let publication = herald_protocol::Publication {
            offset: d.offset,
            record: d.record.clone(),
        };
        let made = broadcast(vsn, d.channel.as_str(), publication.data());
        Broadcast {
            frame: bytes::Bytes::from(made.frame),
            text: made.text.map(bytes::Bytes::from),
            except: made.except.as_deref().and_then(Sender::parse),
        }
    })
}

/// A publication as a Phoenix broadcast, shared by every connection of a serializer.
#[derive(Debug)]
pub(crate) struct Broadcast {
    pub frame: bytes::Bytes,
    /// The broadcast as JSON text when `frame` is a binary message, for a transport that
    /// carries text only (the long-poll).
    pub text: Option<bytes::Bytes>,
    /// The Phoenix connection that sent it, which is not to hear it (`broadcast_from`).
    pub except: Option<Sender>,
}

impl Broadcast {
    /// Whether connection `me` hears it.
    pub fn for_connection(&self, me: Sender) -> bool {
        self.except != Some(me)
    }

    /// The message for a connection: text only, or binary messages too.
    pub fn frame(&self, binary: bool) -> &bytes::Bytes {
        match &self.text {
            Some(text) if !binary => text,
            _ => &self.frame,
        }
    }
}

/// A Phoenix connection as its client events name their sender, for
/// `[phoenix] broadcast_from`: 64 random bits, public (written into the publication, as
/// Pusher's `socket_id` is), unlike the session's client id, which is a capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sender(u64);

impl Sender {
    const PREFIX: &'static str = "phx.";

    /// A new connection's.
    pub fn random() -> Self {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the operating system's random generator works");
        Self(u64::from_le_bytes(bytes))
    }

    /// As a publication names it.
    pub fn tag(self) -> String {
        format!("{}{:016x}", Self::PREFIX, self.0)
    }

    /// The Phoenix connection a publication's `socket_id` names, if it names one.
    fn parse(tag: &str) -> Option<Self> {
        let hex = tag.strip_prefix(Self::PREFIX)?;
        (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok().map(Self))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_reads_back_from_its_tag_and_nothing_else_is_one() {
        let me = Sender::random();
        assert_eq!(Sender::parse(&me.tag()), Some(me));
        assert_eq!(Sender::parse("123.456"), None, "a Pusher socket id");
        assert_eq!(Sender::parse("phx.12"), None);
        assert_eq!(Sender::parse("phx.zzzzzzzzzzzzzzzz"), None);
    }
}

//! Which transport a client came by: one identity for its name (as hooks, metrics and
//! logs say it), whether its sessions are requests, and its slot in the metrics.

use serde::Serialize;

/// The transport a client came by, as hooks are told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// `/connection/websocket`.
    #[default]
    Websocket,
    /// `/connection/sse`.
    Sse,
    /// `/connection/stream` (HTTP streaming).
    Stream,
    /// `/connection/iframe` (forever frame).
    Iframe,
    /// `/connection/longpoll`.
    Longpoll,
    /// `/connection/poll`.
    Poll,
    /// `POST /connection/send` without a stream.
    Send,
    /// `/app/{key}`: a Pusher client's WebSocket (see [`crate::fronts::pusher`]).
    Pusher,
    /// `/socket/websocket`: a Phoenix client's WebSocket (see [`crate::fronts::phoenix`]).
    Phoenix,
    /// A Centrifugo client's WebSocket (see [`crate::fronts::centrifugo`]).
    Centrifugo,
}

impl Transport {
    /// Its name, as hooks and metrics say it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Websocket => "websocket",
            Self::Sse => "sse",
            Self::Stream => "stream",
            Self::Iframe => "iframe",
            Self::Longpoll => "longpoll",
            Self::Poll => "poll",
            Self::Send => "send",
            Self::Pusher => "pusher",
            Self::Phoenix => "phoenix",
            Self::Centrifugo => "centrifugo",
        }
    }

    /// The transports whose sessions are connections (or poll requests), counted in the
    /// metrics under their [`Transport::name`]; a send without a stream is a command.
    pub const COUNTED: [Transport; 9] = [
        Self::Websocket,
        Self::Sse,
        Self::Stream,
        Self::Iframe,
        Self::Longpoll,
        Self::Poll,
        Self::Pusher,
        Self::Phoenix,
        Self::Centrifugo,
    ];

    /// Its place in [`Transport::COUNTED`], if it is counted.
    pub fn counted(self) -> Option<usize> {
        Self::COUNTED.iter().position(|t| *t == self)
    }

    /// Whether each of its sessions is one request (polls, sends), not a connection that
    /// lives.
    pub fn is_request(self) -> bool {
        matches!(self, Self::Longpoll | Self::Poll | Self::Send)
    }
}

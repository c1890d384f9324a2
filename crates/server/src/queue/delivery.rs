//! A publication as the hub hands it to every subscriber's queue: encoded once, and
//! framed (and compressed) once per kind of socket that writes it.

use std::{sync::OnceLock, time::Instant};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch};

/// A publication encoded once by the hub and shared by every subscriber's queue.
#[derive(Debug)]
pub struct Delivery {
    /// The channel.
    pub channel: ChannelName,
    /// The stream epoch the offset belongs to.
    pub epoch: Epoch,
    /// The publication's offset.
    pub offset: u64,
    /// The encoded push, one JSON line without the newline.
    pub json: Bytes,
    /// The publication's record (see [`herald_protocol::Publication`]), for the fronts
    /// that encode it their own way; empty for a presence push.
    pub record: Bytes,
    /// The publication as a Pusher event, made by the first Pusher connection that takes it
    /// and shared by the rest.
    pusher: OnceLock<herald_protocol::pusher::Event>,
    /// The publication as a Phoenix broadcast, per serializer (1.0.0, 2.0.0), made once.
    phoenix: [OnceLock<Bytes>; 2],
    /// The push framed for each kind of [`DirectSocket`] (by [`Lane`]), made by the first
    /// one that writes it and shared by the rest.
    pub framed: [OnceLock<Bytes>; LANES],
    /// The same, compressed (permessage-deflate), for the connections that negotiated it.
    deflated: [OnceLock<Bytes>; LANES],
    /// When the hub got it: the start of its delivery latency.
    pub at: Instant,
}

impl Delivery {
    /// A delivery of an encoded push.
    pub fn new(channel: ChannelName, epoch: Epoch, offset: u64, json: Bytes) -> Self {
        Self {
            channel,
            epoch,
            offset,
            json,
            record: Bytes::new(),
            pusher: OnceLock::new(),
            phoenix: Default::default(),
            framed: Default::default(),
            deflated: Default::default(),
            at: Instant::now(),
        }
    }

    /// This delivery, carrying its publication's record.
    pub fn carrying(mut self, record: Bytes) -> Self {
        self.record = record;
        self
    }

    /// The publication as a Pusher event on the channel's Pusher name (the part after
    /// the app's namespace), made once.
    pub fn pusher(&self) -> &herald_protocol::pusher::Event {
        self.pusher.get_or_init(|| {
            let name = self.channel.as_str();
            let name = name.split_once(':').map_or(name, |(_, rest)| rest);
            let publication = herald_protocol::Publication {
                offset: self.offset,
                record: self.record.clone(),
            };
            herald_protocol::pusher::event(name, publication.data())
        })
    }

    /// The publication as a Phoenix broadcast on its topic (the channel), made once per
    /// serializer.
    pub fn phoenix(&self, vsn: herald_protocol::phoenix::Vsn) -> &Bytes {
        use herald_protocol::phoenix::{broadcast, Vsn};
        let i = match vsn {
            Vsn::V1 => 0,
            Vsn::V2 => 1,
        };
        self.phoenix[i].get_or_init(|| {
            let publication = herald_protocol::Publication {
                offset: self.offset,
                record: self.record.clone(),
            };
            broadcast(vsn, self.channel.as_str(), publication.data()).into()
        })
    }
}

/// The kinds of socket the hub writes to directly, each with its framing of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A WebSocket text frame.
    WebSocket,
    /// An NDJSON line in an HTTP chunk.
    Ndjson,
    /// An SSE event (id: the channel's position) in an HTTP chunk.
    Sse,
    /// A Pusher event in a WebSocket text frame.
    Pusher,
    /// A Phoenix broadcast (serializer 1.0.0) in a WebSocket text frame.
    PhoenixV1,
    /// A Phoenix broadcast (serializer 2.0.0) in a WebSocket text frame.
    PhoenixV2,
}

/// How many kinds of [`Lane`] there are.
pub const LANES: usize = 6;

impl Delivery {
    /// The delivery framed for `lane`, made by `make` the first time.
    pub fn framed(&self, lane: Lane, make: impl FnOnce(&Self) -> Bytes) -> &Bytes {
        self.framed[lane as usize].get_or_init(|| make(self))
    }

    /// The delivery framed and compressed for `lane`, made by `make` the first time.
    pub fn deflated(&self, lane: Lane, make: impl FnOnce(&Self) -> Bytes) -> &Bytes {
        self.deflated[lane as usize].get_or_init(|| make(self))
    }
}

//! Protocol fronts: other real-time protocols spoken over Herald's one channel model, so
//! that clients written for them connect unchanged. Each is a parser and a framing over
//! the same session, hub, queue and presence as Herald's own protocol (no second hub):
//! what one front publishes, every other client of the channel receives.
//!
//! - [`pusher`]: Pusher Channels, protocol 7 (`pusher-js`, Laravel Echo), with its signed
//!   HTTP API.
//! - [`phoenix`]: Phoenix Channels (`phoenix.js`, serializers 1.0.0 and 2.0.0).
//! - [`centrifugo`]: Centrifugo's client protocol (`centrifuge-js` and its other SDKs), a
//!   codec over Herald's own session.

pub mod centrifugo;
mod members;
pub mod phoenix;
pub mod pusher;

/// Where each front keeps what it makes of a delivery (an [`Encoding`]) and which lane its
/// frames take (a [`Lane`]): a slot apiece in every delivery, listed here so that no two
/// fronts share one. A new front adds its own.
pub(crate) mod slots {
    use crate::queue::{Encoding, Lane};

    /// A publication as a Pusher event.
    pub(crate) const PUSHER: Encoding = Encoding::new(0);
    /// A publication as a Phoenix broadcast, per serializer (1.0.0, 2.0.0).
    pub(crate) const PHOENIX: [Encoding; 2] = [Encoding::new(1), Encoding::new(2)];
    /// A presence push on a Pusher channel's count of subscriptions, as the
    /// `pusher_internal:subscription_count` its every subscriber is sent.
    pub(crate) const PUSHER_COUNT: Encoding = Encoding::new(3);
    /// A Pusher event in a WebSocket text frame.
    pub(crate) const PUSHER_LANE: Lane = Lane::new(4);
    /// A Phoenix broadcast in a WebSocket text frame, per serializer.
    pub(crate) const PHOENIX_LANES: [Lane; 2] = [Lane::new(5), Lane::new(6)];
    /// A Centrifugo push in a WebSocket message, per codec (JSON, Protobuf).
    pub(crate) const CENTRIFUGO_LANES: [Lane; 2] = [Lane::new(7), Lane::new(8)];
}

/// Appends one message to `out`, the answers a front's speaker gives the driver: a line
/// each (JSON holds no raw line break), sent as a WebSocket message each.
pub(crate) fn line(out: &mut Vec<u8>, message: Vec<u8>) {
    if !out.is_empty() {
        out.push(b'\n');
    }
    out.extend_from_slice(&message);
}

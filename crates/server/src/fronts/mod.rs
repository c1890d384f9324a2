//! Protocol fronts: other real-time protocols spoken over Herald's one channel model, so
//! that clients written for them connect unchanged. Each is a parser and a framing over
//! the same session, hub, queue and presence as Herald's own protocol (no second hub):
//! what one front publishes, every other client of the channel receives.
//!
//! - [`pusher`]: Pusher Channels, protocol 7 (`pusher-js`, Laravel Echo), with its signed
//!   HTTP API.
//! - [`phoenix`]: Phoenix Channels (`phoenix.js`, serializers 1.0.0 and 2.0.0).

mod members;
pub mod phoenix;
pub mod pusher;

/// Appends one message to `out`, the answers a front's speaker gives the driver: a line
/// each (JSON holds no raw line break), sent as a WebSocket message each.
pub(crate) fn line(out: &mut Vec<u8>, message: Vec<u8>) {
    if !out.is_empty() {
        out.push(b'\n');
    }
    out.extend_from_slice(&message);
}

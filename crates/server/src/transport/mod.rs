//! ⑤⑥ Transports: each one reads frames into a [`Session`](crate::session::Session),
//! drains its queue, adds its own framing and writes to the socket.

pub mod origin;
pub mod websocket;

/// Largest batch of queued publications written as one frame.
pub(crate) const MAX_BATCH_BYTES: usize = 64 * 1024;

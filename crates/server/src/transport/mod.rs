//! ⑤⑥ Transports: each one reads frames into a [`Session`](crate::session::Session),
//! drains its queue, adds its own framing and writes to the socket.
//!
//! | transport | endpoint | framing |
//! |---|---|---|
//! | WebSocket | `/connection/websocket` | text frames, one push per line |
//! | SSE | `/connection/sse` | `id:` cursor, `data:` push |
//! | HTTP streaming | `/connection/stream` | one push per line |
//! | forever frame | `/connection/iframe` | `<script>parent.cb(push)</script>` |
//! | long-poll | `/connection/longpoll` | `{"cursor", "messages"}` when something is new |
//! | poll | `/connection/poll` | `{"cursor", "messages"}` at once |
//! | send | `POST /connection/send` | commands from the HTTP transports |

pub mod date;
pub mod deadline;
pub mod driver;
pub mod http1;
pub mod poll;
pub mod request;
pub mod send;
pub mod stream;
pub mod websocket;

/// Largest batch of queued publications written as one frame.
pub(crate) const MAX_BATCH_BYTES: usize = 64 * 1024;

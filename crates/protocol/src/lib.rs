//! The Herald wire format, independent of any transport or runtime.
//!
//! A client sends **commands**; each command with an `id` gets exactly one **reply** with the
//! same id (a result or an error). The server also sends **pushes** (publications, disconnect
//! notices) that answer no command. In the JSON codec a frame holds one or more of these,
//! one JSON object per line:
//!
//! ```text
//! client → server   {"id":1,"subscribe":{"channel":"chat:lobby","since":{"offset":4,"epoch":"x1"}}}
//! server → client   {"id":1,"subscribe":{"epoch":"x1","offset":6,"recovered":true,"publications":[…]}}
//! server → client   {"pub":{"channel":"chat:lobby","offset":7,"data":{"text":"hi"}}}
//! ```
//!
//! `docs/protocol.md` is the full reference; this crate is its executable form.

pub mod centrifugo;
mod channel;
pub mod codec;
pub mod codes;
pub mod command;
pub mod cursor;
pub mod delta;
mod encoding;
pub mod json;
pub mod phoenix;
mod position;
pub mod protobuf;
pub mod pusher;
pub mod results;

pub use channel::{ChannelError, ChannelName, MAX_CHANNEL_LEN};
pub use codec::{Codec, Outcome, Push, Reply};
pub use codes::{reconnect_allowed, DisconnectCode, ErrorCode};
pub use command::{Command, Method};
pub use cursor::Cursor;
pub use encoding::Encoding;
pub use position::{
    conflation_key, valid_conflation_key, Epoch, Publication, Since, StreamPosition,
    MAX_CONFLATION_KEY,
};

//! The Pusher Channels protocol (version 7), as Herald's Pusher front speaks it: what a
//! `pusher-js` client sends, and the frames a server sends back. No I/O; fuzzed
//! (`crates/fuzz`, target `pusher`).
//!
//! Every message is one JSON object, one per WebSocket message:
//!
//! ```text
//! server → client  {"event":"pusher:connection_established","data":"{\"socket_id\":\"1.2\",\"activity_timeout\":120}"}
//! client → server  {"event":"pusher:subscribe","data":{"channel":"private-a","auth":"KEY:HMAC"}}
//! server → client  {"event":"pusher_internal:subscription_succeeded","channel":"private-a","data":"{}"}
//! server → client  {"event":"order-shipped","channel":"private-a","data":"{\"id\":1}"}
//! ```
//!
//! An event's `data` is usually a JSON string holding JSON (the server SDKs send it so); it
//! passes through as it came.
//!
//! **One channel model.** A Pusher channel `NAME` of an app is Herald's channel `NS:NAME`,
//! `NS` the app's namespace, so Herald's own API and clients reach the same channel. A
//! publication is stored as `{"event": E, "data": D}` (plus `"user_id"` for a client event
//! on a presence channel, and `"socket_id"`, the connection it is not sent back to); a
//! publication of any other shape (from Herald's own API) reaches Pusher clients as the
//! event [`PLAIN_EVENT`] with the whole payload as its data.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The protocol versions a client may ask for (`?protocol=`): their frames are alike.
pub const VERSIONS: std::ops::RangeInclusive<u32> = 5..=7;

/// The event a publication that is not a Pusher event arrives as.
pub const PLAIN_EVENT: &str = "message";

/// Longest channel name Pusher allows.
pub const MAX_CHANNEL_LEN: usize = 164;

/// Largest client event's data Pusher allows, in bytes.
pub const MAX_CLIENT_EVENT: usize = 10 * 1024;

/// Longest event name Pusher allows.
pub const MAX_EVENT_LEN: usize = 200;

/// Close and error codes, with the meanings Pusher gives them: 4000-4099 do not reconnect,
/// 4100-4199 reconnect after a pause, 4200-4299 reconnect at once.
pub mod codes {
    /// The app key names no app.
    pub const APP_NOT_FOUND: u16 = 4001;
    /// The app is disabled.
    pub const APP_DISABLED: u16 = 4003;
    /// The app has all the connections it may have.
    pub const OVER_QUOTA: u16 = 4004;
    /// No such path.
    pub const PATH_NOT_FOUND: u16 = 4005;
    /// `protocol=` is not a number.
    pub const INVALID_VERSION: u16 = 4006;
    /// `protocol=` is a version this server does not speak.
    pub const UNSUPPORTED_VERSION: u16 = 4007;
    /// No `protocol=`.
    pub const NO_VERSION: u16 = 4008;
    /// A signature or channel refused (subscription and client-event errors).
    pub const UNAUTHORIZED: u16 = 4009;
    /// The server is over capacity: reconnect after a pause.
    pub const OVER_CAPACITY: u16 = 4100;
    /// Reconnect at once (a restart, a lost position, a node that cannot reach its broker).
    pub const RECONNECT: u16 = 4200;
    /// The client answered no ping.
    pub const PONG_NOT_RECEIVED: u16 = 4201;
    /// The client was silent too long.
    pub const INACTIVE: u16 = 4202;
    /// A client event over the rate limit (the connection stays).
    pub const CLIENT_EVENT_RATE: u16 = 4301;
}

/// What a client sent.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// `pusher:ping`.
    Ping,
    /// `pusher:pong` (the answer to the server's `pusher:ping`).
    Pong,
    /// `pusher:subscribe`.
    Subscribe(Subscribe),
    /// `pusher:unsubscribe`.
    Unsubscribe {
        /// The channel.
        channel: String,
    },
    /// `pusher:signin` (user authentication).
    Signin {
        /// `KEY:HMAC` over `socket_id::user::user_data`.
        auth: String,
        /// The user, as JSON text with at least `id`.
        user_data: String,
    },
    /// `herald:resume`: a page that opted in to resuming proves it is the page whose
    /// connection was given `proof` (see `herald:page`), before anything else it sends.
    Resume {
        /// The proof its last connection was given.
        proof: String,
    },
    /// A client event (`client-…`) on a channel.
    ClientEvent {
        /// The event's name (starts with `client-`).
        event: String,
        /// The channel.
        channel: String,
        /// The data, as JSON text.
        data: String,
    },
}

/// `pusher:subscribe`'s data.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Subscribe {
    /// The channel.
    pub channel: String,
    /// `KEY:HMAC`, for private and presence channels.
    #[serde(default)]
    pub auth: Option<String>,
    /// For presence channels: `{"user_id": …, "user_info": …}` as JSON text, signed too.
    #[serde(default)]
    pub channel_data: Option<String>,
}

/// Why a message was not understood: answered with `pusher:error`, the connection stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    event: std::borrow::Cow<'a, str>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

/// Data that may come as an object or as a JSON string holding one (clients differ).
fn object<T: serde::de::DeserializeOwned>(
    raw: Option<&RawValue>,
    what: &str,
) -> Result<T, Malformed> {
    let raw = raw.ok_or_else(|| Malformed(format!("{what} needs data")))?;
    let bad = |e: serde_json::Error| Malformed(format!("{what}: {e}"));
    if raw.get().starts_with('"') {
        let text: String = serde_json::from_str(raw.get()).map_err(bad)?;
        return serde_json::from_str(&text).map_err(bad);
    }
    serde_json::from_str(raw.get()).map_err(bad)
}

/// Decodes one message. Never panics.
pub fn decode(message: &[u8]) -> Result<ClientMessage, Malformed> {
    let envelope: Envelope = serde_json::from_slice(message)
        .map_err(|e| Malformed(format!("not a Pusher message: {e}")))?;
    match &*envelope.event {
        "pusher:ping" => Ok(ClientMessage::Ping),
        "pusher:pong" => Ok(ClientMessage::Pong),
        "pusher:subscribe" => Ok(ClientMessage::Subscribe(object(
            envelope.data,
            "pusher:subscribe",
        )?)),
        "pusher:unsubscribe" => {
            #[derive(Deserialize)]
            struct Unsubscribe {
                channel: String,
            }
            let u: Unsubscribe = object(envelope.data, "pusher:unsubscribe")?;
            Ok(ClientMessage::Unsubscribe { channel: u.channel })
        }
        "pusher:signin" => {
            #[derive(Deserialize)]
            struct Signin {
                auth: String,
                user_data: String,
            }
            let s: Signin = object(envelope.data, "pusher:signin")?;
            Ok(ClientMessage::Signin {
                auth: s.auth,
                user_data: s.user_data,
            })
        }
        "herald:resume" => {
            #[derive(Deserialize)]
            struct Resume {
                proof: String,
            }
            let r: Resume = object(envelope.data, "herald:resume")?;
            Ok(ClientMessage::Resume { proof: r.proof })
        }
        event if event.starts_with("client-") => {
            let channel = envelope
                .channel
                .ok_or_else(|| Malformed("a client event needs a channel".into()))?;
            if event.len() > MAX_EVENT_LEN {
                return Err(Malformed(format!(
                    "event names are at most {MAX_EVENT_LEN} characters"
                )));
            }
            let data = envelope.data.map_or("null", |d| d.get()).to_owned();
            Ok(ClientMessage::ClientEvent {
                event: event.to_owned(),
                channel,
                data,
            })
        }
        event => Err(Malformed(format!("unsupported event {event:?}"))),
    }
}

/// What kind of channel a name is, by its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Anyone may subscribe.
    Public,
    /// `private-`: a signature from the app's auth endpoint.
    Private,
    /// `private-encrypted-`: as private; payloads are end-to-end encrypted by the
    /// publisher and pass through untouched.
    Encrypted,
    /// `presence-`: a signature over the member's `channel_data`; members are listed.
    Presence,
    /// `#server-to-user-{id}`: the user's own, which a connection signed in as that user
    /// (`pusher:signin`) subscribes to; only the app's backend sends there (`sendToUser`).
    User,
}

/// The prefix of a user's own channel.
pub const USER_CHANNEL: &str = "#server-to-user-";

/// A user channel as Herald names it: `#` is no character of Herald's channel names, and
/// `!` is none of Pusher's, so no Pusher client can name it otherwise.
const USER_CHANNEL_INSIDE: &str = "!server-to-user-";

/// The channel whose members say a user is online (the part after the app's namespace):
/// its one member is held by each connection signed in as the user, so it has a member
/// exactly while the user is signed in somewhere (Pusher's watchlist online status). No
/// Pusher client can name it (`!`).
pub const ONLINE_CHANNEL_INSIDE: &str = "!online-";

/// The count of a channel's subscribers (`!subs-{inside name}`, the part after the app's
/// namespace): each subscription holds a member of its own, so the count of members is
/// the count of subscriptions on every node (`pusher:subscription_count`).
pub const SUBSCRIPTIONS_CHANNEL_INSIDE: &str = "!subs-";

/// Whether Herald's channel `inside` (the part after the namespace) is one of the
/// server's own that no Pusher client names (a user's online channel), which the HTTP
/// API does not list.
pub fn hidden(inside: &str) -> bool {
    inside.starts_with('!') && !inside.starts_with(USER_CHANNEL_INSIDE)
}

/// The user whose channel `name` is (`#server-to-user-{id}`), if it is one.
pub fn user_of_channel(name: &str) -> Option<&str> {
    name.strip_prefix(USER_CHANNEL)
}

/// Pusher channel `name`, checked, as Herald names it (the part after the app's namespace):
/// itself, but for a user channel.
pub fn inside_name(name: &str) -> Result<std::borrow::Cow<'_, str>, Malformed> {
    match user_of_channel(name) {
        Some(user) => {
            check_channel(user)?;
            Ok(format!("{USER_CHANNEL_INSIDE}{user}").into())
        }
        None => check_channel(name).map(|()| name.into()),
    }
}

/// The Pusher name of a channel Herald names `inside` (the part after the namespace).
pub fn outside_name(inside: &str) -> std::borrow::Cow<'_, str> {
    match inside.strip_prefix(USER_CHANNEL_INSIDE) {
        Some(user) => format!("{USER_CHANNEL}{user}").into(),
        None => inside.into(),
    }
}

impl Kind {
    /// The kind of `channel`.
    pub fn of(channel: &str) -> Kind {
        if channel.starts_with(USER_CHANNEL) {
            Kind::User
        } else if channel.starts_with("private-encrypted-") {
            Kind::Encrypted
        } else if channel.starts_with("private-") {
            Kind::Private
        } else if channel.starts_with("presence-") {
            Kind::Presence
        } else {
            Kind::Public
        }
    }

    /// Whether subscribing needs a signature.
    pub fn signed(self) -> bool {
        matches!(self, Kind::Private | Kind::Encrypted | Kind::Presence)
    }
}

/// Whether `channel` is a cache channel (`cache-`, `private-cache-`,
/// `private-encrypted-cache-`, `presence-cache-`): a subscriber is sent its last event at
/// once, or `pusher:cache_miss`.
pub fn cached(channel: &str) -> bool {
    [
        "cache-",
        "private-cache-",
        "private-encrypted-cache-",
        "presence-cache-",
    ]
    .iter()
    .any(|p| channel.starts_with(p))
}

/// `pusher:cache_miss` on a cache channel with no event yet.
pub fn cache_miss(channel: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Miss<'a> {
        event: &'a str,
        channel: &'a str,
    }
    serde_json::to_vec(&Miss {
        event: "pusher:cache_miss",
        channel,
    })
    .expect("frames serialise")
}

/// Checks a Pusher channel name: 1 to 164 of `A-Z a-z 0-9 _ - = @ , .` (Pusher also allows
/// `;`, which Herald's channel names do not: refused, saying so).
pub fn check_channel(name: &str) -> Result<(), Malformed> {
    if name.is_empty() || name.len() > MAX_CHANNEL_LEN {
        return Err(Malformed(format!(
            "channel names are 1 to {MAX_CHANNEL_LEN} characters"
        )));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-=@,.".contains(*c)))
    {
        None => Ok(()),
        Some(';') => Err(Malformed(
            "channel names with ';' are not supported by this server".into(),
        )),
        Some(c) => Err(Malformed(format!(
            "channel names hold only A-Z a-z 0-9 _ - = @ , . ({c:?} is not allowed)"
        ))),
    }
}

fn frame(event: &str, channel: Option<&str>, data: &impl Serialize) -> Vec<u8> {
    #[derive(Serialize)]
    struct Frame<'a, D> {
        event: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        channel: Option<&'a str>,
        data: D,
    }
    serde_json::to_vec(&Frame {
        event,
        channel,
        data,
    })
    .expect("frames serialise")
}

/// Data as Pusher sends its own events' data: a JSON string holding JSON.
fn stringified(data: &impl Serialize) -> String {
    serde_json::to_string(data).expect("data serialises")
}

/// `pusher:connection_established`.
pub fn connection_established(socket_id: &str, activity_timeout: u64) -> Vec<u8> {
    #[derive(Serialize)]
    struct Established<'a> {
        socket_id: &'a str,
        activity_timeout: u64,
    }
    let data = stringified(&Established {
        socket_id,
        activity_timeout,
    });
    frame("pusher:connection_established", None, &data)
}

/// `pusher:error`, with a code (`None` for errors Pusher sends without one).
pub fn error(code: Option<u16>, message: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Error<'a> {
        code: Option<u16>,
        message: &'a str,
    }
    frame("pusher:error", None, &Error { code, message })
}

/// `pusher:subscription_error` on a channel (a refused subscription), as `pusher-js` hands
/// it to the channel's `pusher:subscription_error` handlers.
pub fn subscription_error(channel: &str, status: u16, message: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Error<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        error: &'a str,
        status: u16,
    }
    let kind = if status == 401 || status == 403 {
        "AuthError"
    } else {
        "SubscriptionError"
    };
    frame(
        "pusher:subscription_error",
        Some(channel),
        &Error {
            kind,
            error: message,
            status,
        },
    )
}

/// `pusher:pong`.
pub fn pong() -> Vec<u8> {
    frame("pusher:pong", None, &"{}")
}

/// `herald:page`: the proof a connection of a page that opted in to resuming is given,
/// which the page's next connection sends back (`herald:resume`) to take its place.
pub fn page(proof: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Page<'a> {
        proof: &'a str,
    }
    frame("herald:page", None, &stringified(&Page { proof }))
}

/// `pusher:ping`.
pub fn ping() -> Vec<u8> {
    frame("pusher:ping", None, &"{}")
}

/// A presence channel's members as `subscription_succeeded` lists them.
#[derive(Debug, Default, Serialize)]
pub struct Members<'a> {
    /// User ids, each as its auth endpoint signed it (a string, or a number).
    pub ids: Vec<&'a RawValue>,
    /// Each user's `user_info` (raw JSON; `null` when none).
    pub hash: std::collections::BTreeMap<&'a str, &'a RawValue>,
    /// How many users.
    pub count: usize,
}

/// `pusher_internal:subscription_succeeded`, with the members of a presence channel.
pub fn subscription_succeeded(channel: &str, members: Option<&Members<'_>>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Presence<'a, 'm> {
        presence: &'a Members<'m>,
    }
    let data = match members {
        Some(presence) => stringified(&Presence { presence }),
        None => "{}".to_owned(),
    };
    frame(
        "pusher_internal:subscription_succeeded",
        Some(channel),
        &data,
    )
}

/// `pusher_internal:member_added`.
pub fn member_added(channel: &str, user_id: &RawValue, user_info: &RawValue) -> Vec<u8> {
    #[derive(Serialize)]
    struct Added<'a> {
        user_id: &'a RawValue,
        user_info: &'a RawValue,
    }
    let data = stringified(&Added { user_id, user_info });
    frame("pusher_internal:member_added", Some(channel), &data)
}

/// `pusher_internal:member_removed`.
pub fn member_removed(channel: &str, user_id: &RawValue) -> Vec<u8> {
    #[derive(Serialize)]
    struct Removed<'a> {
        user_id: &'a RawValue,
    }
    let data = stringified(&Removed { user_id });
    frame("pusher_internal:member_removed", Some(channel), &data)
}

/// `pusher_internal:watchlist_events`: which users of a watchlist came online, and which
/// went offline (an empty list is left out).
pub fn watchlist_events(online: &[&str], offline: &[&str]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Change<'a> {
        name: &'a str,
        user_ids: &'a [&'a str],
    }
    #[derive(Serialize)]
    struct Events<'a> {
        events: Vec<Change<'a>>,
    }
    let events = [("online", online), ("offline", offline)]
        .into_iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(name, user_ids)| Change { name, user_ids })
        .collect();
    frame(
        "pusher_internal:watchlist_events",
        None,
        &stringified(&Events { events }),
    )
}

/// `pusher_internal:subscription_count`: how many subscriptions `channel` has.
pub fn subscription_count(channel: &str, count: u64) -> Vec<u8> {
    #[derive(Serialize)]
    struct Count {
        subscription_count: u64,
    }
    let data = stringified(&Count {
        subscription_count: count,
    });
    frame("pusher_internal:subscription_count", Some(channel), &data)
}

/// `pusher:signin_success`, with the signed-in user's data (JSON text).
pub fn signin_success(user_data: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Success<'a> {
        user_data: &'a str,
    }
    frame(
        "pusher:signin_success",
        None,
        &stringified(&Success { user_data }),
    )
}

/// A publication's payload as a Pusher event (see the module's "one channel model").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event frame for the channel.
    pub frame: Vec<u8>,
    /// The connection (socket id) not to send it to.
    pub except: Option<Box<str>>,
}

#[derive(Deserialize)]
struct Stored<'a> {
    event: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
    #[serde(default, borrow)]
    user_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    socket_id: Option<std::borrow::Cow<'a, str>>,
}

/// The event a publication's payload (`data`, one JSON value) is on Pusher channel
/// `channel`.
pub fn event(channel: &str, data: &[u8]) -> Event {
    #[derive(Serialize)]
    struct Frame<'a> {
        event: &'a str,
        channel: &'a str,
        data: &'a RawValue,
        #[serde(skip_serializing_if = "Option::is_none")]
        user_id: Option<&'a str>,
    }
    let stored = (data.first() == Some(&b'{'))
        .then(|| serde_json::from_slice::<Stored>(data).ok())
        .flatten();
    let plain = || -> Option<&RawValue> { serde_json::from_slice(data).ok() };
    let null: &RawValue = serde_json::from_str("null").expect("null is JSON");
    match stored {
        Some(s) => Event {
            frame: serde_json::to_vec(&Frame {
                event: &s.event,
                channel,
                data: s.data.unwrap_or(null),
                user_id: s.user_id.as_deref(),
            })
            .expect("frames serialise"),
            except: s.socket_id.map(|s| s.into()),
        },
        None => Event {
            frame: serde_json::to_vec(&Frame {
                event: PLAIN_EVENT,
                channel,
                data: plain().unwrap_or(null),
                user_id: None,
            })
            .expect("frames serialise"),
            except: None,
        },
    }
}

/// The payload a Pusher event is stored as: `{"event","data"[,"user_id"][,"socket_id"]}`.
/// `data` is JSON text (checked by the caller).
pub fn stored(
    event: &str,
    data: &RawValue,
    user_id: Option<&str>,
    socket_id: Option<&str>,
) -> Vec<u8> {
    #[derive(Serialize)]
    struct Stored<'a> {
        event: &'a str,
        data: &'a RawValue,
        #[serde(skip_serializing_if = "Option::is_none")]
        user_id: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        socket_id: Option<&'a str>,
    }
    serde_json::to_vec(&Stored {
        event,
        data,
        user_id,
        socket_id,
    })
    .expect("payloads serialise")
}

#[cfg(test)]
#[path = "pusher_tests.rs"]
mod tests;

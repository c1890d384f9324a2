//! Error codes (in replies and HTTP error bodies) and disconnect codes (WebSocket close
//! codes, and `disconnect` pushes on the other transports).
//!
//! Disconnect codes fall in ranges that tell a client what to do without knowing each code:
//!
//! | range     | meaning                                              |
//! |-----------|------------------------------------------------------|
//! | 3000–3499 | server-side reason: reconnect (with backoff) and resume |
//! | 3500–3999 | server-side reason: do not reconnect                  |
//! | 4000–4499 | application-defined: reconnect                        |
//! | 4500–4999 | application-defined: do not reconnect                 |
//!
//! WebSocket's own codes (1000–1015) keep their RFC 6455 meaning; of those a client should
//! reconnect after 1001 (going away), 1006 (abnormal) and 1011–1014, and not after
//! 1002, 1003, 1007, 1008 and 1009, which say the client itself is at fault.

use serde::Serialize;

macro_rules! codes {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:expr, $text:expr;)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum $name { $($(#[$vmeta])* $variant = $value,)* }

        impl $name {
            /// Every code, in numeric order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The numeric value sent on the wire.
            pub fn code(self) -> u16 { self as u16 }

            /// A short fixed description, used as the default message.
            pub fn text(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            /// The code with this numeric value, if there is one.
            pub fn from_code(code: u16) -> Option<Self> {
                match code { $($value => Some($name::$variant),)* _ => None }
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_u16(self.code())
            }
        }
    };
}

codes! {
    /// Why one command failed. The connection stays open.
    ErrorCode {
        /// The server failed; retrying later may work.
        Internal = 100, "internal server error";
        /// A token is missing, malformed or invalid.
        Unauthorized = 101, "unauthorized";
        /// The namespace's rules do not allow this command on this channel.
        PermissionDenied = 103, "permission denied";
        /// The command's method is not one the server knows.
        MethodNotFound = 104, "method not found";
        /// The connection is already subscribed to the channel.
        AlreadySubscribed = 105, "already subscribed";
        /// A per-connection limit (subscriptions, …) would be exceeded.
        LimitExceeded = 106, "limit exceeded";
        /// The command is malformed (missing or invalid fields).
        BadRequest = 107, "bad request";
        /// The feature is disabled or not available on this server.
        NotAvailable = 108, "not available";
        /// A token has expired: get a new one and send it again (`refresh`, or a new
        /// request). Also the code of an `unsubscribe` push that ends a subscription whose
        /// subscription token expired.
        TokenExpired = 109, "token expired";
        /// Too many commands in too short a time.
        TooManyRequests = 111, "too many requests";
        /// History no longer covers the requested position (or its epoch changed).
        UnrecoverablePosition = 112, "unrecoverable position";
        /// The payload is larger than the namespace allows.
        MessageTooLarge = 113, "message too large";
        /// The channel name is not valid.
        InvalidChannel = 114, "invalid channel name";
        /// The connection is not subscribed to the channel.
        NotSubscribed = 115, "not subscribed";
        /// A `connect` command is required first, or was sent twice.
        BadConnectState = 116, "bad connection state";
        /// The server is shutting down.
        ShuttingDown = 117, "server is shutting down";
        /// The application's backend, which a hook asks, did not answer in time, answered
        /// something that is not a hook answer, or is failing; retry later.
        BackendUnavailable = 118, "backend unavailable";
        /// The page's origin is not in the server's `allowed_origins`: reconnecting from it
        /// cannot help (HTTP 403; a client stops as on close code 3502).
        OriginNotAllowed = 119, "origin not allowed";
        /// The code of an `unsubscribe` push that ends a subscription because the server's
        /// operator (or the application's backend, through the API) ended it: do not
        /// subscribe again by yourself.
        Unsubscribed = 120, "unsubscribed by the server";
        /// The node cannot reach its broker (Redis, or its own store) now. A publication
        /// refused with it was not stored (nothing can come twice); anything else (a
        /// subscription, history) may work if tried again, on another node if you can.
        BrokerUnavailable = 121, "broker unavailable";
        /// The publication was sent to the broker, which did not confirm it in time (or
        /// not the replicas `redis.replicas_ack` asks for): it may or may not be stored. A
        /// retry may store it twice.
        OutcomeUnknown = 122, "outcome unknown";
    }
}

codes! {
    /// Why the server closed a connection.
    DisconnectCode {
        /// The server is shutting down or restarting; reconnect to another node or later.
        Shutdown = 3001, "shutdown";
        /// The connection missed publications it cannot be sent in order; reconnect and resume.
        InsufficientState = 3002, "insufficient state";
        /// The client did not read fast enough and its queue filled; reconnect and resume.
        Slow = 3003, "slow consumer";
        /// Writing to the connection failed.
        WriteError = 3004, "write error";
        /// Nothing was received within the idle timeout.
        Stale = 3005, "no ping";
        /// An unexpected server error.
        ServerError = 3006, "internal server error";
        /// The server asks the client to reconnect (for example after a configuration change).
        ForceReconnect = 3007, "force reconnect";
        /// The application's backend, which a hook asks, did not answer; reconnect later.
        BackendUnavailable = 3008, "backend unavailable";
        /// This node lost its way to the broker (Redis) that its channels live in; reconnect
        /// (to another node) and resume.
        BrokerUnreachable = 3009, "broker unreachable";
        /// The token is invalid; reconnecting with the same one will fail again.
        InvalidToken = 3500, "invalid token";
        /// The client sent something the server cannot parse.
        BadRequest = 3501, "bad request";
        /// The server refuses this client (origin, ban, disabled transport).
        Forbidden = 3502, "forbidden";
        /// The client sent a message larger than the limit.
        MessageTooLarge = 3503, "message too large";
        /// The token expired and was not refreshed.
        Expired = 3504, "token expired";
        /// Too many connections (per server or per user).
        ConnectionLimit = 3505, "connection limit";
    }
}

impl From<ErrorCode> for u16 {
    fn from(code: ErrorCode) -> u16 {
        code.code()
    }
}

/// First and last error code an application's backend may answer a hook with for its own
/// reasons; a client receives it as it is.
pub const APPLICATION_ERROR_CODES: std::ops::RangeInclusive<u16> = 1000..=1999;

/// Whether a command refused with this error code may succeed if tried again later (the
/// server failed, a limit or rate, shutting down, the application's backend or the broker
/// out of reach, an outcome not known); the SDK's `isTemporaryError` says the same.
pub fn temporary(code: u16) -> bool {
    matches!(code, 100 | 106 | 111 | 117 | 118 | 121 | 122)
}

impl DisconnectCode {
    /// Whether a client should reconnect after this code (and resume from its positions).
    pub fn reconnect(self) -> bool {
        reconnect_allowed(self.code())
    }
}

/// Whether a client should reconnect after a close with this numeric code, by the ranges in
/// the module docs. Unknown codes outside the ranges are treated as "reconnect".
pub fn reconnect_allowed(code: u16) -> bool {
    !matches!(code, 1002 | 1003 | 1007 | 1008 | 1009 | 1010 | 3500..=3999 | 4500..=4999)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disconnect_ranges_match_reconnect_advice() {
        for code in DisconnectCode::ALL {
            assert_eq!(code.reconnect(), code.code() < 3500, "{code:?}");
            assert_eq!(DisconnectCode::from_code(code.code()), Some(*code));
        }
        assert!(reconnect_allowed(4000));
        assert!(!reconnect_allowed(4500));
        assert!(reconnect_allowed(1006));
        assert!(!reconnect_allowed(1009));
    }

    #[test]
    fn codes_are_unique() {
        let mut seen: Vec<u16> = ErrorCode::ALL.iter().map(|c| c.code()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), ErrorCode::ALL.len());
    }
}

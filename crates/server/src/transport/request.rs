//! What HTTP transports read from a request: channels, cursor, callback, timeout.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use axum::{http::HeaderMap, Extension};
use herald_protocol::{ChannelName, Cursor, ErrorCode, Since};

use crate::{
    error::Failure,
    limits::{AddressGuard, Peer},
    node::Node,
    session::Session,
    token::ChannelGrant,
};

/// Whether a new connection or poll may start: the origin is allowed, the server is not
/// shutting down, it holds fewer than `max_connections`, and the client's address is within
/// its limits (see [`crate::limits`]). Every transport asks this first, and keeps the guard
/// while the connection lives.
pub fn admit(
    node: &Node,
    headers: &HeaderMap,
    peer: Option<Extension<Peer>>,
) -> Result<Option<AddressGuard>, Failure> {
    may_continue(node, headers)?;
    let limit = node.settings.config.max_connections;
    if limit > 0 && node.connection_count() >= limit {
        let ip = peer
            .as_ref()
            .map(|Extension(Peer(p))| node.limits.client_address(p.ip(), headers));
        node.limits
            .refusals
            .count(crate::limits::Limit::MaxConnections, ip, limit);
        return Err(Failure::new(
            ErrorCode::LimitExceeded,
            format!("the server holds its maximum of {limit} connections; retry later"),
        ));
    }
    // Requests that did not come through the accept loop (none in `serve`) have no peer.
    peer.map(|Extension(Peer(peer))| {
        let ip = node.limits.client_address(peer.ip(), headers);
        node.limits.connection(ip)
    })
    .transpose()
}

/// Whether a request may go on with a session it already has (a parked long-poll's): the
/// origin is allowed and the server is not shutting down. The session holds its
/// connection's counts already.
pub fn may_continue(node: &Node, headers: &HeaderMap) -> Result<(), Failure> {
    crate::policy::origin::check(&node.settings, headers)?;
    if node.shutdown.is_cancelled() {
        return Err(Failure::new(
            ErrorCode::ShuttingDown,
            "server is shutting down",
        ));
    }
    Ok(())
}

/// The channels an HTTP transport opens, and where each one resumes.
#[derive(Debug, Default)]
pub struct OpenRequest {
    /// Channels with their resume positions (`None`: start now).
    pub channels: Vec<(ChannelName, Option<Since>)>,
    /// `callback=` (forever frame).
    pub callback: Option<String>,
    /// `timeout=` (long-poll), seconds or a duration such as `10s`.
    pub timeout: Option<Duration>,
    /// The connection token, from `Authorization: Bearer` or `token=`.
    pub token: Option<String>,
    /// Subscription tokens, `sub_token=` (repeatable; each names its channel).
    pub sub_tokens: Vec<String>,
    /// `client=`: the client id of this client's first connection or poll, so that
    /// presence sees the same member (see [`Session::continues`]).
    pub client: Option<String>,
    /// `session_key=` (long-poll and poll): the key of the session the previous answer
    /// parked, or empty to ask for one (see [`super::poll::Parked`]).
    pub session_key: Option<String>,
    /// `ping=` (streams): how often the client wants a keepalive, so that it can take a
    /// stream that stays silent longer for dead (see [`OpenRequest::ping_every`]).
    pub ping: Option<Duration>,
    /// `delta=fossil`: the channels' live publications as deltas (see
    /// [`herald_protocol::delta`]).
    pub delta: bool,
    /// `protocol=protobuf`: Herald's Protobuf codec, which only a transport that carries
    /// bytes as they are takes (see [`OpenRequest::text_only`]).
    pub protobuf: bool,
    /// `conflate=true`: publications a later one of the same conflation key replaced
    /// while they waited are skipped (see [`herald_protocol::Push::Conflated`]).
    pub conflate: bool,
}

fn bad(message: impl Into<String>) -> Failure {
    Failure::new(ErrorCode::BadRequest, message)
}

impl OpenRequest {
    /// How its channels take their live publications.
    pub fn takes(&self) -> crate::session::Takes {
        crate::session::Takes {
            deltas: self.delta,
            conflation: self.conflate,
        }
    }

    /// Refuses `protocol=protobuf` on a transport that carries text only (SSE events,
    /// script tags, JSON bodies): Protobuf's messages are bytes.
    pub fn text_only(&self) -> Result<(), Failure> {
        if self.protobuf {
            return Err(bad(
                "the Protobuf codec's messages are bytes, which this transport (text only) \
                 cannot carry: use /connection/websocket with the herald.protobuf subprotocol, \
                 or /connection/stream, or protocol=json here",
            ));
        }
        Ok(())
    }

    /// Reads `channel=` (repeatable) and `cursor=` from the query; a `Last-Event-ID`
    /// header (EventSource's own reconnect) takes the place of `cursor=`. Channels named
    /// only in the cursor are opened too, so a cursor alone resumes a whole connection.
    pub fn parse(query: Option<&str>, headers: &HeaderMap) -> Result<Self, Failure> {
        let mut names = Vec::new();
        let mut cursor = None;
        let mut request = Self::default();
        for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*key {
                "channel" => names.push(ChannelName::new(&value).map_err(|e| {
                    Failure::new(ErrorCode::InvalidChannel, format!("channel {value:?}: {e}"))
                })?),
                "cursor" => cursor = Some(value.into_owned()),
                "callback" => request.callback = Some(value.into_owned()),
                "timeout" => request.timeout = Some(parse_timeout(&value)?),
                "token" => request.token = Some(value.into_owned()),
                "sub_token" => request.sub_tokens.push(value.into_owned()),
                "client" => request.client = Some(value.into_owned()),
                "session_key" => request.session_key = Some(value.into_owned()),
                "ping" => request.ping = Some(parse_timeout(&value)?),
                "delta" if !value.is_empty() => {
                    request.delta = herald_protocol::delta::asked(&value).map_err(bad)?;
                }
                "delta" => return Err(bad("delta= needs a format: \"fossil\"")),
                "conflate" => {
                    request.conflate = match &*value {
                        "true" | "1" => true,
                        "false" | "0" | "" => false,
                        _ => return Err(bad("conflate= is true or false")),
                    }
                }
                "protocol" if value == "json" => {}
                "protocol" if value == "protobuf" => request.protobuf = true,
                "protocol" => {
                    return Err(bad(format!(
                        "unknown protocol {value:?}; expected \"json\" or \"protobuf\""
                    )))
                }
                // Cache busters and the like.
                "_" | "t" => {}
                other => return Err(bad(format!("unknown query parameter {other:?}"))),
            }
        }
        if let Some(id) = headers.get("last-event-id") {
            cursor = Some(
                id.to_str()
                    .map_err(|_| bad("Last-Event-ID is not ASCII"))?
                    .to_string(),
            );
        }
        if let Some(bearer) = bearer(headers)? {
            request.token = Some(bearer);
        }
        let cursor =
            Cursor::parse(cursor.as_deref().unwrap_or_default()).map_err(|e| bad(e.to_string()))?;
        // Linear in the request's size: a long query must not cost its square in
        // comparisons before any limit applies.
        let positions: HashMap<&ChannelName, &Since> =
            cursor.entries.iter().map(|(c, s)| (c, s)).collect();
        let mut seen: HashSet<ChannelName> = HashSet::with_capacity(names.len());
        for name in names {
            if seen.insert(name.clone()) {
                let since = positions.get(&name).map(|s| (*s).clone());
                request.channels.push((name, since));
            }
        }
        for (name, since) in &cursor.entries {
            if seen.insert(name.clone()) {
                request.channels.push((name.clone(), Some(since.clone())));
            }
        }
        Ok(request)
    }

    /// Says who the request's client is ([`authenticate`] with its token and subscription
    /// tokens), and which earlier client it continues (`client=`, for presence).
    pub async fn authenticate(&self, node: &Node, session: Session) -> Result<Session, Failure> {
        let mut session =
            authenticate(node, session, self.token.as_deref(), &self.sub_tokens).await?;
        if let Some(client) = self.client.as_deref() {
            session.continues(client)?;
        }
        Ok(session)
    }

    /// How often a stream sends its keepalive: as the client asked (`ping=`), but never more
    /// often than every 250 ms nor less often than `configured` (`client.ping_interval`).
    pub fn ping_every(&self, configured: Duration) -> Duration {
        self.ping
            .map_or(configured, |asked| asked.max(MIN_PING).min(configured))
    }

    /// Polling requests carry their whole subscription, so one without channels asks for
    /// nothing. (A stream may open empty: its channels then come through `/connection/send`.)
    pub fn require_channels(self) -> Result<Self, Failure> {
        if self.channels.is_empty() {
            return Err(bad(
                "name at least one channel (channel=NAME) or give a cursor",
            ));
        }
        Ok(self)
    }
}

/// The token of `Authorization: Bearer TOKEN`, if the request has one.
pub fn bearer(headers: &HeaderMap) -> Result<Option<String>, Failure> {
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| Failure::new(ErrorCode::Unauthorized, "Authorization is not ASCII"))?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            Ok(Some(token.trim().to_string()))
        }
        _ => Err(Failure::new(
            ErrorCode::Unauthorized,
            "Authorization must be `Bearer TOKEN`",
        )),
    }
}

/// Says who a request's client is: its connection token (if any) or the connect hook
/// gives the session's identity (see [`Session::identify`]), each subscription token a
/// grant. Refused tokens answer 401 with error 101 (invalid) or 109 (expired) before
/// anything else happens, a hook's refusal with its code. Every request is checked afresh:
/// a poll carries its token (or cookies) each time.
pub async fn authenticate(
    node: &Node,
    mut session: Session,
    token: Option<&str>,
    sub_tokens: &[String],
) -> Result<Session, Failure> {
    let tokens = node.settings.tokens.clone();
    session.identify(token).await.map_err(|d| d.failure())?;
    let limit = node.settings.config.client.max_subscriptions;
    if sub_tokens.len() > limit {
        return Err(bad(format!("more than {limit} subscription tokens")));
    }
    for token in sub_tokens {
        let grant: ChannelGrant = tokens
            .channel_named_by(token, session.user())
            .await
            .map_err(|e| e.failure())?;
        session.grant(grant);
    }
    Ok(session)
}

impl OpenRequest {
    /// Adds the channels the session's token subscribes it to, where the request does not
    /// name them already.
    pub fn with_token_channels(mut self, session: &Session) -> Self {
        if let Some(identity) = session.identity() {
            for channel in &identity.channels {
                if !self.channels.iter().any(|(c, _)| c == channel) {
                    self.channels.push((channel.clone(), None));
                }
            }
        }
        self
    }
}

/// The shortest keepalive period a stream's client may ask for.
const MIN_PING: Duration = Duration::from_millis(250);

pub(crate) fn parse_timeout(value: &str) -> Result<Duration, Failure> {
    if let Ok(secs) = value.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime_serde::re::humantime::parse_duration(value)
        .map_err(|e| bad(format!("timeout {value:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping(query: &str) -> Result<Duration, Failure> {
        let request = OpenRequest::parse(Some(query), &HeaderMap::new())?;
        Ok(request.ping_every(Duration::from_secs(25)))
    }

    #[test]
    fn a_stream_gets_keepalives_as_asked_within_bounds() {
        assert_eq!(ping("ping=9000ms").unwrap(), Duration::from_secs(9));
        assert_eq!(ping("ping=10").unwrap(), Duration::from_secs(10));
        // Never more often than every 250 ms, never less often than configured.
        assert_eq!(ping("ping=1ms").unwrap(), MIN_PING);
        assert_eq!(ping("ping=1h").unwrap(), Duration::from_secs(25));
        assert_eq!(ping("channel=a").unwrap(), Duration::from_secs(25));
        assert!(ping("ping=soon").is_err());
    }
}

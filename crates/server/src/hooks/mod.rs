//! Asking the application's backend: hooks over HTTP, JSON both ways.
//!
//! Herald posts a request to the hook's address and reads `{"result": …}` or
//! `{"error": {"code": N, "message": "…"}}` (HTTP 200 either way; anything else is the
//! backend failing, and the client gets 118). What each hook does:
//!
//! - **connect**: who a client without a token is ([`ConnectResult`], the same grants a
//!   token carries), from its transport, address, and the headers and cookies
//!   `hooks.headers` / `hooks.cookies` allow. One implementation of the access seam of
//!   [`crate::policy`], beside tokens: a token is checked first, the hook asked without one.
//! - **subscribe**: allows (a grant for the channel) or refuses a subscription, and may
//!   give the channel's current state, sent in the subscribe result.
//! - **publish**: allows, rewrites or refuses a client's publication before it is published.
//! - **refresh**: a new expiry for a connection the connect hook gave one.
//! - **rpc**: a client's call, answered on its connection.
//!
//! Hooks see these request and answer structs, never a session. Each hook has its own
//! bounded [`caller::Caller`]; they share one pool of kept-alive connections.

pub mod caller;
pub mod events;
pub mod lead;
pub mod webhook;

use std::{collections::BTreeMap, net::IpAddr};

use axum::http::HeaderMap;
use herald_protocol::{codes::APPLICATION_ERROR_CODES, ChannelName, DisconnectCode, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub use caller::{parse_answer, Caller, HookError};

use crate::{
    config::HooksConfig,
    error::{Disconnect, Failure},
    token::Identity,
};

pub use crate::transports::Transport;

/// What the connect hook is told about a client's request, beyond its address (which the
/// session holds).
#[derive(Debug, Clone, Default)]
pub struct RequestFacts {
    /// Allowed headers (lower-case names).
    pub headers: BTreeMap<String, String>,
    /// Allowed cookies.
    pub cookies: BTreeMap<String, String>,
    /// The connection's own parameters, for a protocol that has them (a Phoenix socket's
    /// query, `vsn` and `token` aside).
    pub params: BTreeMap<String, String>,
}

/// Every configured hook.
#[derive(Debug, Default)]
pub struct Hooks {
    /// The connect hook.
    pub connect: Option<Caller>,
    /// The subscribe hook.
    pub subscribe: Option<Caller>,
    /// The publish hook.
    pub publish: Option<Caller>,
    /// The refresh hook.
    pub refresh: Option<Caller>,
    /// The rpc hook.
    pub rpc: Option<Caller>,
    /// The kept-alive connections every hook's requests share.
    client: reqwest::Client,
    headers: Vec<axum::http::HeaderName>,
    cookies: Vec<String>,
}

impl Hooks {
    /// The hooks configured, each once.
    pub fn callers(&self) -> impl Iterator<Item = &Caller> {
        [
            &self.connect,
            &self.subscribe,
            &self.publish,
            &self.refresh,
            &self.rpc,
        ]
        .into_iter()
        .flatten()
    }

    /// The hooks `[hooks]` configures (addresses checked by [`HooksConfig`]).
    pub fn new(c: &HooksConfig) -> Self {
        // One pool for every hook: they usually share a backend. Kept-alive connections
        // spare a TCP (and TLS) handshake per request.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(c.max_in_flight)
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .tcp_nodelay(true)
            .connect_timeout(c.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client with these settings builds");
        let caller = |name, url: &Option<String>| {
            url.as_deref()
                .map(|u| Caller::new(name, u, client.clone(), c))
        };
        Self {
            connect: caller("connect", &c.connect_url),
            subscribe: caller("subscribe", &c.subscribe_url),
            publish: caller("publish", &c.publish_url),
            refresh: caller("refresh", &c.refresh_url),
            rpc: caller("rpc", &c.rpc_url),
            headers: c
                .headers
                .iter()
                .filter_map(|h| axum::http::HeaderName::from_bytes(h.as_bytes()).ok())
                .collect(),
            cookies: c.cookies.clone(),
            client,
        }
    }

    /// A caller of the events hook, for the node's [`events::EventLog`]; none without one.
    pub fn events(&self, c: &HooksConfig) -> Option<Caller> {
        let url = c.events_url.as_deref()?;
        Some(Caller::new("events", url, self.client.clone(), c))
    }

    /// What the connect hook may see of a request: none without a connect hook.
    pub fn facts(&self, headers: &HeaderMap) -> Option<Box<RequestFacts>> {
        self.connect.as_ref()?;
        let mut facts = RequestFacts::default();
        for name in &self.headers {
            if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                facts
                    .headers
                    .insert(name.as_str().to_string(), v.to_string());
            }
        }
        if !self.cookies.is_empty() && !cross_site(headers) {
            let all = headers
                .get_all(axum::http::header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok());
            for pair in all.flat_map(|v| v.split(';')) {
                if let Some((name, value)) = pair.trim().split_once('=') {
                    if self.cookies.iter().any(|c| c == name) {
                        facts.cookies.insert(name.to_string(), value.to_string());
                    }
                }
            }
        }
        Some(Box::new(facts))
    }
}

/// Whether a browser made this request for a page of another site, or of another origin
/// that does not say which (an `<img>` or `<iframe>` sends no `Origin`): then its cookies
/// are not the client's say-so, and the connect hook is not shown them. Browsers tell by
/// `Sec-Fetch-Site`; a request without it (a script, an old browser) is judged by the
/// origin check alone, as before.
fn cross_site(headers: &HeaderMap) -> bool {
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    let has_origin = headers.contains_key(axum::http::header::ORIGIN);
    match site.as_deref() {
        None | Some("same-origin") | Some("none") => false,
        // Another origin of the same site: only with an `Origin`, which the origin check
        // has admitted (it is this server's or one of `allowed_origins`).
        Some("same-site") => !has_origin,
        // `cross-site`, and anything unknown.
        Some(_) => true,
    }
}

/// Who is asking, as every hook request tells it.
#[derive(Debug, Serialize)]
pub struct Client<'a> {
    /// The connection's id (`client` in its connect result).
    pub client: &'a str,
    /// Its transport.
    pub transport: Transport,
    /// Its user; absent while anonymous.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
}

/// The connect hook's request.
#[derive(Debug, Serialize)]
pub struct ConnectRequest<'a> {
    /// The connection.
    #[serde(flatten)]
    pub client: Client<'a>,
    /// The client's address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// The allowed headers the request carried.
    pub headers: &'a BTreeMap<String, String>,
    /// The allowed cookies the request carried.
    pub cookies: &'a BTreeMap<String, String>,
    /// The client's token, when no token key is configured (the backend checks it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<&'a str>,
    /// The connection's own parameters (a Phoenix socket's `params`), when it has any.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub params: &'a BTreeMap<String, String>,
}

/// The connect hook's answer: what a connection token would say.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectResult {
    /// The user; absent or empty: the client stays anonymous.
    #[serde(default)]
    pub user: Option<String>,
    /// Public data about the user.
    #[serde(default)]
    pub info: Option<Box<RawValue>>,
    /// Channels subscribed to at once.
    #[serde(default)]
    pub channels: Vec<String>,
    /// Channels (or `*` patterns) the user may subscribe to.
    #[serde(default)]
    pub subscribe: Vec<String>,
    /// Channels (or `*` patterns) the user may publish to.
    #[serde(default)]
    pub publish: Vec<String>,
    /// When the connection needs the refresh hook (Unix seconds); absent: never.
    #[serde(default)]
    pub expires: Option<u64>,
}

impl ConnectResult {
    /// The identity this answer gives, none for an anonymous client.
    pub fn identity(self) -> Result<Option<Identity>, HookError> {
        let user = self.user.filter(|u| !u.is_empty());
        let Some(user) = user else {
            let grants =
                !self.channels.is_empty() || !self.subscribe.is_empty() || !self.publish.is_empty();
            if grants || self.expires.is_some() {
                return Err(HookError::Failed(
                    "the connect answer grants channels or an expiry but names no user".into(),
                ));
            }
            return Ok(None);
        };
        Identity::new(
            user.into(),
            self.info,
            &self.channels,
            self.subscribe,
            self.publish,
            self.expires,
        )
        .map(Some)
        .map_err(|e| HookError::Failed(format!("the connect answer: {e}")))
    }
}

/// The subscribe hook's request.
#[derive(Debug, Serialize)]
pub struct SubscribeRequest<'a> {
    /// The connection.
    #[serde(flatten)]
    pub client: Client<'a>,
    /// The channel.
    pub channel: &'a ChannelName,
    /// What the client sent with its subscription, for a protocol that sends something (a
    /// Phoenix join's payload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<&'a RawValue>,
}

/// The subscribe hook's answer.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeResult {
    /// The channel's current state, sent to the client in the subscribe result.
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
    /// When the grant ends (Unix seconds): the subscription then ends with code 109.
    #[serde(default)]
    pub expires: Option<u64>,
    /// The connection's info in this channel, as a subscription token's `info`: shown as
    /// `channel_info` with its publications and its presence (a Phoenix join's metas).
    #[serde(default)]
    pub info: Option<Box<RawValue>>,
}

/// The publish hook's request.
#[derive(Debug, Serialize)]
pub struct PublishRequest<'a> {
    /// The connection.
    #[serde(flatten)]
    pub client: Client<'a>,
    /// The channel.
    pub channel: &'a ChannelName,
    /// What the client publishes.
    pub data: &'a RawValue,
}

/// The publish and rpc hooks' answer.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataResult {
    /// Publish: what to publish instead of the client's data (absent: the client's).
    /// Rpc: the answer for the client.
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
}

/// The refresh hook's request.
#[derive(Debug, Serialize)]
pub struct RefreshRequest<'a> {
    /// The connection.
    #[serde(flatten)]
    pub client: Client<'a>,
}

/// The refresh hook's answer.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshResult {
    /// The new expiry (Unix seconds); absent: the connection no longer expires.
    #[serde(default)]
    pub expires: Option<u64>,
}

/// The rpc hook's request.
#[derive(Debug, Serialize)]
pub struct RpcRequest<'a> {
    /// The connection.
    #[serde(flatten)]
    pub client: Client<'a>,
    /// The method the client named.
    pub method: &'a str,
    /// The client's data.
    pub data: &'a RawValue,
    /// The channel the call was made on, for a front whose calls are (a Phoenix push of
    /// one of `[phoenix] rpc_events`, on its topic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<&'a str>,
}

impl HookError {
    /// As a command's or request's failure: the backend's own code when it is Herald's or
    /// an application's (1000–1999), else 118.
    pub fn failure(self, hook: &str) -> Failure {
        match self {
            HookError::Refused { code, message } => {
                if APPLICATION_ERROR_CODES.contains(&code) {
                    return Failure::application(code, message);
                }
                match ErrorCode::from_code(code) {
                    Some(code) => Failure::new(code, message),
                    None => {
                        tracing::warn!(
                            hook,
                            "hook answered error code {code}, which is neither Herald's nor an application code (1000-1999): clients get 118"
                        );
                        HookError::Failed(format!("error code {code}")).failure(hook)
                    }
                }
            }
            HookError::Failed(why) => {
                // The cause (an address, an OS error, the backend's own words) is the
                // operator's: it is logged where the call failed, and clients get the
                // generic reason.
                tracing::debug!(hook, "hook failure answered with 118: {why}");
                Failure::new(
                    ErrorCode::BackendUnavailable,
                    "backend unavailable; retry later",
                )
            }
        }
    }

    /// As the end of a connection the connect (or refresh) hook did not admit: 3504 for
    /// 109 (expired), 3500 for 101 (unauthorized), 3502 for any other refusal, and 3008
    /// (reconnect later) when the backend failed.
    pub fn disconnect(self, hook: &str) -> Disconnect {
        let failure = self.failure(hook);
        let code = match (failure.application, failure.code) {
            (None, ErrorCode::TokenExpired) => DisconnectCode::Expired,
            (None, ErrorCode::Unauthorized) => DisconnectCode::InvalidToken,
            (None, ErrorCode::BackendUnavailable) => DisconnectCode::BackendUnavailable,
            _ => DisconnectCode::Forbidden,
        };
        Disconnect::because(code, failure.message)
    }
}

/// A JSON value given by a backend, checked as a client's publication would be and without
/// its raw line breaks (an indented answer), so that it is safe in every framing. Send
/// these bytes, never the value as it came.
pub fn checked_data(raw: &RawValue, hook: &str) -> Result<bytes::Bytes, Failure> {
    herald_protocol::json::payload(raw).map_err(|e| {
        tracing::warn!(
            hook,
            "hook answered a `data` that cannot be sent: {e}; clients get 118"
        );
        HookError::Failed(format!("its `data`: {e}")).failure(hook)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(json: &str) -> ConnectResult {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_connect_answer_without_a_user_is_anonymous_and_grants_nothing() {
        assert!(answer("{}").identity().unwrap().is_none());
        assert!(answer(r#"{"user":""}"#).identity().unwrap().is_none());
        for granting in [
            r#"{"subscribe":["a"]}"#,
            r#"{"channels":["a"]}"#,
            r#"{"expires":1}"#,
        ] {
            assert!(
                matches!(answer(granting).identity(), Err(HookError::Failed(_))),
                "{granting}"
            );
        }
        let alice = answer(r#"{"user":"alice","channels":["bad channel"]}"#).identity();
        assert!(matches!(alice, Err(HookError::Failed(m)) if m.contains("channels")));
    }

    #[test]
    fn refusals_keep_herald_and_application_codes_and_the_rest_is_a_failure() {
        let refused = |code| HookError::Refused {
            code,
            message: "no".into(),
        };
        assert_eq!(refused(103).failure("x").wire_code(), 103);
        assert_eq!(refused(1003).failure("x").wire_code(), 1003);
        assert_eq!(refused(3000).failure("x").wire_code(), 118);
        assert_eq!(
            refused(101).disconnect("x").code,
            DisconnectCode::InvalidToken
        );
        assert_eq!(
            refused(1003).disconnect("x").code,
            DisconnectCode::Forbidden
        );
        assert_eq!(
            HookError::Failed("down".into()).disconnect("x").code,
            DisconnectCode::BackendUnavailable
        );
    }
}

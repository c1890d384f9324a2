//! Taking up a parked long-poll without the router, and without reading the request into
//! an [`OpenRequest`](super::request::OpenRequest): a client that continues its session
//! sends back the cursor of the answer that parked it, and comparing that one string is all
//! it takes to know the request asks from exactly where the session is.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{self, header, Method},
};

use super::{hold_for_at_most, Cors, Key, Parked, Prepared};
use crate::{node::Node, session::Session, transport::request};

/// Takes up parked long-poll sessions on the lean path without the router, whose layers
/// and extractors cost a long-poll about a fifth of its CPU (`docs/benchmarks.md`). Only a
/// long-poll that continues its session exactly (the answer's cursor, the same
/// credentials and client, no channel the session lacks), from a host and an origin the
/// router would let through, is answered here: the same checks and the same code as the
/// router's handler, with the CORS headers the router's layer would add
/// ([`crate::policy::origin::CorsAnswer`]). Anything else (a first request, an
/// unknown key, another cursor, any refusal) goes through the router, which answers as it
/// always does, and finds the session still parked.
#[derive(Debug, Clone)]
pub struct Resumer {
    node: Arc<Node>,
    parked: Parked,
}

impl Resumer {
    /// Takes up sessions parked in `parked`.
    pub fn new(node: Arc<Node>, parked: Parked) -> Self {
        Self { node, parked }
    }

    /// The node it takes them up for.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The held long-poll `request` is, if it takes up its parked session.
    pub fn take_up(&self, request: &http::Request<Body>) -> Option<Box<Prepared>> {
        if request.method() != Method::GET
            || request.uri().path() != "/connection/longpoll"
            || !self.parked.enabled()
        {
            return None;
        }
        let query = Continuing::read(request.uri().query()?)?;
        let key = Key::parse(query.session_key)?;
        let (node, headers) = (&self.node, request.headers());
        // A cursor from the header would take the query's place: the router reads it.
        if headers.contains_key("last-event-id") {
            return None;
        }
        crate::policy::origin::check_host(&node.settings, headers).ok()?;
        request::may_continue(node, headers).ok()?;
        let bearer = request::bearer(headers).ok()?;
        let token = bearer.as_deref().or(query.token);
        let cookie = headers.get(header::COOKIE).map(|v| v.as_bytes());
        let credentials = self.parked.credentials(token, &query.sub_tokens, cookie);
        let resumed =
            self.parked
                .take_exact(key, credentials, query.client, |session, cursor| {
                    query.continues(session, cursor)
                })?;
        let mut prepared = Prepared::resumed(
            (node.clone(), self.parked.clone()),
            resumed,
            true,
            hold_for_at_most(node, query.timeout),
            (key, credentials),
        );
        prepared.cors = Cors::Here(headers.get(header::ORIGIN).cloned());
        Some(Box::new(prepared))
    }
}

/// What a long-poll that may continue its session asks, read without copying: values that
/// would need decoding (other than the cursor and channel names, compared as they decode)
/// send the request to the router.
struct Continuing<'q> {
    session_key: &'q str,
    /// Still form-encoded.
    cursor: &'q str,
    /// `channel=` values, still form-encoded.
    channels: Vec<&'q str>,
    token: Option<&'q str>,
    sub_tokens: Vec<&'q str>,
    client: Option<&'q str>,
    timeout: Option<Duration>,
}

impl<'q> Continuing<'q> {
    fn read(query: &'q str) -> Option<Self> {
        let mut read = Self {
            session_key: "",
            cursor: "",
            channels: Vec::new(),
            token: None,
            sub_tokens: Vec::new(),
            client: None,
            timeout: None,
        };
        // As `OpenRequest::parse` reads them; a plain value has no `%` or `+`.
        let plain = |v: &'q str| (!v.contains(['%', '+'])).then_some(v);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "session_key" => read.session_key = value,
                "cursor" => read.cursor = value,
                "channel" => read.channels.push(value),
                "token" => read.token = Some(plain(value)?),
                "sub_token" => read.sub_tokens.push(plain(value)?),
                "client" => read.client = Some(plain(value)?),
                "timeout" => read.timeout = Some(request::parse_timeout(plain(value)?).ok()?),
                "_" | "t" => {}
                _ => return None,
            }
        }
        Some(read)
    }

    /// Whether this request asks for exactly what `session` has, from where it is: the
    /// cursor of the answer that parked it (which lists every channel the session has a
    /// position in), no channel besides, and no subscription the cursor leaves out.
    fn continues(&self, session: &Session, cursor: &str) -> bool {
        let entries = || cursor.split('|').filter(|e| !e.is_empty());
        let in_cursor = |name: &str| {
            entries().any(|e| e.split(';').next().is_some_and(|n| decodes_to(name, n)))
        };
        decodes_to(self.cursor, cursor)
            && entries().count() == session.subscription_count()
            && self.channels.iter().all(|c| in_cursor(c))
    }
}

/// Whether the form-encoded `raw` decodes to `text`, compared as it decodes.
fn decodes_to(raw: &str, text: &str) -> bool {
    let mut raw = raw.as_bytes().iter();
    let mut text = text.as_bytes().iter();
    loop {
        let decoded = match raw.next() {
            None => return text.next().is_none(),
            Some(b'+') => b' ',
            Some(b'%') => {
                let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
                match (hex(raw.next()), hex(raw.next())) {
                    (Some(hi), Some(lo)) => (hi * 16 + lo) as u8,
                    // Not an escape: the router's reading decides.
                    _ => return false,
                }
            }
            Some(b) => *b,
        };
        if text.next() != Some(&decoded) {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_compare_as_they_decode() {
        assert!(decodes_to("chat%3Alobby%3Bk3x9%3B7", "chat:lobby;k3x9;7"));
        assert!(decodes_to("chat:lobby;k3x9;7", "chat:lobby;k3x9;7"));
        assert!(decodes_to("a+b%7Cc", "a b|c"));
        assert!(decodes_to("", ""));
        assert!(!decodes_to("chat%3Alobby", "chat:lobby;"));
        assert!(!decodes_to("chat%3Alobby%3B", "chat:lobby"));
        assert!(!decodes_to("%3", "\u{3}"));
        assert!(!decodes_to("%zz", "zz"));
        assert!(!decodes_to("a", "b"));
    }

    #[test]
    fn a_query_with_anything_unplain_goes_to_the_router() {
        let read = Continuing::read("channel=news&cursor=news%3Be%3B1&session_key=ab&timeout=20ms")
            .unwrap();
        assert_eq!(read.channels, ["news"]);
        assert_eq!(read.timeout, Some(Duration::from_millis(20)));
        assert!(Continuing::read("session_key=ab&token=a%2Eb").is_none());
        assert!(Continuing::read("session_key=ab&other=1").is_none());
        assert!(Continuing::read("session_key=ab&timeout=soon").is_none());
    }
}

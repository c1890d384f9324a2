//! `/socket/longpoll`: phoenix.js's long-polling fallback, over the same Phoenix speaker
//! as its WebSocket.
//!
//! The first `GET` opens a session and answers `{"status": 410, "token": T}`; `T` (128
//! random bits, the session's only capability) comes back with every request, as the last
//! `token` parameter (a socket's own `token` param, its connection token, comes first, as
//! phoenix.js writes them).
//! A `GET` with it answers the messages waiting, or waits for some up to
//! `http.longpoll_timeout` (then `{"status": 204}`); a `POST` carries the client's messages
//! (one per line) and answers `{"status": 200}` (their replies wait for the next `GET`).
//! Sessions wait between requests in the node's one store of them (shared with Herald's
//! own long-poll, [`crate::transport::poll::Waiting`]). A `GET` is held under the same
//! driver as every transport ([`driver::hold`]): shutdown, the queue, token expiry and the
//! client's messages wake it alike. A `POST`'s messages are commands for the session
//! ([`Command`]): the `GET` that holds it obeys them and answers with their replies; with
//! no `GET` waiting, the `POST` obeys them itself ([`driver::obey_waiting`]) and their
//! replies wait for the next `GET`.
//! A session no `GET` asked for `http.longpoll_grace` plus the long-poll timeout is
//! dropped, and its token answers 410 (phoenix.js then opens a new one and joins again):
//! `POST`s alone do not keep it, since a client that never reads is as slow as a
//! WebSocket that never reads. Replies waiting for a `GET` are bounded by
//! `client.queue_max_bytes` per session and `limits.held_bytes_per_address` per address;
//! a `POST` that would pass either ends the session (410). The session ends at its
//! token's expiry as a WebSocket does (then 410).
//! Every answer is HTTP 200: phoenix.js reads the status from the body.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::{
    body::Bytes,
    extract::{RawQuery, Request, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
    Extension, Json,
};
use herald_protocol::{phoenix::Vsn, ErrorCode};
use serde_json::json;
use tokio::{sync::oneshot, time::Instant};

use super::speaker::Phoenix;
use crate::{
    error::Failure,
    hooks::Transport,
    limits::{AddressGuard, HeldBytes, Peer},
    node::Node,
    queue::{Command, Queue},
    session::Session,
    transport::{
        driver::{self, Held, Speaker},
        poll::{self, Answering, Collect, Key, Store},
        request,
    },
};

/// The Phoenix long-poll sessions of this node, in its store of waiting sessions, by
/// their token.
#[derive(Debug, Clone)]
pub struct Polls(Store);

/// A session as it waits in the store: its queue, where a `POST` leaves its client's
/// messages, and the session, held by the `GET` that waits on it or by a `POST` that finds
/// none waiting.
#[derive(Debug)]
struct Entry {
    queue: Arc<Queue>,
    polled: tokio::sync::Mutex<Polled>,
}

type Shared = Arc<Entry>;

/// One long-polling client.
#[derive(Debug)]
pub struct Polled {
    speaker: Phoenix,
    outbox: Outbox,
    /// Its address's count of connections, for as long as it lives.
    _counted: Option<AddressGuard>,
}

/// Messages waiting for the next `GET`.
#[derive(Debug)]
struct Outbox {
    messages: Vec<String>,
    /// Their bytes.
    bytes: usize,
    /// Those bytes, counted against its address (when the address is counted).
    held: Option<HeldBytes>,
    /// At most this many bytes (`client.queue_max_bytes`).
    bound: usize,
}

/// Each message goes into the outbox whole, as the answer's `messages` carries it: false
/// when the session would hold more than its bound (`client.queue_max_bytes`) or its
/// address more than `limits.held_bytes_per_address`.
impl Collect for Outbox {
    fn add(&mut self, message: &[u8]) -> bool {
        let n = message.len();
        if self.bytes + n > self.bound || self.held.as_mut().is_some_and(|h| !h.grow(n)) {
            return false;
        }
        self.bytes += n;
        self.messages
            .push(String::from_utf8_lossy(message).into_owned());
        true
    }

    fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

impl Outbox {
    /// Takes every message waiting.
    fn take(&mut self) -> Vec<String> {
        if let Some(held) = self.held.as_mut() {
            held.shrink(self.bytes);
        }
        self.bytes = 0;
        std::mem::take(&mut self.messages)
    }
}

/// Why a session whose replies do not fit ends.
const TOO_MANY: &str = "too many replies waiting: the session is read too slowly (GET)";

impl Polls {
    /// The sessions kept in `store`.
    pub fn new(store: Store) -> Self {
        Self(store)
    }

    /// Until when a session read now is kept: a client that reads keeps asking within its
    /// long-poll timeout, and may be away for the grace a Herald long-poll has.
    fn kept_from_now(node: &Node) -> Instant {
        let http = &node.settings.config.http;
        Instant::now() + http.longpoll_grace + http.longpoll_timeout + Duration::from_secs(5)
    }

    /// Session `token`, kept at least until `until` (a `POST`, which does not keep it,
    /// gives now).
    fn get(&self, token: &str, until: Instant) -> Option<Shared> {
        let key = Key::parse(token)?;
        self.0
            .look(key, until, |v| v.downcast_ref::<Shared>().cloned())
    }

    /// Ends session `token`: its token answers 410 from now on.
    fn end(&self, token: &str, reason: &str) -> Response {
        if let Some(key) = Key::parse(token) {
            self.0.forget(key, |v| v.is::<Shared>());
        }
        tracing::debug!(reason, "phoenix long-poll session ended");
        Json(json!({ "status": 410, "reason": reason })).into_response()
    }
}

/// A request's query: its parameters, and its `token`s in order.
struct PollQuery {
    params: BTreeMap<String, String>,
    tokens: Vec<String>,
}

impl PollQuery {
    fn parse(query: Option<&str>) -> Self {
        let mut params = BTreeMap::new();
        let mut tokens = Vec::new();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*k {
                "token" if !v.is_empty() => tokens.push(v.into_owned()),
                "token" => {}
                _ => {
                    params.insert(k.into_owned(), v.into_owned());
                }
            }
        }
        Self { params, tokens }
    }

    /// The session token, if the last `token` is one.
    fn session(&self) -> Option<&str> {
        self.tokens
            .last()
            .map(String::as_str)
            .filter(|t| is_session(t))
    }

    /// The connection token: the first `token`, unless it is the session's.
    fn connection(&self) -> Option<&str> {
        self.tokens
            .first()
            .map(String::as_str)
            .filter(|t| !is_session(t))
    }
}

/// Whether `token` has a session token's shape (32 lowercase hex digits: no JWT has).
fn is_session(token: &str) -> bool {
    token.len() == 32
        && token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn status(status: u16) -> Response {
    Json(json!({ "status": status })).into_response()
}

/// `GET /socket/longpoll`.
pub async fn poll(
    State(node): State<Arc<Node>>,
    Extension(polls): Extension<Polls>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    if let Some(off) = super::socket::off(&node) {
        return off;
    }
    let query = PollQuery::parse(query.as_deref());
    let Some(vsn) = Vsn::parse(query.params.get("vsn").map(String::as_str)) else {
        return Failure::new(ErrorCode::BadRequest, "unsupported vsn").into_response();
    };
    let Some(given) = query.session().map(str::to_owned) else {
        return open(&node, &polls, vsn, query, request).await;
    };
    if let Err(f) = request::may_continue(&node, request.headers()) {
        return f.into_response();
    }
    // Gone (dropped, or another node's): phoenix.js opens a new session.
    let Some(polled) = polls.get(&given, Polls::kept_from_now(&node)) else {
        return status(410);
    };
    let until = Instant::now() + node.settings.config.http.longpoll_timeout;
    let mut p = polled.polled.lock().await;
    let Polled {
        speaker, outbox, ..
    } = &mut *p;
    // The client cannot be seen leaving through the router: its hold runs its course.
    let never = std::pin::pin!(std::future::pending::<()>());
    let mut wire = Answering::new(outbox, until, never);
    let held = driver::hold(&node, speaker, &mut wire).await;
    let overflowed = wire.overflowed;
    if let Held::Ended(ended) = held {
        drop(p);
        let reason = ended.map_or_else(|| "the client left".to_owned(), |d| d.reason);
        return polls.end(&given, &reason);
    }
    if overflowed {
        drop(p);
        return polls.end(&given, TOO_MANY);
    }
    answer(&given, &mut p)
}

/// What waits for the client: 200 with the messages, or 204.
fn answer(token: &str, p: &mut Polled) -> Response {
    if p.outbox.messages.is_empty() {
        return Json(json!({ "status": 204, "token": token })).into_response();
    }
    let messages = p.outbox.take();
    Json(json!({ "status": 200, "token": token, "messages": messages })).into_response()
}

/// A first request: a session, identified by the `token` param as on the WebSocket.
async fn open(
    node: &Arc<Node>,
    polls: &Polls,
    vsn: Vsn,
    query: PollQuery,
    request: Request,
) -> Response {
    let headers: &HeaderMap = request.headers();
    let peer = request.extensions().get::<Peer>().copied().map(Extension);
    let counted = match request::admit(node, headers, peer) {
        Ok(c) => c,
        Err(f) => return f.into_response(),
    };
    let mut facts = node.settings.hooks.facts(headers);
    let mut params = query.params.clone();
    params.remove("vsn");
    if let Some(f) = facts.as_mut() {
        f.params = params;
    }
    // phoenix.js's `authToken` option, preferred to the socket's `token` param.
    let connection_token = super::auth_token::from_header(headers).or(query.connection());
    let address = counted.as_ref().map(|c| c.ip());
    let mut session = Session::new(node)
        .at_address(address)
        .came_by(Transport::Phoenix, facts);
    if let Err(d) = session.identify_once(connection_token).await {
        tracing::debug!(reason = %d.reason, "phoenix long-poll refused");
        return status(403);
    }
    session.announce();
    let key = Key::random();
    let held = counted.as_ref().map(|c| node.limits.hold(c.ip()));
    // A long-poll's answers are text: binary payloads go as base64.
    let speaker = Phoenix::new(session, vsn, super::Sender::random(), false);
    let entry = Entry {
        queue: speaker.session().queue().clone(),
        polled: tokio::sync::Mutex::new(Polled {
            speaker,
            outbox: Outbox {
                messages: Vec::new(),
                bytes: 0,
                held,
                bound: node.settings.config.client.queue_max_bytes,
            },
            _counted: counted,
        }),
    };
    let shared: Shared = Arc::new(entry);
    polls
        .0
        .insert(key, Box::new(shared), Polls::kept_from_now(node));
    let token = key.hex();
    let token = token.as_str();
    Json(json!({ "status": 410, "token": token })).into_response()
}

/// `POST /socket/longpoll?token=T`: the client's messages, one per line.
pub async fn send(
    State(node): State<Arc<Node>>,
    Extension(polls): Extension<Polls>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(off) = super::socket::off(&node) {
        return off;
    }
    if let Err(f) = request::may_continue(&node, &headers) {
        return f.into_response();
    }
    let query = PollQuery::parse(query.as_deref());
    let Some(given) = query.session() else {
        return status(410);
    };
    // A POST does not keep the session: only reading it does.
    let Some(polled) = polls.get(given, Instant::now()) else {
        return status(410);
    };
    for message in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let binary = binary_push(message);
        let frame = Bytes::copy_from_slice(binary.as_deref().unwrap_or(message));
        if let Err(refused) = obey((&polls, given), &polled, frame).await {
            return refused;
        }
    }
    status(200)
}

/// Hands one of the client's messages to its session as a command: the `GET` that holds
/// the session obeys it, and answers with its replies; with none waiting, it is obeyed
/// here and its replies wait for the next `GET`. `Err`: the answer to the `POST`.
async fn obey((polls, given): (&Polls, &str), entry: &Entry, frame: Bytes) -> Result<(), Response> {
    let (done, handled) = oneshot::channel();
    let command = Command {
        frame,
        done: Some(done),
    };
    if entry.queue.command(command).is_err() {
        return Err(
            Json(json!({ "status": 429, "reason": "too many messages at once" })).into_response(),
        );
    }
    let mut handled = handled;
    let outcome = tokio::select! {
        biased;
        outcome = &mut handled => outcome,
        mut p = entry.polled.lock() => {
            // What expired is told with the next `GET`'s answer.
            match poll::expired(&mut p.speaker).await {
                Err(d) => {
                    drop(p);
                    return Err(polls.end(given, &d.reason));
                }
                Ok(errors) => {
                    for error in errors.into_iter().flatten() {
                        p.outbox.messages.push(String::from_utf8_lossy(&error).into_owned());
                    }
                }
            }
            let Polled { speaker, outbox, .. } = &mut *p;
            let never = std::pin::pin!(std::future::pending::<()>());
            let mut wire = Answering::new(outbox, Instant::now(), never);
            // How it went comes through `done`, as from a `GET`.
            let _ = driver::obey_waiting(speaker, &mut wire).await;
            if wire.overflowed {
                drop(p);
                return Err(polls.end(given, TOO_MANY));
            }
            drop(p);
            handled.await
        }
    };
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(d)) => {
            polls.end(given, &d.reason);
            Err(Json(json!({ "status": 400, "reason": d.reason })).into_response())
        }
        // The session ended before the message was obeyed.
        Err(_) => Err(status(410)),
    }
}

/// A binary push as phoenix.js posts it on the long-poll: the message's bytes in base64, a
/// line of its own (JSON text begins otherwise). `None` for a JSON message.
fn binary_push(line: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine;
    if matches!(line.first(), Some(b'[' | b'{')) {
        return None;
    }
    base64::engine::general_purpose::STANDARD.decode(line).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posted_line_is_json_or_a_binary_push_in_base64_and_nothing_else() {
        assert_eq!(binary_push(br#"[null,"1","room","phx_join",{}]"#), None);
        assert_eq!(binary_push(br#"{"topic":"room"}"#), None);
        // phoenix.js's base64 of a binary push's bytes: taken as those bytes.
        assert_eq!(
            binary_push(b"AAECAwRyb29t"),
            Some(b"\0\x01\x02\x03\x04room".to_vec())
        );
        // Neither JSON nor base64: left as it is, for the decoder to refuse.
        assert_eq!(binary_push(b"not base64!"), None);
    }

    #[test]
    fn the_session_token_is_the_last_and_the_connection_token_the_first() {
        let session = "0123456789abcdef0123456789abcdef";
        let q = PollQuery::parse(Some(&format!("token=eyJ.jwt&vsn=2.0.0&token={session}")));
        assert_eq!(q.session(), Some(session));
        assert_eq!(q.connection(), Some("eyJ.jwt"));
        assert_eq!(q.params.get("vsn").map(String::as_str), Some("2.0.0"));
        // A first request: only the socket's own token, which no session has the shape of.
        let q = PollQuery::parse(Some("token=eyJ.jwt&vsn=2.0.0"));
        assert_eq!((q.session(), q.connection()), (None, Some("eyJ.jwt")));
        let q = PollQuery::parse(Some("vsn=2.0.0&token="));
        assert_eq!((q.session(), q.connection()), (None, None));
        assert!(!is_session("0123456789ABCDEF0123456789abcdef"));
    }
}

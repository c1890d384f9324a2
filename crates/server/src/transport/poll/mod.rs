//! Long-polling and interval polling: one request, one answer. The cursor in the answer is
//! the position to ask from next time, so any node of a cluster can answer any request.
//! A request that asks for it (`session_key=`) has its session parked after the answer
//! (see [`parked`]): the next request, with the answer's `session_key`,
//! takes it up with what queued meanwhile instead of building it again.
//!
//! Answer: `{"cursor": "…", "client": "…", "session_key": "…", "messages": [PUSH, …]}`,
//! where pushes are the same objects as on every other transport (`pub`, `subscribe`,
//! `presence`, `disconnect`), `client` is what the next request sends as `client=` so that
//! presence counts one member poll after poll, and `session_key` is there when the session
//! was parked.

use std::{
    future::Future,
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
    time::Duration,
};

use axum::{
    extract::{RawQuery, State},
    http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Extension,
};
use herald_protocol::{cursor, json, ChannelName, DisconnectCode, Push, Since};

use super::http1::{Handover, Held, Lean};
use super::{
    request::{self, OpenRequest},
    MAX_BATCH_BYTES,
};
use crate::{
    error::{Disconnect, Failure},
    hooks::Transport,
    limits::{AddressGuard, Peer},
    node::Node,
    policy::origin::CorsAnswer,
    session::Session,
    transport::driver,
};
pub use answering::{Answering, Collect};

mod answering;
mod hold;
mod lane;
mod parked;
mod resumer;
mod waiting;
pub use hold::expired;
pub use lane::{hold_on_socket, HoldEnd, HoldTimer};
pub use parked::Parked;
use parked::{Credentials, Resumed};
pub use resumer::Resumer;
pub use waiting::{Key, Store, Waiting};

/// Most bytes of publications in one answer; the rest comes with the next request.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// `GET /connection/poll`: answers at once with what is new (possibly nothing).
pub async fn poll(
    State(node): State<Arc<Node>>,
    Extension(parked): Extension<Parked>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    match prepare((node, parked), peer, headers, query, false).await {
        Ok(prepared) => finish(*prepared).await,
        Err(f) => f.into_response(),
    }
}

/// `GET /connection/longpoll`: answers at once if anything is new, otherwise holds the
/// request until something is or the timeout passes. On the lean path the hold is handed
/// back to run on the socket, in the connection's own task.
pub async fn longpoll(
    State(node): State<Arc<Node>>,
    Extension(parked): Extension<Parked>,
    peer: Option<Extension<Peer>>,
    lean: Option<Extension<Lean>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let origin = headers.get(header::ORIGIN).cloned();
    let mut prepared = match prepare((node, parked), peer, headers, query, true).await {
        Ok(prepared) => prepared,
        Err(f) => return f.into_response(),
    };
    if prepared.wait.is_none() {
        return finish(*prepared).await;
    }
    if lean.is_some() {
        // Answered after the router let go of it, so without its CORS layer: the answer
        // adds what the layer would.
        prepared.cors = Cors::Here(origin);
        return Handover::new(Held::Poll(prepared)).into_response();
    }
    // The router's client cannot be seen leaving: its hold runs its course.
    prepared.hold(std::future::pending()).await;
    finish(*prepared).await
}

/// The session parked under `request`'s key for it, taken up (held if `hold` and nothing
/// queued meanwhile); `None` if there is none. An error if the request may not continue a
/// session at all (a refused origin, shutdown): checked before the session is looked at,
/// so that such a request leaves it parked for its client.
fn take_parked(
    (node, parked): (&Arc<Node>, &Parked),
    request: &OpenRequest,
    headers: &HeaderMap,
    credentials: Credentials,
    hold: bool,
) -> Result<Option<Prepared>, Failure> {
    let Some(key) = request.session_key.as_deref().and_then(Key::parse) else {
        return Ok(None);
    };
    request::may_continue(node, headers)?;
    let (client, channels) = (request.client.as_deref(), &request.channels);
    let Some(resumed) = parked.take(key, credentials, client, channels) else {
        return Ok(None);
    };
    Ok(Some(Prepared::resumed(
        (node.clone(), parked.clone()),
        resumed,
        hold,
        hold_for(node, request),
        (key, credentials),
    )))
}

/// Who a request says it is, for taking up a parked session.
fn credentials(parked: &Parked, request: &OpenRequest, headers: &HeaderMap) -> Credentials {
    let cookie = headers.get(header::COOKIE).map(|v| v.as_bytes());
    parked.credentials(request.token.as_deref(), &request.sub_tokens, cookie)
}

/// Who adds the CORS headers to a poll's answer.
#[derive(Debug)]
enum Cors {
    /// The router's layer, on the way out.
    Router,
    /// [`finish`], for a request from this origin answered without the router.
    Here(Option<HeaderValue>),
}

fn item(messages: &mut Vec<u8>, json: &[u8]) {
    if !messages.is_empty() {
        messages.push(b',');
    }
    messages.extend_from_slice(json);
}

/// A poll whose channels are opened and replayed, to answer now or after its hold.
#[derive(Debug)]
pub struct Prepared {
    // Counts the request against its address until it is answered.
    _admitted: Option<AddressGuard>,
    /// The node, for its shutdown.
    pub node: Arc<Node>,
    session: Session,
    /// What the answer carries so far (pushes, comma-separated).
    messages: Vec<u8>,
    /// Positions of channels left for the next poll.
    later: Vec<(ChannelName, Since)>,
    if_none_match: Option<Vec<u8>>,
    hold: bool,
    /// How long to hold before answering (a long-poll with nothing to say yet).
    wait: Option<Duration>,
    /// Why the session ended while held (its token expired), told in the answer.
    ended: Option<Disconnect>,
    /// Whether the session is parked after the answer: under the key it was taken up with
    /// (none yet for a new one), for a request with these credentials.
    park: Option<(Option<Key>, Credentials)>,
    /// Where it is parked.
    parked: Parked,
    cors: Cors,
}

impl Prepared {
    /// Holds it under the driver ([`driver::hold`]) until something is queued for it, its
    /// hold is over, something its token granted expires, or the node shuts down. An
    /// expired connection token ends it as it ends every transport (3504), told in the
    /// answer; an expired subscription token answers with that channel's `unsubscribe`
    /// (109). True when `left` resolved first: the client is gone, and so is the session.
    pub async fn hold(&mut self, left: impl Future<Output = ()> + Send) -> bool {
        let Some(wait) = self.wait else {
            return false;
        };
        let left = std::pin::pin!(left);
        let until = tokio::time::Instant::now() + wait;
        let mut wire = Answering::new(&mut self.messages, until, left);
        match driver::hold(&self.node, &mut self.session, &mut wire).await {
            driver::Held::Answered => false,
            driver::Held::Ended(Some(d)) => {
                self.ended = Some(d);
                false
            }
            driver::Held::Ended(None) => true,
        }
    }

    /// Something its token granted has expired: whether that ends the hold (the session
    /// ended, or a channel's grant went and its `unsubscribe` is to be told). False when
    /// the hook refreshed it.
    async fn expired(&mut self) -> bool {
        match hold::expired(&mut self.session).await {
            Err(d) => {
                self.ended = Some(d);
                true
            }
            Ok(Some(pushes)) => {
                for push in pushes {
                    item(&mut self.messages, &push);
                }
                true
            }
            Ok(None) => false,
        }
    }

    /// Whether the hub may answer it itself ([`lane`]): it waits for something to say, and
    /// its session is parked after the answer with nothing left for a later poll, so the
    /// answer that carries a publication leaves nothing for this connection's task to do.
    pub fn answerable_by_hub(&self) -> bool {
        self.hold && self.wait.is_some() && self.park.is_some() && self.later.is_empty()
    }
}

/// [`opening`] a poll, given up when the node starts sending its clients elsewhere: one
/// that waits on a broker out of reach must not outlive the grace, as the connections the
/// node ends then do not.
async fn prepare(
    (node, parked): (Arc<Node>, Parked),
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    query: Option<String>,
    hold: bool,
) -> Result<Box<Prepared>, Failure> {
    let moving = node.clone();
    let opening = Box::pin(opening((node, parked), peer, headers, query, hold));
    tokio::select! {
        opened = opening => opened,
        () = moving.moving_clients_started() => Err(Failure::new(
            herald_protocol::ErrorCode::BrokerUnavailable,
            "this node cannot reach its broker; retry on another node",
        )),
    }
}

async fn opening(
    (node, parked): (Arc<Node>, Parked),
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    query: Option<String>,
    hold: bool,
) -> Result<Box<Prepared>, Failure> {
    let request = OpenRequest::parse(query.as_deref(), &headers)?;
    request.text_only()?;
    // Asked to be parked (`session_key=`, with a key or empty for a new one).
    let credentials = (request.session_key.is_some() && parked.enabled())
        .then(|| credentials(&parked, &request, &headers));
    if let Some(credentials) = credentials {
        let taken = take_parked((&node, &parked), &request, &headers, credentials, hold)?;
        if let Some(prepared) = taken {
            return Ok(Box::new(prepared));
        }
    }
    // A key that names no session parked here (expired, another node's, made up) gets a new
    // one, for a session built afresh.
    let park = credentials.map(|credentials| (None, credentials));
    let admitted = request::admit(&node, &headers, peer)?;
    let address = admitted.as_ref().map(|a| a.ip());
    let transport = if hold {
        Transport::Longpoll
    } else {
        Transport::Poll
    };
    let session = Session::new(&node)
        .at_address(address)
        .came_by(transport, node.settings.hooks.facts(&headers));
    // Header values share the buffer the request was read into: kept across the hold,
    // they would keep that buffer alive beside the one the server reads into next.
    let if_none_match = headers
        .get(header::IF_NONE_MATCH)
        .map(|v| v.as_bytes().to_vec());
    drop(headers);
    // Boxed, as are the replays below: a held poll's future is as large as its largest
    // step, and these (a hook's request, a history read) are done before the hold.
    let authenticating = Box::pin(request.authenticate(&node, session));
    let mut session = authenticating.await?;
    let request = request.with_token_channels(&session).require_channels()?;
    let admitting = Box::pin(session.admit(&request.channels));
    admitting.await?;
    let mut messages = Vec::new();
    // Positions of channels left for the next poll: once the answer is full, a channel
    // behind is not replayed (that could make the answer as large as every history) but
    // keeps its position in the cursor, so the next poll continues from there.
    let mut later = Vec::new();
    let timeout = hold_for(&node, &request);
    let takes = request.takes();
    for (channel, since) in request.channels {
        match since {
            Some(since) if messages.len() >= MAX_ANSWER_BYTES => later.push((channel, since)),
            since => {
                let opening = Box::pin(
                    session
                        .open_channel(channel, since, takes, |json, _| item(&mut messages, json)),
                );
                opening.await?
            }
        }
    }
    let wait = (hold && messages.is_empty()).then_some(timeout);
    Ok(Box::new(Prepared {
        _admitted: admitted,
        node,
        session,
        messages,
        later,
        if_none_match,
        hold,
        wait,
        ended: None,
        park,
        parked,
        cors: Cors::Router,
    }))
}

/// How long a long-poll with nothing to say yet is held.
fn hold_for(node: &Node, request: &OpenRequest) -> Duration {
    hold_for_at_most(node, request.timeout)
}

/// How long a long-poll that asked for `timeout` is held with nothing to say.
fn hold_for_at_most(node: &Node, timeout: Option<Duration>) -> Duration {
    let http = &node.settings.config.http;
    timeout
        .unwrap_or(http.longpoll_timeout)
        .min(http.longpoll_max_timeout)
}

impl Prepared {
    /// A request that takes up its parked session: nothing to open or replay, and held only
    /// if nothing queued while it was parked.
    fn resumed(
        (node, parked): (Arc<Node>, Parked),
        resumed: Resumed,
        hold: bool,
        timeout: Duration,
        (key, credentials): (Key, Credentials),
    ) -> Self {
        let Resumed { session, admitted } = resumed;
        let wait = (hold && !session.queue().has_work()).then_some(timeout);
        Self {
            _admitted: admitted,
            node,
            session,
            messages: Vec::new(),
            later: Vec::new(),
            if_none_match: None,
            hold,
            wait,
            ended: None,
            park: Some((Some(key), credentials)),
            parked,
            cors: Cors::Router,
        }
    }
}

/// The answer: what was replayed and everything that arrived meanwhile, with the cursor.
pub async fn finish(prepared: Prepared) -> Response {
    answer(prepared).await.into_response()
}

/// A poll's answer, ready to go out through the router or straight onto the socket (the
/// lean path writes it without building a [`Response`]).
#[derive(Debug)]
pub struct Answer {
    /// 200, or 304 when a poll's cursor is the one its client has.
    status: StatusCode,
    /// Empty for a 304.
    body: Vec<u8>,
    /// Held answers are never cached; polls are revalidated (`etag`).
    hold: bool,
    etag: Option<String>,
    /// The CORS headers the router's layer would add, for an answer written without it.
    cors: Option<CorsAnswer>,
}

impl Answer {
    fn headers(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        let cache = if self.hold {
            "no-store"
        } else {
            // The same cursor gives the same answer until something is published.
            "private, no-cache"
        };
        let typed = (self.status == StatusCode::OK).then(|| {
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
        });
        let etag = self.etag.as_ref().map(|e| {
            let value = HeaderValue::from_str(e).expect("hex is a valid header");
            (header::ETAG, value)
        });
        let cors = self.cors.iter().flat_map(CorsAnswer::headers);
        typed
            .into_iter()
            .chain([(header::CACHE_CONTROL, HeaderValue::from_static(cache))])
            .chain(etag)
            .chain(cors)
    }

    /// The answer as an HTTP/1.1 response's bytes, head and body, saying whether the
    /// connection stays open.
    pub fn to_http1(&self, keep_alive: bool) -> Vec<u8> {
        // Written without the formatting machinery: the hub writes one of these per held
        // long-poll it answers, on the thread every other answer of the publication waits for.
        let mut out = Vec::with_capacity(256 + self.body.len());
        let reason = self.status.canonical_reason().unwrap_or("Unknown");
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(self.status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(b"\r\n");
        crate::transport::date::write_header(&mut out);
        for (name, value) in self.headers() {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        // A 304 says nothing of its body's length (RFC 9110, 8.6).
        if self.status != StatusCode::NOT_MODIFIED {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(self.body.len()).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(if keep_alive {
            b"connection: keep-alive\r\n\r\n"
        } else {
            b"connection: close\r\n\r\n"
        });
        out.extend_from_slice(&self.body);
        out
    }
}

impl IntoResponse for Answer {
    fn into_response(mut self) -> Response {
        let mut response = if self.status == StatusCode::OK {
            std::mem::take(&mut self.body).into_response()
        } else {
            self.status.into_response()
        };
        let h = response.headers_mut();
        for (name, value) in self.headers() {
            h.insert(name, value);
        }
        response
    }
}

/// The answer of `prepared`: what was replayed and everything that arrived meanwhile, with
/// the cursor; the session parked again if it asked to be. What its tokens granted and
/// has expired (while it was parked, or since its hold) is ended first, as every
/// transport ends it: nothing queued goes out past it, and a session that ended answers
/// with why and nothing more.
pub async fn answer(mut prepared: Prepared) -> Answer {
    if prepared.ended.is_none() && prepared.session.past_deadline() {
        let expiring = Box::pin(prepared.expired());
        expiring.await;
    }
    let Prepared {
        session,
        messages,
        ended,
        ..
    } = &mut prepared;
    while ended.is_none() && messages.len() < MAX_ANSWER_BYTES {
        let before = messages.len();
        if let Err(d) = session.drain(MAX_BATCH_BYTES, |json, _, _| item(messages, json)) {
            *ended = Some(d);
            break;
        }
        if messages.len() == before {
            break;
        }
    }
    compose(prepared).0
}

/// The answer of `prepared` with what it holds, nothing more taken from its queue; the
/// session parked again if it asked to be, or handed back (to be dropped where its leave
/// can be spawned).
fn compose(prepared: Prepared) -> (Answer, Option<Session>) {
    let Prepared {
        _admitted: admitted,
        node,
        session,
        mut messages,
        later,
        if_none_match,
        hold,
        ended,
        park,
        parked,
        cors,
        ..
    } = prepared;
    let mut ending = ended;
    // A long-poll held when the server shuts down ends as a stream does: told to reconnect
    // (3001), after what it had.
    if hold && ending.is_none() && node.shutdown.is_cancelled() {
        ending = Some(Disconnect::new(DisconnectCode::Shutdown));
    }
    if let Some(d) = &ending {
        let push = session.codec().push(&Push::Disconnect {
            code: d.wire_code(),
            reason: d.short_reason(),
        });
        item(&mut messages, &push);
    }
    let mut cursor = session.positions().cursor();
    for (channel, since) in &later {
        cursor::write_since(&mut cursor, channel, since);
    }
    // Polls only: a held answer is never revalidated.
    let etag = (!hold).then(|| {
        let mut h = DefaultHasher::new();
        cursor.hash(&mut h);
        format!("\"{:016x}\"", h.finish())
    });
    let unchanged = messages.is_empty()
        && etag
            .as_ref()
            .is_some_and(|e| if_none_match.is_some_and(|v| v == e.as_bytes()));
    // Parked only whole, and only where the next request can come for it: not a session
    // that ended, nor one whose answer left channels for later (never opened), nor at
    // shutdown, nor a new one whose key a 304 would not carry.
    let park = park.filter(|(key, _)| {
        ending.is_none()
            && later.is_empty()
            && !node.shutdown.is_cancelled()
            && !(unchanged && key.is_none())
    });
    let park = park.map(|(key, credentials)| (key.unwrap_or_else(Key::random), credentials));
    // `client` is sent back as `client=`, so that presence sees one member poll after poll.
    let body = if unchanged {
        Vec::new()
    } else {
        let key = park.map(|(key, _)| key.hex());
        let key = key.as_ref().map(|hex| hex.as_str());
        json::encode_poll_answer(&cursor, session.first_client(), key, &messages)
    };
    let unparked = match park {
        Some((key, credentials)) => {
            parked.park(key, Resumed { session, admitted }, credentials, cursor);
            None
        }
        None => Some(session),
    };
    let cors = match cors {
        Cors::Router => None,
        Cors::Here(origin) => Some(CorsAnswer::new(&node.settings, origin.as_ref())),
    };
    let answer = Answer {
        status: if unchanged {
            StatusCode::NOT_MODIFIED
        } else {
            StatusCode::OK
        },
        body,
        hold,
        etag,
        cors,
    };
    (answer, unparked)
}

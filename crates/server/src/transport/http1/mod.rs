//! The lean path for held requests and publications: a connection whose request holds it
//! open (a stream: `GET /connection/{sse,stream,iframe}`, or a long-poll) is served here, on
//! the socket itself, instead of by hyper's HTTP/1.1 connection, which keeps two 8 KiB
//! buffers for every connection whatever it carries. Such a request spends its life
//! waiting, so those buffers were most of what it cost.
//!
//! A backend's `POST /api/publish` is answered here too, without the router: it is the
//! request a busy backend sends most, and hyper's connection and the router's layers were
//! about a tenth of the server's CPU per publication in a many-rooms run (docs/benchmarks.md,
//! "A publication answered without the router"). It is asked what the router's layers ask
//! (`api::publish::may_publish`) before its body is read; a body framed any other way
//! than by one `content-length` of at most 64 KiB goes to hyper.
//!
//! A held request goes through the same router as every other (admission, origins, tokens,
//! the handlers); only reading its head and writing its answer happen here: the head is
//! parsed by `httparse`, the answer written with `content-length` or chunked. A handler
//! that would hold the connection hands what it holds back ([`Handover`]): the stream, or
//! the waiting poll, then runs in the connection's own task with nothing else kept from the
//! request, so a held request costs about what an idle WebSocket does. Two requests skip
//! the router: the publication above, and a long-poll that takes up its parked session
//! (`poll::Resumer`, which asks what the router would ask and adds what its layers would
//! add).
//!
//! A connection's first request is sorted by its first bytes, peeked without reading them,
//! so a connection whose first request is anything else goes to hyper untouched (and stays
//! there: WebSocket upgrades, the rest of the API, pages). After an answer here the
//! connection is kept alive and its next request read into a buffer kept between requests
//! (one `recv` a request); a request that is not served here goes to hyper with the bytes
//! read of it.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{body::Body, http, response::Response, Router};
use bytes::Buf;
use futures_util::FutureExt;
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::{
    io::{AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};

mod body;
mod head;
mod held_stream;

pub use head::MAX_HEADERS;
use head::{read_head, refuse, Head, Refused};

use super::{poll, stream};
use crate::limits::Peer;
use held_stream::run_stream;
pub(crate) use held_stream::send_unsent;

/// The request lines served here.
const LEAN: [&[u8]; 6] = [
    b"GET /connection/sse",
    b"GET /connection/stream",
    b"GET /connection/iframe",
    b"GET /connection/longpoll",
    // Not held, but a poller's other request: a long-poller that starts with a poll (to
    // learn its cursor) keeps its connection here.
    b"GET /connection/poll",
    // The one request with a body read here (`head.rs` frames only a POST's), answered as
    // a publication (`body::publish`).
    b"POST /api/publish",
];

/// In a request's extensions when it is served here: a handler that would hold the
/// connection hands what it holds back instead (as a [`Handover`]), to be run on the socket
/// in the connection's own task.
#[derive(Debug, Clone, Copy)]
pub struct Lean;

/// What a handler hands back to hold on the socket.
#[derive(Debug)]
pub enum Held {
    /// A stream, from its first bytes to its end.
    Stream(Box<stream::Accepted>),
    /// A long-poll waiting for something to answer with.
    Poll(Box<poll::Prepared>),
}

/// A response's [`Held`], in its extensions (which must be `Clone`: hence the shared slot,
/// taken once). The response's status and headers are the answer's head.
#[derive(Debug, Clone)]
pub struct Handover(Arc<parking_lot::Mutex<Option<Held>>>);

impl Handover {
    /// Hands `held` back.
    pub fn new(held: Held) -> Self {
        Self(Arc::new(parking_lot::Mutex::new(Some(held))))
    }

    /// What was handed back, the first time.
    pub fn take(&self) -> Option<Held> {
        self.0.lock().take()
    }
}

impl axum::response::IntoResponse for Handover {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::empty());
        response.extensions_mut().insert(self);
        response
    }
}

/// Whether a request line (its first bytes) is one served here: the path is one of
/// [`LEAN`], followed by its query or a space. `None` while what arrived so far is a
/// prefix of one of them (undecided).
fn lean(line: &[u8]) -> Option<bool> {
    for route in LEAN {
        let n = route.len().min(line.len());
        if line[..n] == route[..n] {
            return match line.get(route.len()) {
                None => None,
                Some(b'?' | b' ') => Some(true),
                Some(_) => Some(false),
            };
        }
    }
    Some(false)
}

/// What a connection's first request is.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A stream's request, a poll's or a publication's: served here.
    Lean,
    /// Anything else: for hyper.
    Other,
    /// The client closed the connection, or sent nothing in time.
    Gone,
}

/// Sorts the connection's first request by its first bytes, without reading them. Waits at
/// most `wait` for them.
pub async fn next(stream: &TcpStream, wait: Duration) -> Next {
    let peek = async {
        let mut buf = [0u8; 32];
        let mut pause = Duration::from_millis(1);
        loop {
            let n = match stream.peek(&mut buf).await {
                Ok(0) | Err(_) => return Next::Gone,
                Ok(n) => n,
            };
            match lean(&buf[..n]) {
                Some(true) => return Next::Lean,
                Some(false) => return Next::Other,
                // A request line cut short by the network: peeking again at once would see
                // the same bytes, so wait a little for the rest.
                None => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
            }
        }
    };
    tokio::time::timeout(wait, peek).await.unwrap_or(Next::Gone)
}

/// What `next` says, or `Gone` as soon as the node shuts down: a connection between
/// requests holds no one's data, and shutdown must not wait out its header timeout.
pub async fn until_shutdown(
    next: impl std::future::Future<Output = Next>,
    shutdown: &crate::node::Shutdown,
) -> Next {
    tokio::select! {
        next = next => next,
        _ = shutdown.cancelled() => Next::Gone,
    }
}

/// Serves held requests on `stream` while they come; returns the stream when the next
/// request is one for hyper, with what was read of it, `None` when the connection is done.
pub async fn serve(
    (app, resumer): (&Router, &poll::Resumer),
    mut stream: TcpStream,
    peer: SocketAddr,
    socket: Arc<crate::Counted>,
    limits: Limits,
    shutdown: &crate::node::Shutdown,
) -> Option<(TcpStream, Vec<u8>)> {
    // What was read from the connection and not yet used: a request's first bytes.
    let mut unread = Vec::new();
    let mut hold_timer = poll::HoldTimer::None;
    loop {
        // Everything but a stream's life is boxed, and freed before the stream runs: the
        // connection's task is as large as its largest step, and a stream spends its life
        // running. (The boxed future is made in a statement of its own: a temporary lives
        // to the end of its statement, and one that spans an await takes room in the task.)
        let handling = Box::pin(handle(
            (app, resumer),
            &mut stream,
            &mut unread,
            peer,
            &socket,
            limits,
            shutdown,
        ));
        let handled = handling.await;
        let keep_alive = match handled {
            Handled::Closed => return None,
            Handled::Other => return Some((stream, unread)),
            Handled::Answered { keep_alive } => keep_alive,
            Handled::Stream(head, accepted, framing) => {
                match run_stream(stream, head, accepted, framing, limits.write_timeout).await {
                    Some(back) => {
                        stream = back;
                        true
                    }
                    None => return None,
                }
            }
            // Held with the lane open: the hub may answer it itself.
            Handled::Poll(prepared, true) if prepared.answerable_by_hub() => {
                let held =
                    poll::hold_on_socket(prepared, stream, limits.write_timeout, &mut hold_timer);
                match held.await {
                    poll::HoldEnd::Answered(back) => {
                        stream = back;
                        true
                    }
                    poll::HoldEnd::Open(back, prepared) => {
                        stream = back;
                        let answer = poll::answer(*prepared).await.to_http1(true);
                        write(&mut stream, &answer, limits.write_timeout).await
                    }
                    poll::HoldEnd::Gone => return None,
                }
            }
            Handled::Poll(mut prepared, keep_alive) => {
                // Held until something arrives, the hold is over, the node shuts down or
                // the client leaves.
                if prepared.hold(client_left(&stream)).await {
                    return None;
                }
                // Written as it is, head and body in one write: no `Response` to build and
                // take apart again.
                let answer = poll::answer(*prepared).await.to_http1(keep_alive);
                write(&mut stream, &answer, limits.write_timeout).await && keep_alive
            }
        };
        // Shutting down: the answer told the client (a `disconnect` push, or an answer at
        // once); the connection takes no more.
        if !keep_alive || shutdown.is_cancelled() {
            let _ = stream.shutdown().await;
            return None;
        }
    }
}

/// How long a connection's reads and writes may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// For a request's head to arrive whole (and for the first bytes of the next one).
    pub header_timeout: Duration,
    /// For a write to go out.
    pub write_timeout: Duration,
    /// For a request's body to arrive whole.
    pub body_timeout: Duration,
}

/// What became of a request.
enum Handled {
    /// The connection is done (the client left, or was refused).
    Closed,
    /// The request is not one served here: for hyper.
    Other,
    /// It was answered; whether the connection may carry another request.
    Answered { keep_alive: bool },
    /// Its handler accepted a stream, to run on the socket after the response's head.
    Stream(Vec<u8>, Box<stream::Accepted>, Framing),
    /// A long-poll to hold, then answer (whether the client asked to keep the connection).
    Poll(Box<poll::Prepared>, bool),
}

/// Reads a request, hands it to the router and writes the answer, unless it opened a stream.
async fn handle(
    (app, resumer): (&Router, &poll::Resumer),
    stream: &mut TcpStream,
    unread: &mut Vec<u8>,
    peer: SocketAddr,
    socket: &Arc<crate::Counted>,
    limits: Limits,
    shutdown: &crate::node::Shutdown,
) -> Handled {
    // A head still coming when the node shuts down is not waited for; nor is the next
    // request of a connection between requests, which holds no one's data.
    // The head first: after a long-poll's answer the next one has usually arrived, and a
    // shutdown watch never polled costs nothing to drop.
    let head = tokio::select! {
        biased;
        head = read_head(stream, unread, limits.header_timeout) => head,
        _ = shutdown.cancelled() => return Handled::Closed,
    };
    let Head {
        mut request,
        keep_alive,
        version,
        body,
    } = match head {
        Ok(Some(head)) => head,
        Ok(None) => return Handled::Other,
        Err(Refused::Gone) => return Handled::Closed,
        Err(Refused::Bad(why)) => {
            refuse(stream, why, limits.write_timeout).await;
            return Handled::Closed;
        }
    };
    // A node sending its clients elsewhere answers this request, then closes: the client's
    // next one goes through its load balancer to a node that is ready.
    let keep_alive = keep_alive && !resumer.node().is_moving_clients();
    if let Some(length) = body {
        let request = request.into_parts().0;
        let node = resumer.node();
        let Some((response, keep_alive)) =
            body::publish(node, request, keep_alive, (stream, unread, length), limits).await
        else {
            return Handled::Closed;
        };
        return Handled::Answered {
            keep_alive: answer(stream, response, version, keep_alive, limits.write_timeout).await,
        };
    }
    // A long-poll that takes up its parked session needs nothing the router does.
    if let Some(prepared) = resumer.take_up(&request) {
        return Handled::Poll(prepared, keep_alive);
    }
    let extensions = request.extensions_mut();
    extensions.insert(Peer(peer));
    extensions.insert(socket.clone());
    extensions.insert(Lean);
    let response = tower::ServiceExt::oneshot(app.clone(), request)
        .await
        .unwrap_or_else(|never| match never {});
    // Whether the client asked to keep the connection is weighed by what writes the answer
    // (it says so in the head it writes): the answer goes out either way.
    match response
        .extensions()
        .get::<Handover>()
        .and_then(Handover::take)
    {
        Some(Held::Stream(accepted)) => {
            let (head, framing) = head_of(&response.into_parts().0, None, version, keep_alive);
            Handled::Stream(head, accepted, framing)
        }
        Some(Held::Poll(prepared)) => Handled::Poll(prepared, keep_alive),
        None => Handled::Answered {
            keep_alive: answer(stream, response, version, keep_alive, limits.write_timeout).await,
        },
    }
}

/// How an answer is framed on the wire.
struct Framing {
    /// `transfer-encoding: chunked`, for a body of unknown length on HTTP/1.1 (HTTP/1.0 has
    /// no chunks: such an answer ends with the connection).
    chunked: bool,
    /// Whether the connection may carry another request after this answer.
    keep_alive: bool,
}

/// The head of an answer with `parts` whose body is `length` bytes long (`None`: unknown),
/// and how its body is framed.
fn head_of(
    parts: &http::response::Parts,
    length: Option<u64>,
    version: http::Version,
    keep_alive: bool,
) -> (Vec<u8>, Framing) {
    // 204 and 304 have no body, and say nothing of its length (RFC 9110, 8.6).
    let bodiless = matches!(
        parts.status,
        http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
    );
    let length = if bodiless { Some(0) } else { length };
    let chunked = length.is_none() && version == http::Version::HTTP_11;
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(parts.status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(
        parts
            .status
            .canonical_reason()
            .unwrap_or("Unknown")
            .as_bytes(),
    );
    head.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        // The framing, the connection's fate and the date are decided here, once.
        if name == http::header::CONTENT_LENGTH
            || name == http::header::TRANSFER_ENCODING
            || name == http::header::CONNECTION
            || name == http::header::DATE
        {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    super::date::write_header(&mut head);
    match length {
        Some(_) if bodiless => {}
        Some(n) => head.extend_from_slice(format!("content-length: {n}\r\n").as_bytes()),
        None if chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        None => {}
    }
    let keep_alive = keep_alive && (length.is_some() || chunked);
    head.extend_from_slice(if keep_alive {
        b"connection: keep-alive\r\n\r\n"
    } else {
        b"connection: close\r\n\r\n"
    });
    (
        head,
        Framing {
            chunked,
            keep_alive,
        },
    )
}

/// Writes `response`; false when the connection cannot carry another request (the client
/// left, a write failed or took longer than `write_timeout`, or the answer had no length).
/// Largest answer whose head and body are written together.
const ONE_WRITE: u64 = 256 * 1024;

async fn answer(
    stream: &mut TcpStream,
    response: Response,
    version: http::Version,
    keep_alive: bool,
    write_timeout: Duration,
) -> bool {
    let (parts, mut body) = response.into_parts();
    let length = http_body::Body::size_hint(&body).exact();
    let (
        head,
        Framing {
            chunked,
            keep_alive,
        },
    ) = head_of(&parts, length, version, keep_alive);
    drop(parts);
    let (mut reader, mut writer) = stream.split();
    // A body that is there already (a poll's answer, an error) leaves with its head in one
    // write: one segment for the client to read, where two cost the kernel about a fifth
    // more per long-poll answer.
    let mut head = head;
    if !chunked && length.is_some_and(|n| n <= ONE_WRITE) {
        if let Some(Some(Ok(frame))) = body.frame().now_or_never() {
            // Trailers (not data) are none of ours.
            if let Ok(data) = frame.into_data() {
                head.extend_from_slice(data.chunk());
            }
        }
    }
    if !write(&mut writer, &head, write_timeout).await {
        return false;
    }
    if body.is_end_stream() {
        return keep_alive;
    }
    drop(head);
    // While the answer is open, a client that leaves is noticed by its end of stream.
    let mut gone = std::pin::pin!(async move {
        let mut one = [0u8; 1];
        match reader.peek(&mut one).await {
            Ok(0) | Err(_) => {}
            Ok(_) => std::future::pending::<()>().await,
        }
    });
    loop {
        let frame = tokio::select! {
            // The body first: a frame that is ready goes out without a look at the socket.
            biased;
            frame = body.frame() => frame,
            () = &mut gone => return false,
        };
        let data = match frame {
            None => break,
            Some(Err(_)) => return false,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers: none of ours send any.
                Err(_) => continue,
            },
        };
        if data.is_empty() {
            continue;
        }
        let ok = if chunked {
            write_chunk(&mut writer, &data, write_timeout).await
        } else {
            write(&mut writer, data.chunk(), write_timeout).await
        };
        if !ok {
            return false;
        }
    }
    if chunked && !write(&mut writer, b"0\r\n\r\n", write_timeout).await {
        return false;
    }
    keep_alive
}

/// Resolves when the client closes its side. It sends nothing else while an answer is
/// open (a next request waits for the answer, and is left unread for after it), so
/// anything it does send is not an end.
async fn client_left(reader: &TcpStream) {
    if !arrival(reader).await {
        std::future::pending::<()>().await;
    }
}

/// Resolves when the client sends something: true if it closed its side (or the socket
/// failed), false for bytes, which stay unread.
pub(crate) async fn arrival(reader: &TcpStream) -> bool {
    // Polled by hand rather than with `peek`: `poll_peek` keeps the waker in the socket's
    // own slot, where `peek`'s future carries a waiter of its own, about 270 bytes that
    // every held stream and long-poll would keep while it waits. Nothing else of this
    // connection waits to read while its answer is open.
    let mut one = [0u8; 1];
    let peeked = std::future::poll_fn(|cx| {
        let mut buf = tokio::io::ReadBuf::new(&mut one);
        reader.poll_peek(cx, &mut buf)
    })
    .await;
    matches!(peeked, Ok(0) | Err(_))
}

/// `data` as one HTTP chunk.
fn chunk(data: &[u8]) -> Vec<u8> {
    let size = format!("{:x}\r\n", data.len());
    let mut frame = Vec::with_capacity(size.len() + data.len() + 2);
    frame.extend_from_slice(size.as_bytes());
    frame.extend_from_slice(data);
    frame.extend_from_slice(b"\r\n");
    frame
}

async fn write_chunk(stream: &mut (impl AsyncWrite + Unpin), data: &[u8], wait: Duration) -> bool {
    write(stream, &chunk(data), wait).await
}

async fn write(stream: &mut (impl AsyncWrite + Unpin), bytes: &[u8], wait: Duration) -> bool {
    matches!(
        tokio::time::timeout(wait, stream.write_all(bytes)).await,
        Ok(Ok(()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_request_lines_by_their_first_bytes() {
        assert_eq!(lean(b"POST /api/publish HTTP/1.1"), Some(true));
        assert_eq!(lean(b"POST /api/publish?x HTTP/1.1"), Some(true));
        assert_eq!(lean(b"POST /api/publishes HTTP/1.1"), Some(false));
        assert_eq!(lean(b"GET /api/publish HTTP/1.1"), Some(false));
        assert_eq!(lean(b"POST /api/broadcast HTTP/1.1"), Some(false));
        assert_eq!(lean(b"GET /connection/sse?channel=a HTTP/1.1"), Some(true));
        assert_eq!(lean(b"GET /connection/sse HTTP/1.1"), Some(true));
        assert_eq!(lean(b"GET /connection/longpoll?x"), Some(true));
        assert_eq!(lean(b"GET /connection/poll?x"), Some(true));
        assert_eq!(lean(b"GET /connection/polls"), Some(false));
        assert_eq!(lean(b"GET /connection/websocket"), Some(false));
        assert_eq!(lean(b"GET /connection/sses"), Some(false));
        assert_eq!(lean(b"POST /connection/sse"), Some(false));
        assert_eq!(lean(b"GET /api/info"), Some(false));
        assert_eq!(lean(b"GET /conn"), None);
        assert_eq!(lean(b"GET /connection/sse"), None);
        assert_eq!(lean(b"G"), None);
    }
}

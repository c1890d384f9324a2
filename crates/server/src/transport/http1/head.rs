//! Reading a held request's head on the socket: taken as it arrives, never past its end
//! (what follows is the next request's), by httparse's rules, which hyper reads every
//! other request with.

use std::time::Duration;

use axum::{body::Body, http};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::write;

/// The longest request head read here (hyper's default allows more, but a held request
/// carries a cursor of at most 16 KiB and a token).
const MAX_HEAD: usize = 24 * 1024;

/// Headers a request may have, here and on hyper's path alike (one set of rules).
pub const MAX_HEADERS: usize = 64;

/// A request head read here.
pub(super) struct Head {
    pub(super) request: http::Request<Body>,
    pub(super) keep_alive: bool,
    pub(super) version: http::Version,
}

/// Why no head was read.
pub(super) enum Refused {
    /// The client went away, or sent nothing whole in time: closed without a word.
    Gone,
    /// What it sent cannot be served here: answered 400 with why, then closed.
    Bad(&'static str),
}

/// Reads the connection's next request head into `unread` (what was read from the
/// connection and not yet used: the start of a request, kept between requests); `None`
/// when the request is not one served here, with what was read of it left in `unread`
/// for hyper.
///
/// The connection is read, not peeked, into spare room larger than what has arrived: a
/// short read tells tokio the socket is drained, so the next wait (for the client to
/// leave while a long-poll is held, or for its next request) costs no syscall that finds
/// nothing. A request then costs one `recv` where peeking first cost four. What follows
/// the head (a pipelined next request) stays in `unread`. A new line is looked for only in
/// the bytes just read, so a head sent a byte at a time costs a scan of each byte, and a
/// parse per line, not per byte. Where the head ends is httparse's answer, the same parser
/// (and rules: bare LF, header count) that hyper reads every other request with.
pub(super) async fn read_head(
    stream: &mut TcpStream,
    unread: &mut Vec<u8>,
    wait: Duration,
) -> Result<Option<Head>, Refused> {
    let read = async {
        // Bytes of `unread` known to end no line.
        let mut scanned = 0;
        loop {
            match super::held(unread) {
                Some(false) => return Ok(None),
                Some(true) if unread[scanned..].contains(&b'\n') => {
                    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let mut request = httparse::Request::new(&mut headers);
                    match request.parse(unread) {
                        Ok(httparse::Status::Complete(length)) if length <= MAX_HEAD => {
                            let built = build(&request).map_err(Refused::Bad)?;
                            unread.drain(..length);
                            if unread.is_empty() {
                                // Nothing kept while the request is held.
                                *unread = Vec::new();
                            }
                            return Ok(Some(built));
                        }
                        Ok(httparse::Status::Complete(_) | httparse::Status::Partial) => {}
                        Err(httparse::Error::TooManyHeaders) => {
                            return Err(Refused::Bad("the request has more than 64 headers"));
                        }
                        Err(_) => return Err(Refused::Bad(MALFORMED)),
                    }
                }
                // Undecided yet, or no line ended since the last parse.
                _ => {}
            }
            if unread.len() > MAX_HEAD {
                return Err(Refused::Bad("the request head is larger than 24 KiB"));
            }
            scanned = unread.len();
            unread.reserve(READ_ROOM);
            match stream.read_buf(unread).await {
                Ok(0) | Err(_) => return Err(Refused::Gone),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(wait, read)
        .await
        .map_err(|_| Refused::Gone)?
}

/// Room made for each read of a head: more than most heads (a long-poll's is a few
/// hundred bytes), so that one read takes it whole and leaves the socket known drained.
const READ_ROOM: usize = 2048;

const MALFORMED: &str = "malformed request head";

/// A whole head's bytes as a request, or why it cannot be served here.
#[cfg(test)]
fn parse(head: &[u8]) -> Result<Head, &'static str> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    if !parsed.parse(head).map_err(|_| MALFORMED)?.is_complete() {
        return Err(MALFORMED);
    }
    build(&parsed)
}

/// A parsed head as a request, or why it cannot be served here.
fn build(parsed: &httparse::Request<'_, '_>) -> Result<Head, &'static str> {
    let version = match parsed.version {
        Some(1) => http::Version::HTTP_11,
        _ => http::Version::HTTP_10,
    };
    let mut builder = http::Request::builder()
        .method(parsed.method.ok_or(MALFORMED)?)
        .uri(parsed.path.ok_or(MALFORMED)?)
        .version(version);
    let mut keep_alive = version == http::Version::HTTP_11;
    for h in parsed.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        match name.as_str() {
            // A stream's GET has no body, and there is no framing here to skip one.
            "content-length" if h.value != b"0" => return Err(NO_BODY),
            "transfer-encoding" => return Err(NO_BODY),
            "connection" => {
                let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
                if v.split(',').any(|t| t.trim() == "close") {
                    keep_alive = false;
                } else if v.split(',').any(|t| t.trim() == "keep-alive") {
                    keep_alive = true;
                }
            }
            _ => {}
        }
        builder = builder.header(h.name, h.value);
    }
    Ok(Head {
        request: builder.body(Body::empty()).map_err(|_| MALFORMED)?,
        keep_alive,
        version,
    })
}

const NO_BODY: &str = "a stream's request takes no body";

/// Answers 400 with why (as the API's errors are: `{"error": {"code": 107, …}}`).
pub(super) async fn refuse(stream: &mut TcpStream, why: &str, wait: Duration) {
    use herald_protocol::{json::Json, Codec, ErrorCode, Reply};
    let body = Json.reply(&Reply::error(None, ErrorCode::BadRequest, why));
    let mut answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    write(stream, &answer, wait).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_head_and_its_keep_alive() {
        let h = parse(
            b"GET /connection/sse?channel=a HTTP/1.1\r\nHost: x\r\nLast-Event-ID: a;b;1\r\n\r\n",
        )
        .unwrap();
        assert!(h.keep_alive);
        assert_eq!(h.request.uri().query(), Some("channel=a"));
        assert_eq!(h.request.headers()["last-event-id"], "a;b;1");
        let h = parse(b"GET /connection/sse HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        let h = parse(b"GET /connection/sse HTTP/1.0\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        assert_eq!(
            parse(b"GET /connection/sse HTTP/1.1\r\nContent-Length: 5\r\n\r\n").err(),
            Some(NO_BODY)
        );
        assert_eq!(
            parse(b"GET /connection/sse HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").err(),
            Some(NO_BODY)
        );
        assert_eq!(
            parse(b"GET \x01 HTTP/9\r\n\r\n").err(),
            Some("malformed request head")
        );
    }
}

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

/// Reads one request head (and nothing after it).
///
/// What has arrived is peeked, and taken only as far as it belongs to the head: all of it
/// while the head is not whole, exactly the head once it is (what follows is the next
/// request's). Taking what was peeked empties the socket's buffer, so the next peek waits
/// for new bytes: a head that trickles in, or stops halfway, costs a wake-up per arrival
/// and nothing while it waits. Where the head ends is httparse's answer, the same parser
/// (and rules: bare LF, header count) that hyper reads every other request with.
pub(super) async fn read_head(stream: &mut TcpStream, wait: Duration) -> Result<Head, Refused> {
    let read = async {
        let mut head: Vec<u8> = Vec::with_capacity(1024);
        let mut chunk = vec![0u8; 4096];
        loop {
            let n = stream.peek(&mut chunk).await.map_err(|_| Refused::Gone)?;
            if n == 0 {
                return Err(Refused::Gone);
            }
            let before = head.len();
            head.extend_from_slice(&chunk[..n]);
            // A head can only end (or grow a header too many) at a line's end: bytes
            // without one are taken without parsing again what came before, so a head sent
            // a byte at a time costs a scan of each byte, not of the whole head each time.
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut request = httparse::Request::new(&mut headers);
            let parsed = if chunk[..n].contains(&b'\n') {
                request.parse(&head)
            } else {
                Ok(httparse::Status::Partial)
            };
            // Once whole, the head is built from this very parse (it is not parsed again).
            let (length, built) = match parsed {
                Ok(httparse::Status::Complete(length)) if length > before => {
                    (length, Some(build(&request)))
                }
                Ok(httparse::Status::Partial) => (head.len(), None),
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(Refused::Bad("the request has more than 64 headers"));
                }
                _ => return Err(Refused::Bad(MALFORMED)),
            };
            if length > MAX_HEAD {
                return Err(Refused::Bad("the request head is larger than 24 KiB"));
            }
            // Take what belongs to the head, no more.
            stream
                .read_exact(&mut chunk[..length - before])
                .await
                .map_err(|_| Refused::Gone)?;
            if let Some(built) = built {
                return built.map_err(Refused::Bad);
            }
        }
    };
    tokio::time::timeout(wait, read)
        .await
        .map_err(|_| Refused::Gone)?
}

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
    let body =
        herald_protocol::json::encode_error(None, herald_protocol::ErrorCode::BadRequest, why);
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

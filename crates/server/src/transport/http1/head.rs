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
    /// The length of the body that follows (`content-length`): none for a held request,
    /// which takes none.
    pub(super) body: Option<usize>,
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
            match super::lean(unread) {
                Some(false) => return Ok(None),
                Some(true) if unread[scanned..].contains(&b'\n') => {
                    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let mut request = httparse::Request::new(&mut headers);
                    match request.parse(unread) {
                        Ok(httparse::Status::Complete(length)) if length <= MAX_HEAD => {
                            let Some(built) = build(&request).map_err(Refused::Bad)? else {
                                return Ok(None);
                            };
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
                // A held request carries no more; a publication may (hyper reads larger
                // heads), so it goes there.
                if unread.starts_with(b"POST ") {
                    return Ok(None);
                }
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

/// A whole head's bytes as a request (`None`: for hyper), or why it cannot be served here.
#[cfg(test)]
fn parse(head: &[u8]) -> Result<Option<Head>, &'static str> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    if !parsed.parse(head).map_err(|_| MALFORMED)?.is_complete() {
        return Err(MALFORMED);
    }
    build(&parsed)
}

/// The longest body read here (a publication's request): longer ones, which the API takes
/// up to its own limit, go to hyper.
pub(super) const MAX_BODY: usize = 64 * 1024;

/// A parsed head as a request, `None` when it is one for hyper after all, or why it cannot
/// be served here.
///
/// A held request (a GET) takes no body. A POST's body must be framed by one
/// `content-length` of at most [`MAX_BODY`]: anything else about its framing (chunks, `expect:
/// 100-continue`, several lengths) is hyper's to read, by its rules.
fn build(parsed: &httparse::Request<'_, '_>) -> Result<Option<Head>, &'static str> {
    let version = match parsed.version {
        Some(1) => http::Version::HTTP_11,
        _ => http::Version::HTTP_10,
    };
    let method = parsed.method.ok_or(MALFORMED)?;
    let takes_body = method == "POST";
    let mut builder = http::Request::builder()
        .method(method)
        .uri(parsed.path.ok_or(MALFORMED)?)
        .version(version);
    let mut keep_alive = version == http::Version::HTTP_11;
    let mut body = None;
    for h in parsed.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        match name.as_str() {
            // Chunks and `100 Continue` are hyper's to read.
            "transfer-encoding" | "expect" if takes_body => return Ok(None),
            // One plain length, as hyper would read it; several, or one too large, for hyper.
            "content-length" if takes_body => match (body, plain_length(h.value)) {
                (None, Some(n)) if n <= MAX_BODY => body = Some(n),
                _ => return Ok(None),
            },
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
    if takes_body && body.is_none() {
        return Ok(None);
    }
    Ok(Some(Head {
        request: builder.body(Body::empty()).map_err(|_| MALFORMED)?,
        keep_alive,
        version,
        body,
    }))
}

const NO_BODY: &str = "a stream's request takes no body";

/// A `content-length` of digits only.
fn plain_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Answers 400 with why (as the API's errors are: `{"error": {"code": 107, …}}`).
pub(super) async fn refuse(stream: &mut TcpStream, why: &str, wait: Duration) {
    use herald_protocol::{json::Json, Codec, ErrorCode, Reply};
    let body = Json.reply(&Reply::error(None, ErrorCode::BadRequest, why));
    let mut answer = b"HTTP/1.1 400 Bad Request\r\n".to_vec();
    crate::transport::date::write_header(&mut answer);
    answer.extend_from_slice(
        format!(
            "content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
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
        .unwrap()
        .unwrap();
        assert!(h.keep_alive);
        assert_eq!(h.request.uri().query(), Some("channel=a"));
        assert_eq!(h.request.headers()["last-event-id"], "a;b;1");
        let h = parse(b"GET /connection/sse HTTP/1.1\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let h = parse(b"GET /connection/sse HTTP/1.0\r\n\r\n")
            .unwrap()
            .unwrap();
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

    #[test]
    fn a_post_is_read_here_only_with_one_plain_length() {
        let post = |headers: &str| {
            parse(format!("POST /api/publish HTTP/1.1\r\nHost: x\r\n{headers}\r\n").as_bytes())
                .unwrap()
                .map(|h| h.body)
        };
        assert_eq!(post("Content-Length: 24\r\n"), Some(Some(24)));
        assert_eq!(post("content-length: 0\r\n"), Some(Some(0)));
        assert_eq!(
            post(&format!("Content-Length: {MAX_BODY}\r\n")),
            Some(Some(MAX_BODY))
        );
        // Everything else about a body's framing is hyper's to read.
        for hyper in [
            String::new(),
            format!("Content-Length: {}\r\n", MAX_BODY + 1),
            "Content-Length: 2\r\nContent-Length: 2\r\n".into(),
            "Content-Length: +2\r\n".into(),
            "Content-Length: 2, 2\r\n".into(),
            "Content-Length: 99999999999999999999999\r\n".into(),
            "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n".into(),
            "Transfer-Encoding: chunked\r\n".into(),
            "Content-Length: 2\r\nExpect: 100-continue\r\n".into(),
        ] {
            assert_eq!(post(&hyper), None, "{hyper:?}");
        }
    }
}

//! The `websocket` target: the bytes a WebSocket client sends after its handshake, read by
//! Herald's own frame reader with permessage-deflate on (plain, fragmented, compressed,
//! compressed and fragmented, control frames between fragments, closes), the offer a
//! handshake's `Sec-WebSocket-Extensions` header makes, and publications' compressed pieces
//! joined into one message.
//!
//! Besides "no panic", the reader must not depend on how the bytes arrive: the input is
//! read whole and again in pieces cut where its own bytes say, and both reads must give
//! the same messages and the same refusal.

use herald_server::transport::websocket::{
    deflate,
    frames::{opcode, write_client_frame, Incoming, Reader, Violation},
};

use crate::decoder::Decoder;

/// The message limit the target reads with: small, so that inputs reach it.
const LIMIT: usize = 4096;

/// A client's frame, masked as clients must.
fn client(fin: bool, rsv1: bool, op: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_client_frame(&mut out, (fin, rsv1, op), payload, [0x12, 0x34, 0x56, 0x78]);
    out
}

/// Valid client byte streams, and offers.
pub fn corpus() -> Vec<Vec<u8>> {
    let command = br#"{"id":1,"subscribe":{"channel":"chat:lobby"}}"#;
    let long = br#"{"id":2,"publish":{"channel":"chat:lobby","data":{"text":"hello hello hello hello hello"}}}"#;
    let compressed = deflate::compress(long);
    let (a, b) = compressed.split_at(compressed.len() / 2);
    vec![
        client(true, false, opcode::TEXT, command),
        client(true, true, opcode::TEXT, &compressed),
        [
            client(false, true, opcode::TEXT, a),
            client(true, false, opcode::PING, b"ping"),
            client(true, false, opcode::CONTINUATION, b),
        ]
        .concat(),
        [
            client(false, false, opcode::BINARY, &command[..10]),
            client(true, false, opcode::PONG, b""),
            client(true, false, opcode::CONTINUATION, &command[10..]),
            client(true, false, opcode::CLOSE, b"\x03\xe8bye"),
        ]
        .concat(),
        client(true, true, opcode::TEXT, &deflate::compress(&[b'a'; 100_000])),
        b"permessage-deflate; client_max_window_bits, permessage-deflate; server_max_window_bits=15".to_vec(),
    ]
}

/// Everything a reader takes out of `chunks`, fed one after another, until it refuses.
fn read(chunks: impl Iterator<Item = Vec<u8>>) -> (Vec<Incoming>, Option<Violation>) {
    let mut reader = Reader::new(LIMIT, true);
    let (mut buf, mut got) = (Vec::new(), Vec::new());
    for chunk in chunks {
        buf.extend_from_slice(&chunk);
        loop {
            let _ = reader.wants(&buf);
            match reader.read(&mut buf) {
                Ok(Some(incoming)) => got.push(incoming),
                Ok(None) => break,
                Err(v) => return (got, Some(v)),
            }
        }
    }
    (got, None)
}

pub fn decoder() -> Decoder {
    Box::new(|input| {
        let whole = read(std::iter::once(input.to_vec()));
        // Pieces as long as the input's own bytes say (1 to 16).
        let mut rest = input;
        let pieces = std::iter::from_fn(|| {
            let (&first, _) = rest.split_first()?;
            let n = (usize::from(first) % 16 + 1).min(rest.len());
            let (piece, after) = rest.split_at(n);
            rest = after;
            Some(piece.to_vec())
        });
        let pieced = read(pieces);
        assert_eq!(
            whole, pieced,
            "the reader's result depends on how the bytes arrive"
        );
        // The same bytes as an offer, and inflated as a message's payload.
        let _ = deflate::negotiate(std::iter::once(&*String::from_utf8_lossy(input)));
        if let Ok(inflated) = deflate::inflate(input, LIMIT) {
            assert!(inflated.len() <= LIMIT, "inflated past the limit");
        }
        // As lines compressed apart and joined (a batch of publications' shared pieces),
        // which must inflate to the lines joined by newlines.
        if input.len() <= LIMIT / 2 {
            let lines: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
            let mut joined = Vec::new();
            for line in &lines {
                deflate::join(&mut joined, &deflate::compress(line));
            }
            let inflated = deflate::inflate(&deflate::finish(joined), LIMIT);
            assert_eq!(
                inflated.as_deref(),
                Ok(input),
                "joined pieces inflate to the lines"
            );
        }
    })
}

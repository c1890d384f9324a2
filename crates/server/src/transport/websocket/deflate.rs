//! permessage-deflate (RFC 7692): the offer a client makes, the answer Herald gives, and
//! the compression of one message.
//!
//! Herald always answers with `server_no_context_takeover` and `client_no_context_takeover`:
//! every message is compressed on its own, by both sides. That is what lets the hub
//! compress a publication once and write the same bytes to every subscriber (a window
//! carried from message to message would differ per connection), and what leaves a
//! connection no deflate state of its own: a compressor and an inflater per thread serve
//! every connection, reset for each message. The cost is ratio on very small messages,
//! which is why frames under `websocket.compression_min_size` go uncompressed.

use std::cell::RefCell;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::frames::Violation;

/// The answer to an accepted offer: no context kept on either side.
pub const ANSWER: &str =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// The answer to an accepted offer that named `server_max_window_bits=15` (the offer must
/// then be answered with it).
pub const ANSWER_WITH_WINDOW: &str = "permessage-deflate; server_no_context_takeover; \
                                      client_no_context_takeover; server_max_window_bits=15";

/// The deflate level publications are compressed at: they are compressed once for every
/// subscriber, so a better ratio is cheap; 6 is zlib's default balance.
const LEVEL: u32 = 6;

/// The answer to a `Sec-WebSocket-Extensions` offer (every occurrence of the header, in
/// order): the first permessage-deflate offer Herald can take, or `None` to decline.
///
/// An offer is declined when it is malformed (an unknown or repeated parameter, a value
/// out of range) or when it limits the server's window below 15 bits, since a publication
/// is compressed once, with one window, for every subscriber.
pub fn negotiate<'h>(offers: impl Iterator<Item = &'h str>) -> Option<&'static str> {
    offers
        .flat_map(|header| header.split(','))
        .find_map(|offer| accept(offer.trim()))
}

/// Herald's answer to one offer, if it takes it.
fn accept(offer: &str) -> Option<&'static str> {
    let mut params = offer.split(';').map(str::trim);
    if !params.next()?.eq_ignore_ascii_case("permessage-deflate") {
        return None;
    }
    let mut seen = [false; 4];
    let mut window_named = false;
    for param in params {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (param, None),
        };
        let index = [
            "server_no_context_takeover",
            "client_no_context_takeover",
            "server_max_window_bits",
            "client_max_window_bits",
        ]
        .iter()
        .position(|known| name.eq_ignore_ascii_case(known))?;
        if std::mem::replace(&mut seen[index], true) {
            return None;
        }
        let bits = |v: &str| v.parse::<u8>().ok().filter(|b| (8..=15).contains(b));
        match (index, value) {
            (0 | 1, None) => {}
            // Herald compresses with a 15-bit window only.
            (2, Some(v)) if bits(v) == Some(15) => window_named = true,
            // The client's own window: any size inflates with Herald's 15 bits.
            (3, None) => {}
            (3, Some(v)) if bits(v).is_some() => {}
            _ => return None,
        }
    }
    Some(if window_named {
        ANSWER_WITH_WINDOW
    } else {
        ANSWER
    })
}

thread_local! {
    static COMPRESSOR: RefCell<Compress> = RefCell::new(Compress::new(Compression::new(LEVEL), false));
    static INFLATER: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

/// `message` compressed as RFC 7692 sends it: raw deflate, flushed, without the final
/// `00 00 FF FF` (the receiver puts it back).
pub fn compress(message: &[u8]) -> Vec<u8> {
    COMPRESSOR.with_borrow_mut(|c| {
        c.reset();
        let mut out = Vec::with_capacity(message.len() / 2 + 64);
        loop {
            let read = c.total_in() as usize;
            c.compress_vec(&message[read..], &mut out, FlushCompress::Sync)
                .expect("deflating into a Vec cannot fail");
            let done = c.total_in() as usize == message.len() && out.ends_with(TAIL);
            if done && out.len() < out.capacity() {
                break;
            }
            out.reserve(out.len().max(64));
        }
        out.truncate(out.len() - TAIL.len());
        out
    })
}

/// Adds a message compressed on its own (`payload`, as [`compress`] gives it) to `joined`,
/// one message being made of several such, a newline between each: pieces compressed
/// apart, each ending in a sync flush, follow each other in one deflate stream (each is
/// whole blocks, byte-aligned at its end, and refers to nothing before it), so a batch of
/// publications compressed once each is one message without compressing anything again.
pub fn join(joined: &mut Vec<u8>, payload: &[u8]) {
    static NEWLINE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    if !joined.is_empty() {
        joined.extend_from_slice(NEWLINE.get_or_init(|| [&compress(b"\n")[..], TAIL].concat()));
    }
    joined.extend_from_slice(payload);
    joined.extend_from_slice(TAIL);
}

/// The payload of a message [`join`] made: the last tail left off, as RFC 7692 sends it.
pub fn finish(mut joined: Vec<u8>) -> Vec<u8> {
    joined.truncate(joined.len().saturating_sub(TAIL.len()));
    joined
}

/// What a sync flush ends with, which RFC 7692 §7.2.1 leaves off the wire.
const TAIL: &[u8] = &[0x00, 0x00, 0xFF, 0xFF];

/// Inflates one compressed message, stopping as soon as it passes `limit` bytes: a small
/// message that inflates to gigabytes costs at most `limit` bytes and their time.
pub fn inflate(compressed: &[u8], limit: usize) -> Result<Vec<u8>, Violation> {
    INFLATER.with_borrow_mut(|d| {
        d.reset(false);
        let mut out = Vec::with_capacity((compressed.len() * 4).max(64).min(limit + 1));
        // The message, then the tail the sender left off.
        for input in [compressed, TAIL] {
            let start = d.total_in();
            loop {
                let read = (d.total_in() - start) as usize;
                if out.len() == out.capacity() {
                    if out.len() > limit {
                        return Err(Violation::InflatesTooLarge { limit });
                    }
                    let more = out.len().max(64).min(limit + 1 - out.len());
                    out.reserve_exact(more);
                }
                let status = d
                    .decompress_vec(&input[read..], &mut out, FlushDecompress::Sync)
                    .map_err(|_| Violation::Protocol("compressed message is not valid deflate"))?;
                if out.len() > limit {
                    return Err(Violation::InflatesTooLarge { limit });
                }
                let read = (d.total_in() - start) as usize;
                match status {
                    // A sender may end a message with a final block; the rest is ignored.
                    Status::StreamEnd => return Ok(out),
                    _ if read == input.len() && out.len() < out.capacity() => break,
                    Status::BufError if out.len() < out.capacity() => {
                        return Err(Violation::Protocol("compressed message is truncated"))
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_what_browsers_and_ws_offer() {
        // Chromium and Firefox.
        let browser = "permessage-deflate; client_max_window_bits";
        assert_eq!(negotiate([browser].into_iter()), Some(ANSWER));
        // The ws npm client's default.
        let ws = "permessage-deflate; client_max_window_bits";
        assert_eq!(negotiate([ws].into_iter()), Some(ANSWER));
        let full = "permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
                    server_max_window_bits=15; client_max_window_bits=10";
        assert_eq!(negotiate([full].into_iter()), Some(ANSWER_WITH_WINDOW));
        assert_eq!(
            negotiate(["x-webkit-deflate-frame", "PerMessage-Deflate"].into_iter()),
            Some(ANSWER)
        );
    }

    #[test]
    fn declines_offers_it_cannot_honour_and_takes_the_next() {
        for bad in [
            "permessage-deflate; server_max_window_bits=10",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; client_max_window_bits=16",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
            "permessage-deflate; unknown",
            "deflate-frame",
            "",
        ] {
            assert_eq!(negotiate([bad].into_iter()), None, "{bad}");
        }
        let second = "permessage-deflate; server_max_window_bits=9, permessage-deflate";
        assert_eq!(negotiate([second].into_iter()), Some(ANSWER));
    }

    #[test]
    fn the_rfc_example_compresses_to_its_bytes() {
        // RFC 7692 §7.2.3.1: "Hello" with no context takeover.
        assert_eq!(
            compress(b"Hello"),
            [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]
        );
        assert_eq!(
            inflate(&[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], 100).unwrap(),
            b"Hello"
        );
    }

    #[test]
    fn compresses_and_inflates_back_every_size() {
        for size in [0, 1, 100, 4095, 70_000, 300_000] {
            let text: Vec<u8> = (0..size).map(|i| b"{\"ab\":12}"[i % 9]).collect();
            let c = compress(&text);
            assert!(!c.ends_with(TAIL), "{size}");
            assert_eq!(inflate(&c, size).unwrap(), text, "{size}");
        }
    }

    #[test]
    fn pieces_compressed_apart_inflate_as_one_message_with_newlines() {
        let parts: Vec<Vec<u8>> = (0..5)
            .map(|i| {
                format!(
                    "{{\"pub\":{{\"offset\":{i},\"data\":\"{}\"}}}}",
                    "ab".repeat(i * 50)
                )
                .into_bytes()
            })
            .collect();
        let mut joined = Vec::new();
        for part in &parts {
            join(&mut joined, &compress(part));
        }
        let whole = finish(joined);
        assert_eq!(inflate(&whole, 100_000).unwrap(), parts.join(&b'\n'));
        // One piece alone is the piece.
        let mut one = Vec::new();
        join(&mut one, &compress(&parts[3]));
        assert_eq!(finish(one), compress(&parts[3]));
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        let bomb = compress(&vec![0u8; 10 << 20]);
        assert!(bomb.len() < 20_000, "{}", bomb.len());
        assert_eq!(
            inflate(&bomb, 65_536),
            Err(Violation::InflatesTooLarge { limit: 65_536 })
        );
        // Exactly at the limit is fine.
        let exact = compress(&vec![7u8; 65_536]);
        assert_eq!(inflate(&exact, 65_536).unwrap().len(), 65_536);
    }

    #[test]
    fn garbage_and_truncated_input_are_refused_not_panicked_on() {
        assert!(matches!(
            inflate(&[0xff, 0xff, 0xff], 1000),
            Err(Violation::Protocol(_))
        ));
        let whole = compress(
            &(0..5000u32)
                .flat_map(|i| i.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        for cut in [1, whole.len() / 2, whole.len() - 1] {
            // A cut message either inflates to less or is refused; never a panic.
            let _ = inflate(&whole[..cut], 100_000);
        }
        // A message that ends with a final block (BFINAL) is taken as it is.
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), Compression::fast());
        std::io::Write::write_all(&mut z, b"final block").unwrap();
        let finished = z.finish().unwrap();
        assert_eq!(inflate(&finished, 100).unwrap(), b"final block");
    }
}

//! RFC 6455 frames, as a server reads and writes them, with RFC 7692's compressed
//! messages (permessage-deflate).
//!
//! Herald owns this reader (instead of tungstenite's) because tungstenite refuses every
//! frame with RSV1 set, which is how a browser marks the compressed messages it sends once
//! deflate is negotiated. The reader is sans-IO: the connection feeds it what the socket
//! gave, it takes whole frames out, so it is the same code under the fuzzer (`herald-fuzz`,
//! target `websocket`) and under the server.
//!
//! What it enforces (each rule has a test below): client frames masked; RSV2/RSV3 never
//! set, RSV1 only on a data message's first frame and only with deflate; no unknown
//! opcodes; control frames final, at most 125 bytes, interleaved anywhere in a fragmented
//! message; continuation only inside a message and a new message only outside one; a
//! message (compressed or inflated) no larger than the limit, refused from its header
//! before its bytes are buffered; text valid UTF-8; close frames with a valid code and a
//! UTF-8 reason.

use bytes::Bytes;

use super::deflate;

/// Frame opcodes (RFC 6455 §5.2).
pub mod opcode {
    /// Continues a fragmented message.
    pub const CONTINUATION: u8 = 0x0;
    /// A text message (UTF-8).
    pub const TEXT: u8 = 0x1;
    /// A binary message.
    pub const BINARY: u8 = 0x2;
    /// Closes the connection.
    pub const CLOSE: u8 = 0x8;
    /// Asks for a pong.
    pub const PING: u8 = 0x9;
    /// Answers a ping.
    pub const PONG: u8 = 0xA;
}

/// What a client sent: a whole message, or a control frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A text message (inflated, valid UTF-8).
    Text(Bytes),
    /// A binary message (inflated).
    Binary(Bytes),
    /// A ping, to be answered with a pong carrying the same payload.
    Ping(Bytes),
    /// A pong.
    Pong(Bytes),
    /// A close, with its code and reason if it carried one.
    Close(Option<(u16, String)>),
}

/// Why the reader refuses what a client sent: the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Breaks RFC 6455 or RFC 7692 (close 1002, or Herald's "bad request").
    Protocol(&'static str),
    /// A text message or close reason that is not UTF-8 (close 1007).
    NotUtf8,
    /// A message larger than the limit, as its frames announce it (Herald's
    /// "message too large"): `size` bytes so far, of at most `limit`.
    TooLarge {
        /// Bytes the message would have.
        size: u64,
        /// The limit.
        limit: usize,
    },
    /// A compressed message whose inflated size passes the limit (close 1009): the size is
    /// known only while inflating, which stops there.
    InflatesTooLarge {
        /// The limit.
        limit: usize,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::Protocol(what) => f.write_str(what),
            Violation::NotUtf8 => f.write_str("text frame is not valid UTF-8"),
            Violation::TooLarge { size, limit } => write!(
                f,
                "message of {size} bytes is larger than the limit of {limit}"
            ),
            Violation::InflatesTooLarge { limit } => write!(
                f,
                "compressed message inflates past the limit of {limit} bytes"
            ),
        }
    }
}

/// The reader of one connection's frames.
#[derive(Debug)]
pub struct Reader {
    /// Largest message (and so frame) a client may send, compressed or inflated.
    limit: usize,
    /// Whether permessage-deflate was negotiated: RSV1 marks a compressed message.
    deflate: bool,
    /// A fragmented message being put together (boxed: most connections never get one).
    partial: Option<Box<Partial>>,
    /// Where the next frame starts in the caller's buffer: frames taken out are removed
    /// once per batch (when more bytes are needed), not one by one.
    at: usize,
    /// The bytes the compressed message the last read returned inflated to (a read
    /// returns one message at most): what the connection charges it
    /// ([`Reader::take_inflated`]).
    inflated: Option<usize>,
}

#[derive(Debug)]
struct Partial {
    text: bool,
    compressed: bool,
    data: Vec<u8>,
    /// When its first frame was read.
    begun: std::time::Instant,
}

/// A frame's header, once its bytes are in.
struct Header {
    fin: bool,
    rsv1: bool,
    opcode: u8,
    mask: [u8; 4],
    /// Header bytes, mask included.
    len: usize,
    payload: u64,
}

impl Reader {
    /// A reader of messages of at most `limit` bytes, compressed ones if `deflate`.
    pub fn new(limit: usize, deflate: bool) -> Self {
        Self {
            limit,
            deflate,
            partial: None,
            at: 0,
            inflated: None,
        }
    }

    /// The bytes the compressed message of the last read inflated to, if it had one.
    pub fn take_inflated(&mut self) -> Option<usize> {
        self.inflated.take()
    }

    /// The largest message it reads.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// When the fragmented message begun and not finished yet, if any, began.
    pub fn unfinished_since(&self) -> Option<std::time::Instant> {
        self.partial.as_ref().map(|p| p.begun)
    }

    /// Takes the next message or control frame out of `buf` (what the client sent, in
    /// order; the caller only appends to it); `Ok(None)` when `buf` holds no whole one yet.
    /// The frames taken leave `buf` at once when they were all of it, else when `None`
    /// says more is needed: a read of many frames moves its bytes once.
    pub fn read(&mut self, buf: &mut Vec<u8>) -> Result<Option<Incoming>, Violation> {
        let mut used = self.at;
        let read = loop {
            let Some(header) = self.header(&buf[used..])? else {
                break None;
            };
            let end = header.len as u64 + header.payload;
            if ((buf.len() - used) as u64) < end {
                break None;
            }
            let start = used + header.len;
            used += end as usize;
            let payload = &mut buf[start..used];
            unmask(payload, header.mask);
            if let Some(incoming) = self.frame(&header, payload)? {
                break Some(incoming);
            }
        };
        if used == buf.len() {
            buf.clear();
            self.at = 0;
        } else if read.is_none() {
            buf.drain(..used);
            self.at = 0;
        } else {
            self.at = used;
        }
        Ok(read)
    }

    /// How many more bytes the next frame in `buf` needs (at least 1): a buffer can be
    /// grown once for a large frame.
    pub fn wants(&self, buf: &[u8]) -> usize {
        let buf = &buf[self.at.min(buf.len())..];
        match self.header(buf) {
            Ok(Some(h)) => (h.len + h.payload as usize)
                .saturating_sub(buf.len())
                .max(1),
            _ => 1,
        }
    }

    /// The header at the start of `buf`, once it is whole; refused as soon as it breaks a
    /// rule.
    fn header(&self, buf: &[u8]) -> Result<Option<Header>, Violation> {
        let [b0, b1, ..] = *buf else {
            return Ok(None);
        };
        let (fin, rsv1, opcode) = (b0 & 0x80 != 0, b0 & 0x40 != 0, b0 & 0x0F);
        if b0 & 0x30 != 0 {
            return Err(Violation::Protocol("reserved bits RSV2/RSV3 set"));
        }
        if b1 & 0x80 == 0 {
            return Err(Violation::Protocol("client frames must be masked"));
        }
        let control = opcode >= opcode::CLOSE;
        match opcode {
            opcode::CONTINUATION | opcode::TEXT | opcode::BINARY => {}
            opcode::CLOSE | opcode::PING | opcode::PONG => {}
            _ => return Err(Violation::Protocol("unknown opcode")),
        }
        if control && !fin {
            return Err(Violation::Protocol("control frames must not be fragmented"));
        }
        if rsv1 && (control || opcode == opcode::CONTINUATION || !self.deflate) {
            return Err(Violation::Protocol(
                "RSV1 set outside the first frame of a compressed message",
            ));
        }
        let (length_bytes, short) = match b1 & 0x7F {
            126 => (2, None),
            127 => (8, None),
            n => (0, Some(u64::from(n))),
        };
        if control && short.is_none_or(|n| n > 125) {
            return Err(Violation::Protocol(
                "control frames carry at most 125 bytes",
            ));
        }
        let len = 2 + length_bytes + 4;
        if buf.len() < 2 + length_bytes {
            return Ok(None);
        }
        let payload = match short {
            Some(n) => n,
            None => {
                let mut n = 0u64;
                for b in &buf[2..2 + length_bytes] {
                    n = n << 8 | u64::from(*b);
                }
                if n >> 63 != 0 {
                    return Err(Violation::Protocol("frame length has its top bit set"));
                }
                n
            }
        };
        // A message's size so far, this frame included: refused before it is buffered.
        let before = if opcode == opcode::CONTINUATION {
            self.partial.as_ref().map_or(0, |p| p.data.len())
        } else {
            0
        };
        let size = before as u64 + payload;
        if !control && size > self.limit as u64 {
            return Err(Violation::TooLarge {
                size,
                limit: self.limit,
            });
        }
        let Some(mask) = buf.get(len - 4..len) else {
            return Ok(None);
        };
        Ok(Some(Header {
            fin,
            rsv1,
            opcode,
            mask: mask.try_into().expect("four bytes"),
            len,
            payload,
        }))
    }

    /// Takes one whole frame's (unmasked) payload: what it completes, if anything.
    fn frame(&mut self, h: &Header, payload: &[u8]) -> Result<Option<Incoming>, Violation> {
        match h.opcode {
            opcode::PING => Ok(Some(Incoming::Ping(Bytes::copy_from_slice(payload)))),
            opcode::PONG => Ok(Some(Incoming::Pong(Bytes::copy_from_slice(payload)))),
            opcode::CLOSE => close(payload).map(|c| Some(Incoming::Close(c))),
            opcode::CONTINUATION => {
                let Some(partial) = self.partial.as_mut() else {
                    return Err(Violation::Protocol("continuation frame outside a message"));
                };
                partial.data.extend_from_slice(payload);
                if !h.fin {
                    return Ok(None);
                }
                let Partial {
                    text,
                    compressed,
                    data,
                    ..
                } = *self.partial.take().expect("checked above");
                self.message(text, compressed, &data).map(Some)
            }
            _ => {
                if self.partial.is_some() {
                    return Err(Violation::Protocol(
                        "new message before the last one's final frame",
                    ));
                }
                let text = h.opcode == opcode::TEXT;
                if h.fin {
                    return self.message(text, h.rsv1, payload).map(Some);
                }
                self.partial = Some(Box::new(Partial {
                    text,
                    compressed: h.rsv1,
                    data: payload.to_vec(),
                    begun: std::time::Instant::now(),
                }));
                Ok(None)
            }
        }
    }

    /// A whole message's payload, inflated if `compressed`.
    fn message(
        &mut self,
        text: bool,
        compressed: bool,
        data: &[u8],
    ) -> Result<Incoming, Violation> {
        let data = if compressed {
            let inflated = deflate::inflate(data, self.limit);
            let size = inflated.as_ref().map_or(self.limit, Vec::len);
            self.inflated = Some(size);
            Bytes::from(inflated?)
        } else {
            Bytes::copy_from_slice(data)
        };
        if !text {
            return Ok(Incoming::Binary(data));
        }
        if std::str::from_utf8(&data).is_err() {
            return Err(Violation::NotUtf8);
        }
        Ok(Incoming::Text(data))
    }
}

/// A close frame's code and reason (RFC 6455 §5.5.1, §7.4).
fn close(payload: &[u8]) -> Result<Option<(u16, String)>, Violation> {
    match payload {
        [] => Ok(None),
        [_] => Err(Violation::Protocol("close frame with a one-byte payload")),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            if !valid_close_code(code) {
                return Err(Violation::Protocol("invalid close code"));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| Violation::NotUtf8)?;
            Ok(Some((code, reason.to_owned())))
        }
    }
}

/// Whether a peer may send `code` in a close frame: the RFC's own codes that may be sent,
/// and the ranges for libraries (3000–3999) and applications (4000–4999).
pub fn valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// Undoes the client's masking (RFC 6455 §5.3), a word at a time.
fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let mut chunks = payload.chunks_exact_mut(4);
    for chunk in &mut chunks {
        let v = u32::from_ne_bytes(chunk.try_into().expect("four bytes")) ^ word;
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i];
    }
}

/// Appends one unmasked frame (a server's frames are never masked: RFC 6455 §5.1).
/// `compressed` sets RSV1, which only a message's first frame carries.
pub fn write_frame(out: &mut Vec<u8>, fin: bool, compressed: bool, op: u8, payload: &[u8]) {
    let b0 = if fin { 0x80 } else { 0 } | if compressed { 0x40 } else { 0 } | op;
    out.reserve(payload.len() + 10);
    out.push(b0);
    match payload.len() {
        n @ 0..=125 => out.push(n as u8),
        n @ 126..=0xFFFF => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

/// Appends `payload` as one text message (`compressed`: RSV1 on its first frame), in
/// frames of at most [`MAX_FRAGMENT`] bytes (RFC 6455 §5.4): a client may bound the frames
/// it takes (tungstenite does).
pub fn write_message(out: &mut Vec<u8>, payload: &[u8], compressed: bool, binary: bool) {
    let first = if binary { opcode::BINARY } else { opcode::TEXT };
    let (mut at, mut op) = (0, first);
    loop {
        let mut end = (at + MAX_FRAGMENT).min(payload.len());
        // Whole characters in each frame of plain text: some clients check UTF-8 frame by
        // frame. (Compressed bytes are checked once inflated, whole.)
        while !compressed && !binary && !is_char_start(payload, end) {
            end -= 1;
        }
        let last = end == payload.len();
        write_frame(out, last, compressed && at == 0, op, &payload[at..end]);
        if last {
            return;
        }
        (at, op) = (end, opcode::CONTINUATION);
    }
}

/// Whether a character starts at `at` (or the text ends there).
fn is_char_start(text: &[u8], at: usize) -> bool {
    text.get(at).is_none_or(|b| (*b as i8) >= -0x40)
}

/// The largest frame a message is sent in; larger ones are fragmented.
pub const MAX_FRAGMENT: usize = 16 * 1024;

/// The payload of one whole, unmasked frame (as [`write_frame`] makes them).
pub fn payload(frame: &[u8]) -> &[u8] {
    let header = match frame[1] & 0x7F {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    &frame[header..]
}

/// Appends one frame as a client sends it, masked with `mask` (RFC 6455 §5.3): for the
/// tests and the fuzzer, which play the client.
pub fn write_client_frame(
    out: &mut Vec<u8>,
    (fin, compressed, op): (bool, bool, u8),
    payload: &[u8],
    mask: [u8; 4],
) {
    let start = out.len();
    write_frame(out, fin, compressed, op, payload);
    let header = out.len() - payload.len();
    out[start + 1] |= 0x80;
    out.splice(header..header, mask);
    unmask(&mut out[header + 4..], mask);
}

#[cfg(test)]
#[path = "frames_tests.rs"]
mod tests;

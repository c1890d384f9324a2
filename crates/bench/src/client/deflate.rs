//! permessage-deflate for the bench's WebSocket clients (`--deflate`), which tungstenite
//! lacks: the handshake offers it as a browser does, and [`Inflating`] sits between the
//! counted socket and tungstenite, inflating the server's compressed messages into plain
//! frames. The bytes counted on the wire are the compressed ones. Clients send plain
//! frames (a client may: RFC 7692 compresses per message, by choice).

use std::{
    io,
    pin::Pin,
    task::{ready, Context, Poll},
};

use flate2::{Decompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What Chromium and Firefox offer.
pub const OFFER: &str = "permessage-deflate; client_max_window_bits";

/// A socket whose server frames with RSV1 set come out inflated (when `on`; otherwise
/// every byte passes as it came).
pub struct Inflating<S> {
    inner: S,
    on: bool,
    /// The HTTP answer is through (frames follow).
    upgraded: bool,
    /// The server keeps no context between messages (it said `server_no_context_takeover`).
    fresh_each: bool,
    raw: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
    /// A compressed message's opcode and payload so far, while its fragments arrive.
    partial: Option<(u8, Vec<u8>)>,
    inflater: Decompress,
}

impl<S> Inflating<S> {
    pub fn new(inner: S, on: bool) -> Self {
        Self {
            inner,
            on,
            upgraded: false,
            fresh_each: false,
            raw: Vec::new(),
            out: Vec::new(),
            sent: 0,
            partial: None,
            inflater: Decompress::new(false),
        }
    }

    /// Moves whole frames (and the HTTP answer) from `raw` to `out`, inflating.
    fn process(&mut self) -> io::Result<()> {
        if !self.upgraded {
            let Some(end) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                return Ok(());
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).to_ascii_lowercase();
            self.fresh_each = head.contains("server_no_context_takeover");
            self.out.extend(self.raw.drain(..end + 4));
            self.upgraded = true;
        }
        // Frames are taken by position and the buffer drained once: a read holds many.
        let mut at = 0;
        let raw = std::mem::take(&mut self.raw);
        while let Some((header, len)) = frame_at(&raw[at..]) {
            let frame = &raw[at..at + header + len];
            at += header + len;
            let (b0, payload) = (frame[0], &frame[header..]);
            let (fin, rsv1, op) = (b0 & 0x80 != 0, b0 & 0x40 != 0, b0 & 0x0F);
            let continues = op == 0 && self.partial.is_some();
            if !rsv1 && !continues {
                self.out.extend_from_slice(frame);
                continue;
            }
            if fin && !continues {
                // The usual case: a whole compressed message in one frame.
                self.inflate_message(op, &[payload, TAIL])?;
                continue;
            }
            let (op, mut data) = self.partial.take().unwrap_or((op, Vec::new()));
            data.extend_from_slice(payload);
            if !fin {
                self.partial = Some((op, data));
                continue;
            }
            self.inflate_message(op, &[&data, TAIL])?;
        }
        self.raw = raw;
        self.raw.drain(..at);
        Ok(())
    }

    /// Appends the message the compressed `parts` make, as one plain frame.
    fn inflate_message(&mut self, op: u8, parts: &[&[u8]]) -> io::Result<()> {
        if self.fresh_each {
            self.inflater.reset(false);
        }
        // Room for the header, written once the size is known.
        let start = self.out.len();
        self.out.extend_from_slice(&[0; 10]);
        for part in parts {
            let begin = self.inflater.total_in();
            loop {
                let read = (self.inflater.total_in() - begin) as usize;
                self.out.reserve(part.len().max(1024));
                self.inflater
                    .decompress_vec(&part[read..], &mut self.out, FlushDecompress::Sync)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let read = (self.inflater.total_in() - begin) as usize;
                if read == part.len() && self.out.len() < self.out.capacity() {
                    break;
                }
            }
        }
        let len = self.out.len() - start - 10;
        let mut header = Vec::with_capacity(10);
        write_header(&mut header, op, len);
        // Shift the payload left over the unused part of the header's room.
        let gap = 10 - header.len();
        self.out.copy_within(start + 10.., start + header.len());
        self.out.truncate(self.out.len() - gap);
        self.out[start..start + header.len()].copy_from_slice(&header);
        Ok(())
    }
}

/// What a sync flush ends with, which RFC 7692 leaves off the wire.
const TAIL: &[u8] = &[0, 0, 0xFF, 0xFF];

/// The header length and payload length of the whole frame at the start of `buf`.
fn frame_at(buf: &[u8]) -> Option<(usize, usize)> {
    let [_, b1, ..] = *buf else { return None };
    let masked = if b1 & 0x80 != 0 { 4 } else { 0 };
    let (header, len) = match b1 & 0x7F {
        126 => (
            4,
            u16::from_be_bytes(buf.get(2..4)?.try_into().ok()?) as usize,
        ),
        127 => (
            10,
            u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?) as usize,
        ),
        n => (2, n as usize),
    };
    let header = header + masked;
    (buf.len() >= header + len).then_some((header, len))
}

fn write_header(out: &mut Vec<u8>, op: u8, len: usize) {
    out.push(0x80 | op);
    match len {
        0..=125 => out.push(len as u8),
        126..=0xFFFF => {
            out.push(126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Inflating<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.on {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        loop {
            if this.sent < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.sent);
                buf.put_slice(&this.out[this.sent..this.sent + n]);
                this.sent += n;
                if this.sent == this.out.len() {
                    this.out.clear();
                    this.sent = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 4096];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.raw.extend_from_slice(read.filled());
            this.process()?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Inflating<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

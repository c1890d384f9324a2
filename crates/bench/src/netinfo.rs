//! Bytes and packets at the socket: a stream wrapper that counts what passes through it, and
//! the kernel's own per-socket segment counters (TCP_INFO), which count packets without a
//! capture.

use std::{
    io,
    os::fd::AsRawFd,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Totals shared by every connection of a worker.
#[derive(Debug, Default)]
pub struct Wire {
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub packets_in: AtomicU64,
    pub packets_out: AtomicU64,
}

/// A stream that adds what it reads and writes to a [`Wire`], and its TCP segment counts
/// when it is dropped.
pub struct Counted<S: AsRawFd> {
    inner: S,
    wire: Arc<Wire>,
}

impl<S: AsRawFd> Counted<S> {
    pub fn new(inner: S, wire: Arc<Wire>) -> Self {
        Self { inner, wire }
    }
}

impl<S: AsRawFd> Drop for Counted<S> {
    fn drop(&mut self) {
        if let Some((segs_in, segs_out)) = segments(self.inner.as_raw_fd()) {
            self.wire.packets_in.fetch_add(segs_in, Relaxed);
            self.wire.packets_out.fetch_add(segs_out, Relaxed);
        }
    }
}

impl<S: AsyncRead + AsRawFd + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.wire.bytes_in.fetch_add(n as u64, Relaxed);
        r
    }
}

impl<S: AsyncWrite + AsRawFd + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.wire.bytes_out.fetch_add(n as u64, Relaxed);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Lets a socket bound to a source address take its port only at `connect`, chosen for the
/// whole address 4-tuple (`IP_BIND_ADDRESS_NO_PORT`). Without it every bound socket holds a
/// port of its own, so one address serves only ~28,000 connections in all; and with
/// `SO_REUSEADDR` instead, two sockets may pick the same port and collide.
#[allow(unsafe_code)]
pub fn bind_address_no_port(fd: i32) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: passes a pointer to a live c_int and its size, as setsockopt(2) expects.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The start of Linux's `struct tcp_info` (include/uapi/linux/tcp.h) up to the segment
/// counters, which every kernel since 4.2 fills in.
#[repr(C)]
#[derive(Default)]
struct TcpInfoHead {
    bytes: [u8; 8],
    words: [u32; 24],
    pacing: [u64; 2],
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u32,
    segs_in: u32,
}

/// (segments received, segments sent) on a TCP socket, pure ACKs included.
#[allow(unsafe_code)]
pub fn segments(fd: i32) -> Option<(u64, u64)> {
    let mut info = TcpInfoHead::default();
    let mut len = std::mem::size_of::<TcpInfoHead>() as libc::socklen_t;
    // SAFETY: `info` is a plain-old-data buffer of `len` bytes that outlives the call; the
    // kernel writes at most `len` bytes into it and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut TcpInfoHead).cast(),
            &mut len,
        )
    };
    let needed = std::mem::size_of::<TcpInfoHead>() as libc::socklen_t;
    (rc == 0 && len >= needed).then_some((info.segs_in as u64, info.segs_out as u64))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn counts_segments_of_a_real_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let (in0, out0) = segments(client.as_raw_fd()).unwrap();
        for _ in 0..5 {
            client.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            server.read_exact(&mut buf).unwrap();
            server.write_all(b"pong").unwrap();
            client.read_exact(&mut buf).unwrap();
        }
        let (in1, out1) = segments(client.as_raw_fd()).unwrap();
        assert!(out1 - out0 >= 5, "{out0} -> {out1}");
        assert!(in1 - in0 >= 5, "{in0} -> {in1}");
    }
}

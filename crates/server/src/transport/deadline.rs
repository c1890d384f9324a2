//! A write deadline for the connections hyper serves (the API, `POST /connection/send`,
//! pages): hyper has a timeout for reading a request's head but none for writing its
//! answer, so a client that asks for a large answer and never reads it would keep the
//! answer, and its connection, for as long as it stays connected. Here a write that makes
//! no progress for the deadline fails, hyper drops the connection, and what it held is
//! freed, in the kernel too: the socket is reset rather than closed, since a closed socket
//! keeps what it could not send (up to its send buffer, megabytes on a fast link) until
//! the client reads it, which this one does not. (The lean path and WebSocket time their
//! writes themselves.)
//!
//! It also hands hyper first what the lean path read of the connection before it knew the
//! request was hyper's (see [`crate::transport::http1`]).

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep},
};

/// A connection whose writes (and flushes) fail once one has waited `limit` without
/// progress.
#[derive(Debug)]
pub struct WriteDeadline {
    io: TcpStream,
    /// Read from the connection before it came here, to be read first; boxed, as most
    /// connections' is gone after their first read and an upgraded WebSocket keeps this.
    unread: Option<Box<[u8]>>,
    limit: Duration,
    /// Armed while a write waits; made on the first wait only (most connections never
    /// wait to write).
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl WriteDeadline {
    /// Wraps `io`, of which `unread` was read already.
    pub fn new(io: TcpStream, unread: Vec<u8>, limit: Duration) -> Self {
        Self {
            io,
            unread: (!unread.is_empty()).then(|| unread.into_boxed_slice()),
            limit,
            timer: None,
            armed: false,
        }
    }

    /// The wrapped connection, and what was read of it that no one has read here yet.
    pub fn into_inner(self) -> (TcpStream, Vec<u8>) {
        (self.io, self.unread.map(Vec::from).unwrap_or_default())
    }

    /// Called when a write is pending: fails once it has been pending for the limit.
    fn waited(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if !self.armed {
            timer.as_mut().reset(Instant::now() + limit);
            self.armed = true;
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready({
                // Closed now, it resets: what it could not send is dropped.
                let _ = self.io.set_zero_linger();
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client read nothing for {limit:?}"),
                )
            }),
            Poll::Pending => Poll::Pending,
        }
    }

    fn timed<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match polled {
            Poll::Pending => match self.waited(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            done => {
                self.armed = false;
                done
            }
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(unread) = self.unread.take() {
            let n = unread.len().min(buf.remaining());
            buf.put_slice(&unread[..n]);
            if n < unread.len() {
                self.unread = Some(unread[n..].into());
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.timed(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.timed(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.timed(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

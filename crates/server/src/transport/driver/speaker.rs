//! What the driver needs of a protocol: how a connection's session reads its client's
//! frames and writes its publications ([`Speaker`]), Herald's own or a front's.

use std::future::Future;

use crate::{
    error::Disconnect,
    queue::Delivery,
    session::{Positions, Session},
};

/// The protocol a connection speaks over its session: Herald's own (the [`Session`]
/// itself), or a front's (Pusher's), which reads the client's frames its own way and
/// writes publications in its own words, over the same session, hub and queue.
pub trait Speaker: Send {
    /// The session under it.
    fn session(&self) -> &Session;

    /// The session under it, to change.
    fn session_mut(&mut self) -> &mut Session;

    /// Handles what a client sent (see [`Session::handle_frame_until`]): answers go to
    /// `out`, one per line; returns the part of the frame not handled yet.
    fn handle<'f>(
        &mut self,
        frame: &'f [u8],
        out: &mut Vec<u8>,
        flush_at: usize,
    ) -> impl Future<Output = Result<&'f [u8], Disconnect>> + Send;

    /// Takes queued publications, as [`Session::drain`] does, in this protocol's words:
    /// each with the delivery it carries, when its words are the ones the connection's
    /// [`Framing`](super::websocket::Framing) gives that delivery (so the same frame serves).
    fn drain(
        &mut self,
        max_bytes: usize,
        emit: impl FnMut(&[u8], Option<&Delivery>, Positions<'_>),
    ) -> Result<(), Disconnect>;

    /// Ends what the client's tokens no longer grant, for every transport alike (the
    /// driver's connections and the polls): `Err` when the connection's own token expired
    /// (3504, unless the refresh hook extends it); otherwise what to tell the client of the
    /// subscriptions that ended, in this protocol's words, one message each.
    fn expire(&mut self) -> impl Future<Output = Result<Vec<Vec<u8>>, Disconnect>> + Send;

    /// Something was written: the payload of a ping to send now, when the speaker wants
    /// the client to confirm it read everything so far (see [`Speaker::confirmed`]).
    fn confirm_writes(&mut self) -> Option<[u8; 8]> {
        None
    }

    /// The client answered the ping that carried `payload`.
    fn confirmed(&mut self, payload: &[u8]) {
        let _ = payload;
    }
}

impl Speaker for Session {
    fn session(&self) -> &Session {
        self
    }

    fn session_mut(&mut self) -> &mut Session {
        self
    }

    fn handle<'f>(
        &mut self,
        frame: &'f [u8],
        out: &mut Vec<u8>,
        flush_at: usize,
    ) -> impl Future<Output = Result<&'f [u8], Disconnect>> + Send {
        self.handle_frame_until(frame, out, flush_at)
    }

    fn drain(
        &mut self,
        max_bytes: usize,
        emit: impl FnMut(&[u8], Option<&Delivery>, Positions<'_>),
    ) -> Result<(), Disconnect> {
        Session::drain(self, max_bytes, emit)
    }

    fn expire(&mut self) -> impl Future<Output = Result<Vec<Vec<u8>>, Disconnect>> + Send {
        Session::expire(self)
    }
}

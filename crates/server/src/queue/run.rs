//! A run: one channel's publications that a fan-out thread hands every member at once
//! ([`super::Queue::offer_run`]), with the bytes that carry them made once for each kind
//! of socket rather than once per member.

use std::sync::Arc;

use bytes::Bytes;

use super::{Delivery, DirectSocket, Lane};

/// What a socket's frames of a run depend on besides the run, when they depend on nothing
/// of its connection's own: every socket of one kind frames a run into the same bytes
/// (see [`DirectSocket::run_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunKind {
    /// The lane its publications' frames are made under.
    pub lane: Lane,
    /// The smallest message it compresses, if it compresses.
    pub compress_from: Option<usize>,
}

/// A fan-out thread's run of one channel's publications, oldest first, and the bytes that
/// carry a stretch of them, made for the first member of a kind and shared by the rest:
/// at 10,000 members that is one join of up to 64 pushes where there were 10,000, and a
/// write the socket takes in part keeps its tail as a slice of the shared bytes, not a
/// copy.
#[derive(Debug, Default)]
pub struct Run {
    deliveries: Vec<Arc<Delivery>>,
    /// Frames made for one member alone (a socket of no shared kind), reused.
    own: Vec<u8>,
    /// Frames made for one kind, by where their stretch of the run starts and ends.
    shared: Vec<Shared>,
}

#[derive(Debug)]
struct Shared {
    kind: RunKind,
    stretch: (usize, usize),
    bytes: Bytes,
    framed: usize,
}

/// The bytes that carry the first `framed` publications of a stretch of a run on one
/// socket.
pub(super) enum Framed<'r> {
    /// Made once for every socket of its kind.
    Shared(Bytes, usize),
    /// Made for this socket alone, in the run's own buffer.
    Own(&'r [u8], usize),
}

impl Framed<'_> {
    /// The bytes, and how many publications they carry.
    pub(super) fn bytes(&self) -> (&[u8], usize) {
        match self {
            Framed::Shared(bytes, framed) => (bytes, *framed),
            Framed::Own(bytes, framed) => (bytes, *framed),
        }
    }

    /// What follows the first `written` bytes, kept for the transport to send: a slice
    /// of shared bytes, a copy of a socket's own.
    pub(super) fn tail(&self, written: usize) -> Bytes {
        match self {
            Framed::Shared(bytes, _) => bytes.slice(written..),
            Framed::Own(bytes, _) => Bytes::copy_from_slice(&bytes[written..]),
        }
    }
}

impl Run {
    /// Starts a run of these publications, forgetting the last one's frames.
    pub fn start(&mut self, deliveries: impl IntoIterator<Item = Arc<Delivery>>) {
        self.deliveries.clear();
        self.shared.clear();
        self.deliveries.extend(deliveries);
    }

    /// Lets go of the run's publications and frames, kept no longer than the run.
    pub fn clear(&mut self) {
        self.start([]);
    }

    /// The run's publications, oldest first.
    pub fn deliveries(&self) -> &[Arc<Delivery>] {
        &self.deliveries
    }

    /// The frames of `deliveries()[from..to]` on `socket` (see
    /// [`DirectSocket::frame_run`]); `None` when it takes none of them directly now.
    pub(super) fn frame(
        &mut self,
        socket: &dyn DirectSocket,
        from: usize,
        to: usize,
    ) -> Option<Framed<'_>> {
        let stretch = &self.deliveries[from..to];
        let Some(kind) = socket.run_kind(stretch) else {
            self.own.clear();
            let framed = socket.frame_run(stretch, &mut self.own);
            return (framed > 0).then_some(Framed::Own(&self.own, framed));
        };
        let made = self
            .shared
            .iter()
            .find(|s| s.kind == kind && s.stretch == (from, to));
        let made = match made {
            Some(made) => made,
            None => {
                let mut bytes = Vec::new();
                let framed = socket.frame_run(stretch, &mut bytes);
                self.shared.push(Shared {
                    kind,
                    stretch: (from, to),
                    bytes: bytes.into(),
                    framed,
                });
                self.shared.last().expect("just pushed")
            }
        };
        (made.framed > 0).then(|| Framed::Shared(made.bytes.clone(), made.framed))
    }
}

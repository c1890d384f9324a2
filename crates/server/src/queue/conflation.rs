//! Conflation: on a subscription that conflates, a publication with a conflation key takes
//! out the one of the same channel and key still waiting in the queue, and the queue
//! remembers the offset it replaced, so that the session can tell the client which
//! offsets it skips and still refuse any other gap.

use herald_protocol::ChannelName;

use super::{Delivery, Inner, Queue};

/// What [`Inner::superseded`] remembers: boxed behind one word, so that a queue that never
/// conflates pays a word, not a vector's three.
#[derive(Debug, Default)]
pub(super) struct Superseded(Vec<(ChannelName, u64)>);

/// Most replaced publications a queue remembers: past them, publications queue whole
/// again (and a connection that falls further behind overflows, as without conflation).
const MAX_SUPERSEDED: usize = 1024;

impl Queue {
    /// Whether every offset of `channel` after `after` and before `before` was replaced
    /// while it waited (see [`super::Position::conflates`]): then the session skips to
    /// `before - 1`. Forgets what it passes either way.
    pub fn superseded(&self, channel: &ChannelName, after: u64, before: u64) -> bool {
        let mut inner = self.inner.lock();
        let Some(superseded) = inner.superseded.as_mut() else {
            return false;
        };
        let between = superseded
            .0
            .iter()
            .filter(|(c, o)| c == channel && *o > after && *o < before)
            .count() as u64;
        superseded.0.retain(|(c, o)| c != channel || *o >= before);
        if superseded.0.is_empty() {
            inner.superseded = None;
        }
        before > after + 1 && between == before - after - 1
    }
}

impl Queue {
    /// Forgets what was replaced on `channel`: its subscription ended, and a later one
    /// must not take those offsets for skipped.
    pub fn forget_superseded(&self, channel: &ChannelName) {
        let mut inner = self.inner.lock();
        if let Some(superseded) = inner.superseded.as_mut() {
            superseded.0.retain(|(c, _)| c != channel);
            if superseded.0.is_empty() {
                inner.superseded = None;
            }
        }
    }
}

impl Inner {
    /// Takes out the queued publication `newer` replaces, if one waits: the same
    /// channel's with the same conflation key. It is remembered as superseded, up to
    /// [`MAX_SUPERSEDED`].
    pub(super) fn replace_older(&mut self, newer: &Delivery) {
        let Some(key) = newer.conflation_key() else {
            return;
        };
        if self
            .superseded
            .as_ref()
            .is_some_and(|s| s.0.len() >= MAX_SUPERSEDED)
        {
            return;
        }
        let older = self.items.iter().rposition(|d| {
            d.offset != 0
                && d.offset < newer.offset
                && d.channel == newer.channel
                && d.epoch == newer.epoch
                && d.conflation_key() == Some(key)
        });
        let Some(older) = older.and_then(|i| self.items.remove(i)) else {
            return;
        };
        self.bytes -= older.size;
        if let Some(wire) = &self.wire {
            wire.queued(-(older.size as i64));
        }
        self.superseded
            .get_or_insert_with(Box::default)
            .0
            .push((older.channel.clone(), older.offset));
    }
}

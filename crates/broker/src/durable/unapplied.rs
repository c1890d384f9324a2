//! Publications that are durable in the log but not yet in the database file: reads take
//! them from here. A channel's entries are a suffix of its committed history: they are
//! added in commit order before anyone is told of them, and removed in the same order once
//! the applier's commit holds them.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch};
use parking_lot::Mutex;

use super::applier::Op;

struct Pending {
    lsn: u64,
    epoch: Epoch,
    offset: u64,
    at_ms: u64,
    data: Bytes,
}

/// A publication read from here: offset, publication time, record.
pub(crate) type Recent = (u64, u64, Bytes);

#[derive(Default)]
pub(crate) struct Unapplied(Mutex<HashMap<ChannelName, VecDeque<Pending>>>);

impl Unapplied {
    /// Adds the publications among `ops` (just made durable).
    pub(crate) fn add(&self, ops: &[Op]) {
        let mut map = self.0.lock();
        for op in ops {
            if let Op::Publish {
                lsn,
                channel,
                epoch,
                offset,
                at_ms,
                data,
                ..
            } = op
            {
                map.entry(channel.clone()).or_default().push_back(Pending {
                    lsn: *lsn,
                    epoch: epoch.clone(),
                    offset: *offset,
                    at_ms: *at_ms,
                    data: data.clone(),
                });
            }
        }
    }

    /// Forgets `channels`' entries up to `lsn`: the database holds them now.
    pub(crate) fn applied<'a>(
        &self,
        channels: impl IntoIterator<Item = &'a ChannelName>,
        lsn: u64,
    ) {
        let mut map = self.0.lock();
        for channel in channels {
            let Some(queue) = map.get_mut(channel) else {
                continue;
            };
            while queue.front().is_some_and(|p| p.lsn <= lsn) {
                queue.pop_front();
            }
            if queue.is_empty() {
                map.remove(channel);
            }
        }
    }

    /// `channel`'s publications of `epoch` up to `top` held here, oldest first.
    pub(crate) fn read(&self, channel: &ChannelName, epoch: &Epoch, top: u64) -> Vec<Recent> {
        let map = self.0.lock();
        let Some(queue) = map.get(channel) else {
            return Vec::new();
        };
        queue
            .iter()
            .filter(|p| p.epoch == *epoch && p.offset <= top)
            .map(|p| (p.offset, p.at_ms, p.data.clone()))
            .collect()
    }
}

//! Publications that are durable in the log but not yet in the index: reads take them from
//! here. A channel's entries are a suffix of its committed history: they are added in
//! commit order before anyone is told of them, and removed in the same order once the
//! applier has indexed them.

use std::{
    collections::{HashMap, VecDeque},
    sync::atomic::{AtomicUsize, Ordering},
};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch};
use parking_lot::{Condvar, Mutex};

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
pub(crate) struct Unapplied {
    channels: Mutex<HashMap<ChannelName, VecDeque<Pending>>>,
    /// Bytes of records held.
    bytes: AtomicUsize,
    /// Told when the applier has taken records away.
    drained: Condvar,
}

impl Unapplied {
    /// Adds the publications among `ops` (just made durable).
    pub(crate) fn add(&self, ops: &[Op]) {
        let mut map = self.channels.lock();
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
                self.bytes.fetch_add(data.len(), Ordering::Relaxed);
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

    /// Forgets `channels`' entries up to `lsn`: the index holds them now.
    pub(crate) fn applied<'a>(
        &self,
        channels: impl IntoIterator<Item = &'a ChannelName>,
        lsn: u64,
    ) {
        let mut map = self.channels.lock();
        for channel in channels {
            let Some(queue) = map.get_mut(channel) else {
                continue;
            };
            while queue.front().is_some_and(|p| p.lsn <= lsn) {
                if let Some(p) = queue.pop_front() {
                    self.bytes.fetch_sub(p.data.len(), Ordering::Relaxed);
                }
            }
            if queue.is_empty() {
                map.remove(channel);
            }
        }
        self.drained.notify_all();
    }

    /// Waits, at most `patience`, until at most `limit` bytes are held; whether they are.
    pub(crate) fn wait_below(&self, limit: usize, patience: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + patience;
        let mut map = self.channels.lock();
        while self.bytes() > limit {
            if self.drained.wait_until(&mut map, until).timed_out() {
                return self.bytes() <= limit;
            }
        }
        true
    }

    /// `channel`'s publications of `epoch` up to `top` held here, oldest first.
    pub(crate) fn read(&self, channel: &ChannelName, epoch: &Epoch, top: u64) -> Vec<Recent> {
        let map = self.channels.lock();
        let Some(queue) = map.get(channel) else {
            return Vec::new();
        };
        queue
            .iter()
            .filter(|p| p.epoch == *epoch && p.offset <= top)
            .map(|p| (p.offset, p.at_ms, p.data.clone()))
            .collect()
    }

    /// Bytes of records held: how far the index is behind the log.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(channel: &ChannelName, lsn: u64, offset: u64, data: &'static str) -> Op {
        Op::Publish {
            lsn,
            channel: channel.clone(),
            epoch: Epoch::new("e1"),
            offset,
            at_ms: 0,
            data: Bytes::from(data),
            history_size: 10,
            written: None,
        }
    }

    #[test]
    fn entries_leave_in_order_once_applied_and_their_bytes_with_them() {
        let (a, b) = (
            ChannelName::new("a").unwrap(),
            ChannelName::new("b").unwrap(),
        );
        let held = Unapplied::default();
        held.add(&[
            publish(&a, 1, 1, "xx"),
            publish(&b, 2, 1, "yyy"),
            publish(&a, 3, 2, "z"),
        ]);
        assert_eq!(held.bytes(), 6);
        let e1 = Epoch::new("e1");
        assert_eq!(held.read(&a, &e1, 2).len(), 2);
        assert_eq!(held.read(&a, &e1, 1).len(), 1, "nothing past the top");
        assert!(
            held.read(&a, &Epoch::new("e2"), 9).is_empty(),
            "nor of another epoch"
        );
        held.applied([&a, &b], 2);
        assert_eq!(held.bytes(), 1);
        let left: Vec<u64> = held.read(&a, &e1, 9).iter().map(|r| r.0).collect();
        assert_eq!(left, [2]);
        assert!(held.read(&b, &e1, 9).is_empty());
        held.applied([&a], 3);
        assert_eq!(held.bytes(), 0);
    }

    /// Publishers wait while too much waits for the index, and go on once the applier has
    /// taken it; past their patience, they are told no.
    #[test]
    fn waiting_below_a_limit_ends_when_the_applier_drains_or_patience_runs_out() {
        let a = ChannelName::new("a").unwrap();
        let held = std::sync::Arc::new(Unapplied::default());
        held.add(&[publish(&a, 1, 1, "0123456789")]);
        let short = std::time::Duration::from_millis(20);
        assert!(!held.wait_below(5, short), "still 10 bytes held");
        assert!(held.wait_below(10, short), "at the limit already");
        let applier = {
            let (held, a) = (held.clone(), a.clone());
            std::thread::spawn(move || held.applied([&a], 1))
        };
        assert!(held.wait_below(5, std::time::Duration::from_secs(10)));
        applier.join().unwrap();
    }
}

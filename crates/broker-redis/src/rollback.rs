//! A Redis that lost writes while no node listened to a channel (issue #57 item 6). A
//! failover to a replica that lagged keeps the replication history going (the promoted
//! replica names the old one `master_replid2`), so the scripts cannot tell it from a
//! failover that lost nothing: the promoted copy of a stream went back with the writes it
//! lacked. What knows better is the node that acknowledged them. Each node remembers, for
//! the channels it published to lately, the newest offset it acknowledged in which epoch;
//! its probe reads Redis's replication ids every second, and when one changes (a
//! failover, or a restart), it asks Redis to give each of those channels a new epoch if
//! it now stands below what the node acknowledged in that epoch ([`RENEW_EPOCH`]).
//!
//! Limits, documented: what a node that died meanwhile acknowledged is not checked; the
//! check comes within about a second of the node reaching the new primary, and a
//! publication through another node in that second can still take a lost offset; a node
//! remembers at most [`REMEMBERED`] channels (the most recently published to).
//!
//! [`RENEW_EPOCH`]: crate::scripts::RENEW_EPOCH

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

use futures_util::StreamExt;
use herald_protocol::{ChannelName, Epoch};
use parking_lot::Mutex;

use crate::Store;

/// Channels a node remembers what it acknowledged in.
pub(crate) const REMEMBERED: usize = 100_000;

/// Checks run at once after a change.
const AT_ONCE: usize = 32;

/// The newest offset this node acknowledged per channel, and the replication ids it last
/// read.
#[derive(Debug, Default)]
pub(crate) struct Acked {
    /// Two generations: when the newer holds half of [`REMEMBERED`], it becomes the older
    /// and the older is forgotten, so the most recently published to are kept without an
    /// order to maintain.
    generations: Mutex<[HashMap<ChannelName, (Epoch, u64)>; 2]>,
    replication: Mutex<Option<BTreeSet<String>>>,
    /// A check is running (one at a time).
    checking: std::sync::atomic::AtomicBool,
}

impl Acked {
    /// This node acknowledged `offset` of `channel` in `epoch`.
    pub(crate) fn note(&self, channel: &ChannelName, epoch: &Epoch, offset: u64) {
        let mut g = self.generations.lock();
        let [newer, older] = &mut *g;
        if let Some((e, top)) = newer.get_mut(channel) {
            if e == epoch {
                *top = (*top).max(offset);
            } else {
                (*e, *top) = (epoch.clone(), offset);
            }
            return;
        }
        let kept = older.remove(channel).filter(|(e, _)| e == epoch);
        let top = kept.map_or(offset, |(_, top)| top.max(offset));
        if newer.len() >= REMEMBERED / 2 {
            *older = std::mem::take(newer);
        }
        newer.insert(channel.clone(), (epoch.clone(), top));
    }

    fn all(&self) -> Vec<(ChannelName, (Epoch, u64))> {
        let g = self.generations.lock();
        let [newer, older] = &*g;
        (newer
            .iter()
            .chain(older.iter().filter(|(c, _)| !newer.contains_key(*c))))
        .map(|(c, seen)| (c.clone(), seen.clone()))
        .collect()
    }

    /// Whether `now` differs from the replication ids last checked; the first ids read
    /// are taken as checked.
    fn differs(&self, now: &BTreeSet<String>) -> bool {
        let mut last = self.replication.lock();
        match &*last {
            None => {
                *last = Some(now.clone());
                false
            }
            Some(before) => before != now,
        }
    }

    /// Every channel was checked under `now`.
    fn checked(&self, now: BTreeSet<String>) {
        *self.replication.lock() = Some(now);
    }
}

/// Starts a [`check`] as a task of its own unless one runs: the probe goes on pinging
/// meanwhile. Called by the probe after each PING answered.
pub(crate) fn check_soon(store: &Arc<Store>) {
    use std::sync::atomic::Ordering;
    if store.acked.checking.swap(true, Ordering::AcqRel) {
        return;
    }
    let store = store.clone();
    tokio::spawn(async move {
        check(&store).await;
        store.acked.checking.store(false, Ordering::Release);
    });
}

/// Reads Redis's replication ids (every primary's, on a cluster) and, if they changed
/// since the last check, gives every channel this node acknowledged later offsets in than
/// Redis now holds a new epoch.
async fn check(store: &Store) {
    let ids = match store.replication_ids().await {
        Ok(ids) if !ids.is_empty() => ids,
        Ok(_) => return,
        Err(e) => {
            tracing::debug!(error = %e, "could not read redis's replication ids");
            return;
        }
    };
    if !store.acked.differs(&ids) {
        return;
    }
    let remembered = store.acked.all();
    let count = remembered.len();
    let answers: Vec<_> = futures_util::stream::iter(remembered)
        .map(|(channel, seen)| async move {
            let now = store.renew_epoch(&channel, &seen).await;
            (channel, seen, now)
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    let (mut renewed, mut failed) = (0, 0);
    for (channel, (epoch, seen), now) in answers {
        match now {
            Ok(None) => {}
            Ok(Some(now)) => {
                renewed += 1;
                tracing::warn!(
                    channel = %channel,
                    seen,
                    epoch = epoch.as_str(),
                    new_epoch = now.as_str(),
                    "redis failed over or restarted and the channel's history went back below what this node acknowledged: it continues in a new epoch, so clients that saw the lost publications get recovered: false instead of reused offsets"
                );
            }
            Err(e) => {
                failed += 1;
                tracing::debug!(channel = %channel, error = %e, "could not check whether the channel's history in redis went back; tried again in a second");
            }
        }
    }
    // Until every channel was checked, the next round checks them all again: a failover
    // in progress answers for none of the slots its dead primary held.
    if failed == 0 {
        store.acked.checked(ids);
        tracing::info!(
            checked = count,
            renewed,
            "redis's replication changed (a failover or a restart): checked the channels this node published to"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(n: usize) -> ChannelName {
        ChannelName::new(&format!("c:{n}")).unwrap()
    }

    #[test]
    fn the_newest_offset_is_kept_per_epoch_and_the_oldest_channels_forgotten() {
        let acked = Acked::default();
        let (e1, e2) = (Epoch::new("e1"), Epoch::new("e2"));
        acked.note(&ch(0), &e1, 5);
        acked.note(&ch(0), &e1, 3);
        assert_eq!(acked.all(), vec![(ch(0), (e1.clone(), 5))]);
        acked.note(&ch(0), &e2, 1);
        assert_eq!(acked.all(), vec![(ch(0), (e2.clone(), 1))]);
        for n in 1..=REMEMBERED {
            acked.note(&ch(n), &e1, 1);
        }
        let all = acked.all();
        assert!(all.len() <= REMEMBERED && all.len() >= REMEMBERED / 2);
        assert!(
            all.iter().any(|(c, _)| *c == ch(REMEMBERED)),
            "the newest kept"
        );
        assert!(all.iter().all(|(c, _)| *c != ch(0)), "the oldest forgotten");
    }

    #[test]
    fn a_change_counts_until_every_channel_is_checked_under_it() {
        let acked = Acked::default();
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert!(!acked.differs(&ids(&["a", "b"])), "the first read");
        assert!(!acked.differs(&ids(&["a", "b"])));
        assert!(acked.differs(&ids(&["a"])));
        assert!(acked.differs(&ids(&["a"])), "not checked yet");
        acked.checked(ids(&["a"]));
        assert!(!acked.differs(&ids(&["a"])));
    }
}

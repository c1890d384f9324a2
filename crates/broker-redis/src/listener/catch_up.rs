//! Catching up after a reconnect: every channel the node listens to holds its live
//! publications while what it missed is read back from history, then hands both over in
//! order; a stream found below what was handed over (Redis lost writes) starts a new epoch.

use std::{
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use futures_util::Future;
use herald_broker::{BrokerError, History, HistoryQuery};
use herald_protocol::{ChannelName, Epoch, Since};

use super::{Held, Listener};
use crate::Store;

/// What a catch-up after a reconnect reads at most per channel; a longer gap is left to
/// the hub's gap check (clients resume from history themselves).
const CATCH_UP_LIMIT: usize = 10_000;
const CATCH_UP_BYTES: usize = 8 << 20;

impl Listener {
    /// After a reconnect: every tracked channel holds its live publications until its
    /// catch-up is read. Returns what to read, per channel, from where.
    pub(super) fn start_catch_up(&self) -> Vec<CatchUp> {
        let mut channels = self.channels.lock();
        channels
            .iter_mut()
            .map(|(name, t)| {
                t.held = Some(Held::default());
                let from = t.last.clone().or_else(|| t.floor.clone());
                CatchUp {
                    name: name.to_string(),
                    channel: t.channel.clone(),
                    since: match from {
                        Some((epoch, offset)) => Since {
                            offset,
                            epoch: Some(epoch),
                        },
                        // The stream did not exist when this node subscribed: all of it.
                        None => Since {
                            offset: 0,
                            epoch: None,
                        },
                    },
                }
            })
            .collect()
    }

    /// One channel's catch-up read came back: hands over what it missed, then what was
    /// held meanwhile, and goes live again. When the stream now stands below what this node
    /// handed over, in the same epoch, Redis lost writes: that is returned, for a new epoch.
    pub(super) fn finish_catch_up(
        &self,
        name: &str,
        read: Result<History, BrokerError>,
    ) -> Option<WentBack> {
        let went_back = match &read {
            Err(BrokerError::Unrecoverable { current }) => {
                let channels = self.channels.lock();
                channels.get(name).and_then(|t| match &t.last {
                    Some(seen) if seen.0 == current.epoch && current.offset < seen.1 => {
                        Some(WentBack {
                            channel: t.channel.clone(),
                            seen: seen.clone(),
                            now: current.offset,
                        })
                    }
                    _ => None,
                })
            }
            _ => None,
        };
        let channel = match read {
            Ok(history) => {
                let epoch = history.position.epoch;
                for p in &history.publications {
                    if self.deliver(name, &epoch, p) {
                        self.caught_up.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None
            }
            Err(e) => Some(e),
        };
        let held = {
            let mut channels = self.channels.lock();
            let Some(tracked) = channels.get_mut(name) else {
                return None; // unsubscribed meanwhile: nobody here saw it go back
            };
            if let (Some(e), None) = (channel, &went_back) {
                tracing::warn!(channel = %tracked.channel, error = %e, "missed publications cannot be read back; subscribers will resume from history");
            }
            tracked.held.take()
        };
        self.release(held.as_ref());
        for (epoch, p) in held.into_iter().flat_map(|h| h.publications) {
            self.deliver(name, &epoch, &p);
        }
        went_back
    }
}

/// A channel whose stream went backwards in Redis while this node listened: it had handed
/// over `seen` and the stream now stands at `now` in the same epoch.
pub(super) struct WentBack {
    channel: ChannelName,
    seen: (Epoch, u64),
    now: u64,
}

impl WentBack {
    /// Starts the channel on a new epoch (unless another node did), so that the offsets
    /// after `now` are not given out again in the epoch subscribers saw them in: the next
    /// publication reaches them in the new epoch, and they resume from history, told
    /// `recovered: false`.
    pub(super) async fn renew(self, store: &Store) {
        match store.renew_epoch(&self.channel, &self.seen).await {
            Ok(None) => {}
            Ok(Some(epoch)) => tracing::warn!(
                channel = %self.channel,
                seen = self.seen.1,
                now = self.now,
                epoch = %epoch,
                "the channel's history in Redis went back (a restart from an older dump, or a failover to a replica that lagged): it continues in a new epoch, so clients that saw the lost publications get recovered: false instead of reused offsets"
            ),
            Err(e) => tracing::warn!(
                channel = %self.channel,
                error = %e,
                "the channel's history in Redis went back, and a new epoch could not be set"
            ),
        }
    }
}

/// One channel to read back after a reconnect.
#[derive(Clone)]
pub(super) struct CatchUp {
    pub(super) name: String,
    pub(super) channel: ChannelName,
    since: Since,
}

pub(super) type Reading =
    Pin<Box<dyn Future<Output = (CatchUp, Result<History, BrokerError>)> + Send>>;

/// Reads one channel's catch-up, after `delay` (a retry).
pub(super) fn read_back(store: &Arc<Store>, c: CatchUp, delay: Duration) -> Reading {
    let store = store.clone();
    Box::pin(async move {
        tokio::time::sleep(delay).await;
        let query = HistoryQuery {
            since: Some(c.since.clone()),
            limit: CATCH_UP_LIMIT,
            max_bytes: Some(CATCH_UP_BYTES),
        };
        let read = store.history(&c.channel, &query).await;
        (c, read)
    })
}

/// How long a failed catch-up read waits before it is tried again: Redis answered
/// nothing, or the command connection is being replaced.
pub(super) const CATCH_UP_RETRY: Duration = Duration::from_secs(1);

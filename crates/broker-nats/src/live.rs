//! Live publications: a core NATS subscription per channel this node serves, on the
//! subject its stream republishes stored messages to. Only stored messages are
//! republished, so a writer refused by the compare-and-set is never heard; and a node
//! hears only the channels its clients use.
//!
//! Core NATS delivers at most once: messages published while this node's connection was
//! down are not heard. After the client reconnects (it subscribes again by itself), each
//! channel reads what it missed from history, then goes on with live messages, skipping
//! those it already handed over. A gap history cannot cover is left to the hub, which
//! tells its clients to resume.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};

use async_nats::{Client, Message};
use futures_util::StreamExt;
use herald_broker::{BrokerError, HistoryQuery, PublicationSink};
use herald_protocol::{json::stored_record, ChannelName, Epoch, Publication, Since};
use parking_lot::Mutex;
use tokio::{sync::watch, task::AbortHandle, time::Instant};

use crate::{
    store::{headers_epoch, headers_offset, Store},
    unavailable,
};

/// How many times a failed catch-up is tried, and how often.
const CATCH_UP_TRIES: u32 = 20;
const CATCH_UP_RETRY: Duration = Duration::from_millis(500);

/// How long a publication heard ahead of a missing one waits for it before the missing one
/// is read from history. Two writers' messages can be republished out of order by
/// nats-server (measured: offset 1598 before 1597, within a millisecond, with two nodes
/// publishing on one channel), so a gap is not a loss until this has passed.
const REORDER_WAIT: Duration = Duration::from_millis(100);

/// Most publications held ahead of a missing one; past it, history is read at once.
const MOST_AHEAD: usize = 10_000;

/// The channels this node listens to.
pub(crate) struct Live {
    client: Client,
    store: Arc<Store>,
    sink: Arc<dyn PublicationSink>,
    channels: Mutex<HashMap<ChannelName, AbortHandle>>,
    /// Bumped by the connection's events each time it is back after a loss.
    reconnected: watch::Receiver<u64>,
    /// Publications read back from history after reconnects.
    pub(crate) caught_up: AtomicU64,
}

impl Live {
    pub(crate) fn new(
        client: Client,
        store: Arc<Store>,
        sink: Arc<dyn PublicationSink>,
        reconnected: watch::Receiver<u64>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            store,
            sink,
            channels: Mutex::default(),
            reconnected,
            caught_up: AtomicU64::new(0),
        })
    }

    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        channel: &ChannelName,
    ) -> Result<(), BrokerError> {
        if self.channels.lock().contains_key(channel) {
            return Ok(());
        }
        // Where the channel stood before this node listened: a catch-up before anything
        // was heard reads from here.
        let policy = self.store.policy(channel);
        let stream = self.store.stream(&policy).await?;
        let subject = self.store.names.subject(channel, &policy);
        let floor = self
            .store
            .fresh_top(&stream, channel, &subject, false)
            .await?;
        let subscriber = self
            .client
            .subscribe(self.store.names.live(channel))
            .await
            .map_err(unavailable)?;
        // Once the server has the subscription, every stored publication of the channel
        // reaches this node: wait for that, not just for the subscription to be written.
        crate::connect::round_trip(&self.client).await?;
        let listening = Listening {
            live: self.clone(),
            channel: channel.clone(),
            order: Order {
                floor: (floor.seq > 0).then_some((floor.epoch, floor.offset)),
                ..Order::default()
            },
        };
        let task = tokio::spawn(listening.run(subscriber, self.reconnected.clone()));
        let mut channels = self.channels.lock();
        if channels.contains_key(channel) {
            // Subscribed twice at once: one listener is enough.
            task.abort();
        } else {
            channels.insert(channel.clone(), task.abort_handle());
        }
        Ok(())
    }

    pub(crate) fn unsubscribe(&self, channel: &ChannelName) {
        // Dropping the task's subscriber unsubscribes it.
        if let Some(task) = self.channels.lock().remove(channel) {
            task.abort();
        }
    }

    pub(crate) fn channel_count(&self) -> usize {
        self.channels.lock().len()
    }

    pub(crate) fn stop(&self) {
        for (_, task) in self.channels.lock().drain() {
            task.abort();
        }
    }
}

/// One channel's listener.
struct Listening {
    live: Arc<Live>,
    channel: ChannelName,
    order: Order,
}

/// What the listener waits for besides messages.
enum Wait {
    Nothing,
    /// A missing publication, until then (then it is read from history).
    Missing(Instant),
    /// A catch-up that failed, tried again then; so many tries left.
    Retry(Instant, u32),
}

impl Listening {
    async fn run(
        mut self,
        mut subscriber: async_nats::Subscriber,
        mut reconnected: watch::Receiver<u64>,
    ) {
        reconnected.mark_unchanged();
        let mut wait = Wait::Nothing;
        loop {
            let until = match wait {
                Wait::Nothing => None,
                Wait::Missing(at) | Wait::Retry(at, _) => Some(at),
            };
            tokio::select! {
                message = subscriber.next() => match message {
                    Some(message) => {
                        self.heard(&message);
                        let held = self.order.ahead.len();
                        wait = match wait {
                            _ if held > MOST_AHEAD => Wait::Missing(Instant::now()),
                            Wait::Nothing if held > 0 => {
                                Wait::Missing(Instant::now() + REORDER_WAIT)
                            }
                            Wait::Missing(_) if held == 0 => Wait::Nothing,
                            other => other,
                        };
                    }
                    None => return,
                },
                changed = reconnected.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    wait = self.catch_up(CATCH_UP_TRIES).await;
                }
                () = sleep_until(until), if until.is_some() => {
                    let tries = match wait {
                        Wait::Retry(_, tries) => tries,
                        _ => CATCH_UP_TRIES,
                    };
                    wait = self.catch_up(tries).await;
                }
            }
        }
    }

    fn heard(&mut self, message: &Message) {
        let Some(headers) = &message.headers else {
            return;
        };
        let (Some(offset), Some(epoch)) = (headers_offset(headers), headers_epoch(headers)) else {
            tracing::warn!(channel = %self.channel, "ignoring a live message Herald did not write");
            return;
        };
        let record = match stored_record(&message.payload) {
            Ok(record) => record,
            Err(e) => {
                tracing::warn!(channel = %self.channel, offset, error = %e, "ignoring an invalid live publication");
                return;
            }
        };
        let ready = self.order.take(epoch, Publication { offset, record });
        self.hand_over(ready);
    }

    fn hand_over(&self, ready: Vec<(Epoch, Publication)>) {
        for (epoch, publication) in ready {
            self.live
                .sink
                .on_publication(&self.channel, &epoch, &publication);
        }
    }

    /// Reads from history what this node did not hear (missed while its connection was
    /// down, or still missing after [`REORDER_WAIT`]), then hands over what it held. What
    /// to wait for next: a retry while the read fails, with `tries` left.
    async fn catch_up(&mut self, tries: u32) -> Wait {
        // The subscription is made again by the client before it reports the connection
        // back; a round trip makes sure the server has it before history is read.
        let _ = crate::connect::round_trip(&self.live.client).await;
        let since = match self.order.known() {
            Some((epoch, offset)) => Since {
                offset: *offset,
                epoch: Some(epoch.clone()),
            },
            // Nothing was published when this node subscribed, nor heard since: from the
            // start.
            None => Since {
                offset: 0,
                epoch: None,
            },
        };
        let query = HistoryQuery {
            since: Some(since),
            limit: usize::MAX,
            max_bytes: None,
        };
        match self.live.store.history(&self.channel, &query).await {
            Ok(history) => {
                for publication in history.publications {
                    self.live.caught_up.fetch_add(1, Relaxed);
                    let ready = self.order.take(history.position.epoch.clone(), publication);
                    self.hand_over(ready);
                }
            }
            // Not covered: what is held goes as it is; the hub sees the gap and has its
            // clients resume.
            Err(BrokerError::Unrecoverable { .. }) => {}
            Err(e) if tries > 1 => {
                tracing::info!(channel = %self.channel, error = %e, "nats: could not catch up; trying again");
                return Wait::Retry(Instant::now() + CATCH_UP_RETRY, tries - 1);
            }
            Err(e) => {
                tracing::info!(channel = %self.channel, error = %e, "nats: could not catch up");
            }
        }
        let held = self.order.give_up();
        self.hand_over(held);
        Wait::Nothing
    }
}

/// A channel's publications put back in offset order: what was handed over, and what
/// waits for one still missing.
#[derive(Debug, Default)]
struct Order {
    /// The newest publication handed to the sink.
    last: Option<(Epoch, u64)>,
    /// Where the channel stood when this node subscribed (`None`: no publication yet).
    floor: Option<(Epoch, u64)>,
    /// Publications heard ahead of one still missing, by offset, until it comes.
    ahead: BTreeMap<u64, (Epoch, Publication)>,
}

impl Order {
    /// The publication the channel is at, as this node knows it.
    fn known(&self) -> Option<&(Epoch, u64)> {
        self.last.as_ref().or(self.floor.as_ref())
    }

    /// What to hand over now that `publication` came: it, if it is the next one, and what
    /// was held behind it; nothing if one before it is still missing (it is held:
    /// JetStream may republish two writers' messages out of order) or if it was handed
    /// over already.
    fn take(&mut self, epoch: Epoch, publication: Publication) -> Vec<(Epoch, Publication)> {
        let next = match self.known() {
            Some((known, offset)) if *known == epoch => offset + 1,
            // A channel with no publication yet starts at 1; another epoch starts anew
            // (the hub tells its clients).
            Some(_) => publication.offset,
            None => 1,
        };
        if publication.offset < next {
            return Vec::new();
        }
        if publication.offset > next {
            self.ahead.insert(publication.offset, (epoch, publication));
            return Vec::new();
        }
        self.last = Some((epoch.clone(), publication.offset));
        let mut out = vec![(epoch, publication)];
        while let Some(entry) = self.ahead.first_entry() {
            let next = self.last.as_ref().map_or(1, |(_, offset)| offset + 1);
            match (*entry.key()).cmp(&next) {
                std::cmp::Ordering::Less => {
                    entry.remove();
                }
                std::cmp::Ordering::Equal => {
                    let (epoch, publication) = entry.remove();
                    self.last = Some((epoch.clone(), publication.offset));
                    out.push((epoch, publication));
                }
                std::cmp::Ordering::Greater => break,
            }
        }
        out
    }

    /// Gives up waiting: everything held, in order, past what was handed over.
    fn give_up(&mut self) -> Vec<(Epoch, Publication)> {
        let mut out = Vec::new();
        for (_, (epoch, publication)) in std::mem::take(&mut self.ahead) {
            if self
                .last
                .as_ref()
                .is_none_or(|(e, o)| *e != epoch || publication.offset > *o)
            {
                self.last = Some((epoch.clone(), publication.offset));
                out.push((epoch, publication));
            }
        }
        out
    }
}

async fn sleep_until(until: Option<Instant>) {
    if let Some(until) = until {
        tokio::time::sleep_until(until).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publication(offset: u64) -> Publication {
        Publication {
            offset,
            record: bytes::Bytes::from_static(b"{}"),
        }
    }

    fn offsets(out: Vec<(Epoch, Publication)>) -> Vec<u64> {
        out.into_iter().map(|(_, p)| p.offset).collect()
    }

    #[test]
    fn publications_heard_out_of_order_are_handed_over_in_order_once() {
        let e = Epoch::checked("e1").unwrap();
        let mut order = Order::default();
        assert_eq!(offsets(order.take(e.clone(), publication(1))), [1]);
        assert!(
            order.take(e.clone(), publication(3)).is_empty(),
            "2 is missing"
        );
        assert!(order.take(e.clone(), publication(4)).is_empty());
        assert_eq!(offsets(order.take(e.clone(), publication(2))), [2, 3, 4]);
        assert!(order.take(e.clone(), publication(3)).is_empty(), "a repeat");
        assert_eq!(offsets(order.take(e.clone(), publication(5))), [5]);
    }

    #[test]
    fn a_floor_says_where_the_channel_was_and_giving_up_hands_over_what_is_held() {
        let e = Epoch::checked("e1").unwrap();
        let mut order = Order {
            floor: Some((e.clone(), 10)),
            ..Order::default()
        };
        assert!(
            order.take(e.clone(), publication(10)).is_empty(),
            "already there"
        );
        assert!(
            order.take(e.clone(), publication(12)).is_empty(),
            "11 is missing"
        );
        assert!(order.take(e.clone(), publication(13)).is_empty());
        assert_eq!(offsets(order.give_up()), [12, 13], "the hub sees the gap");
        assert_eq!(offsets(order.take(e.clone(), publication(14))), [14]);
        let other = Epoch::checked("e2").unwrap();
        assert_eq!(
            offsets(order.take(other, publication(1))),
            [1],
            "a new epoch starts anew"
        );
    }
}

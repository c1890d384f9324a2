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
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
};

use async_nats::{Client, Message};
use futures_util::StreamExt;
use herald_broker::{BrokerError, HistoryQuery, PublicationSink};
use herald_protocol::{json::stored_record, ChannelName, Epoch, Publication, Since};
use parking_lot::Mutex;
use tokio::{sync::watch, task::AbortHandle};

use crate::{
    store::{headers_epoch, headers_offset, Store},
    unavailable,
};

/// How many times a failed catch-up is tried again, and how often.
const CATCH_UP_TRIES: u32 = 20;
const CATCH_UP_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

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
        // The server has the subscription once it answers a ping sent after it: from here
        // on, every stored publication of the channel reaches this node.
        self.client.flush().await.map_err(unavailable)?;
        let listening = Listening {
            live: self.clone(),
            channel: channel.clone(),
            last: None,
            floor: (floor.seq > 0).then_some((floor.epoch, floor.offset)),
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
    /// The newest publication handed to the sink.
    last: Option<(Epoch, u64)>,
    /// Where the channel stood when this node subscribed (`None`: no publication yet).
    floor: Option<(Epoch, u64)>,
}

impl Listening {
    async fn run(
        mut self,
        mut subscriber: async_nats::Subscriber,
        mut reconnected: watch::Receiver<u64>,
    ) {
        reconnected.mark_unchanged();
        // A catch-up that failed (the connection dropped again, a read timed out) is tried
        // again, a few times, while live messages wait in the subscription.
        let mut retries = 0;
        let retry = tokio::time::sleep(std::time::Duration::ZERO);
        tokio::pin!(retry);
        loop {
            tokio::select! {
                message = subscriber.next() => match message {
                    Some(message) => self.heard(&message),
                    None => return,
                },
                changed = reconnected.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    retries = 0;
                    if !self.catch_up().await {
                        retries = CATCH_UP_TRIES;
                        retry.as_mut().reset(tokio::time::Instant::now() + CATCH_UP_RETRY);
                    }
                }
                () = &mut retry, if retries > 0 => {
                    retries -= 1;
                    if self.catch_up().await {
                        retries = 0;
                    } else {
                        retry.as_mut().reset(tokio::time::Instant::now() + CATCH_UP_RETRY);
                    }
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
        self.hand_over(epoch, Publication { offset, record });
    }

    /// Hands `publication` to the sink unless a catch-up already did.
    fn hand_over(&mut self, epoch: Epoch, publication: Publication) {
        if let Some((last_epoch, last)) = &self.last {
            if *last_epoch == epoch && publication.offset <= *last {
                return;
            }
        }
        self.live
            .sink
            .on_publication(&self.channel, &epoch, &publication);
        self.last = Some((epoch, publication.offset));
    }

    /// Reads from history what was published while the connection was down; false when
    /// it could not (worth trying again).
    async fn catch_up(&mut self) -> bool {
        let Some((epoch, offset)) = self.last.clone().or_else(|| self.floor.clone()) else {
            // Nothing was published when this node subscribed, nor heard since: read from
            // the start.
            return self.read_since(None).await;
        };
        self.read_since(Some(Since {
            offset,
            epoch: Some(epoch),
        }))
        .await
    }

    async fn read_since(&mut self, since: Option<Since>) -> bool {
        // The subscription is made again by the client before it reports the connection
        // back; a ping makes sure the server has it before history is read.
        let _ = self.live.client.flush().await;
        let query = HistoryQuery {
            since: Some(since.unwrap_or(Since {
                offset: 0,
                epoch: None,
            })),
            limit: usize::MAX,
            max_bytes: None,
        };
        match self.live.store.history(&self.channel, &query).await {
            Ok(history) => {
                for publication in history.publications {
                    self.live.caught_up.fetch_add(1, Relaxed);
                    self.hand_over(history.position.epoch.clone(), publication);
                }
                true
            }
            // Not covered: the hub sees the gap at the next publication and has its clients
            // resume.
            Err(BrokerError::Unrecoverable { .. }) => true,
            Err(e) => {
                tracing::info!(channel = %self.channel, error = %e, "nats: could not catch up after a reconnect");
                false
            }
        }
    }
}

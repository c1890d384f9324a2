//! Idempotent publishing for brokers in the node's own process (memory, durable): a
//! publish that carries a key the channel saw within the window publishes nothing and
//! answers with the first one's position. A second publish with a key whose first is still
//! being stored waits for it, so two at once publish once.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use herald_protocol::{ChannelName, StreamPosition};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::BrokerError;

/// Keys kept per channel at most: past it, the oldest go first, whatever their age.
pub const KEYS_PER_CHANNEL: usize = 10_000;

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 128;

#[derive(Debug)]
enum Seen {
    /// Being stored: who waits, hears the outcome (`None`: it failed).
    Pending(watch::Receiver<Option<Option<StreamPosition>>>),
    /// Stored at this position; forgotten after `until`.
    Done(StreamPosition, Instant),
}

#[derive(Debug, Default)]
struct Channel {
    keys: HashMap<String, Seen>,
    /// Keys in the order they were first seen, to forget the oldest past the cap.
    order: VecDeque<String>,
}

/// The keys seen, per channel.
#[derive(Debug, Default)]
pub struct Once {
    channels: Mutex<HashMap<ChannelName, Channel>>,
}

/// What to do with a publish that carries a key.
enum Step {
    /// Publish, then report with the sender.
    First(watch::Sender<Option<Option<StreamPosition>>>),
    /// Already stored there.
    Repeat(StreamPosition),
    /// Wait for the first to finish, then look again.
    Wait(watch::Receiver<Option<Option<StreamPosition>>>),
}

impl Once {
    /// Publishes with `publish` unless `key` was published to `channel` within `window`:
    /// the position, and whether it is a repeat.
    pub async fn publish<F, Fut>(
        &self,
        channel: &ChannelName,
        key: &str,
        window: Duration,
        publish: F,
    ) -> Result<(StreamPosition, bool), BrokerError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<StreamPosition, BrokerError>>,
    {
        let mut publish = Some(publish);
        loop {
            match self.step(channel, key) {
                Step::Repeat(position) => return Ok((position, true)),
                Step::Wait(mut rx) => {
                    // The first one's outcome; a failed first leaves the key free.
                    let _ = rx.wait_for(|o| o.is_some()).await;
                }
                Step::First(tx) => {
                    let publish = publish.take().expect("a key is published once per call");
                    let done = publish().await;
                    let position = done.as_ref().ok().cloned();
                    self.finish(channel, key, position.clone(), window);
                    let _ = tx.send(Some(position));
                    return done.map(|p| (p, false));
                }
            }
        }
    }

    fn step(&self, channel: &ChannelName, key: &str) -> Step {
        let mut channels = self.channels.lock();
        let now = Instant::now();
        let keys = channels.entry(channel.clone()).or_default();
        match keys.keys.get(key) {
            Some(Seen::Done(position, until)) if *until > now => {
                return Step::Repeat(position.clone())
            }
            Some(Seen::Pending(rx)) => return Step::Wait(rx.clone()),
            _ => {}
        }
        let (tx, rx) = watch::channel(None);
        if keys
            .keys
            .insert(key.to_string(), Seen::Pending(rx))
            .is_none()
        {
            keys.order.push_back(key.to_string());
        }
        while keys.order.len() > KEYS_PER_CHANNEL {
            if let Some(oldest) = keys.order.pop_front() {
                keys.keys.remove(&oldest);
            }
        }
        Step::First(tx)
    }

    fn finish(
        &self,
        channel: &ChannelName,
        key: &str,
        position: Option<StreamPosition>,
        window: Duration,
    ) {
        let mut channels = self.channels.lock();
        let Some(keys) = channels.get_mut(channel) else {
            return;
        };
        match position {
            Some(position) => {
                if let Some(seen) = keys.keys.get_mut(key) {
                    *seen = Seen::Done(position, Instant::now() + window);
                }
            }
            None => {
                keys.keys.remove(key);
                keys.order.retain(|k| k != key);
            }
        }
        // Forget what expired, oldest first (they are in the order they were first seen).
        let now = Instant::now();
        while let Some(oldest) = keys.order.front() {
            match keys.keys.get(oldest) {
                Some(Seen::Done(_, until)) if *until <= now => {
                    keys.keys.remove(oldest);
                    keys.order.pop_front();
                }
                _ => break,
            }
        }
        if keys.keys.is_empty() {
            channels.remove(channel);
        }
    }
}

//! How long a publication takes from being published to reaching this node, measured with a
//! probe on the publications' own path: a JetStream publish to `PREFIX.q.{NODE}` in the
//! stream `PREFIX_probe`, republished to `PREFIX.lag.{NODE}`, where this node listens.
//! One probe at a time, every third of `unreachable_after`; a probe not back after
//! [`PROBE_LOST`] counts as its age, so a stalled path shows as a growing lag.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use async_nats::{
    jetstream::{
        self,
        stream::{Config, DiscardPolicy, Republish, StorageType},
    },
    Client,
};
use bytes::Bytes;
use futures_util::StreamExt;
use herald_broker::BrokerError;
use parking_lot::Mutex;
use tokio::task::AbortHandle;

use crate::{names::Names, unavailable};

/// A probe not back after this long was lost (with a dropped connection): another is sent.
const PROBE_LOST: Duration = Duration::from_secs(10);

/// The node's probe and what it found.
#[derive(Debug, Default)]
struct Probe {
    /// The probe out: its number and when it was published.
    out: Option<(u64, Instant)>,
    /// How long the last one took.
    last: Duration,
    sent: u64,
}

/// The probe's tasks, and the lag they measure.
pub(crate) struct Lag {
    probe: Arc<Mutex<Probe>>,
    tasks: [AbortHandle; 2],
}

impl Lag {
    /// Finds or makes the probe stream and starts probing every `every`.
    pub(crate) async fn start(
        client: Client,
        js: jetstream::Context,
        names: &Names,
        node: &str,
        every: Duration,
        replicas: usize,
    ) -> Result<Self, BrokerError> {
        let prefix = names.prefix();
        js.get_or_create_stream(Config {
            name: format!("{prefix}_probe"),
            subjects: vec![format!("{prefix}.q.>")],
            max_messages_per_subject: 1,
            max_age: Duration::from_secs(60),
            discard: DiscardPolicy::Old,
            storage: StorageType::File,
            num_replicas: replicas,
            republish: Some(Republish {
                source: format!("{prefix}.q.>"),
                destination: format!("{prefix}.lag.>"),
                headers_only: false,
            }),
            ..Default::default()
        })
        .await
        .map_err(|e| BrokerError::Unavailable(format!("nats: stream {prefix}_probe: {e}")))?;
        let heard = client
            .subscribe(format!("{prefix}.lag.{node}"))
            .await
            .map_err(unavailable)?;
        let probe: Arc<Mutex<Probe>> = Arc::default();
        let listening = tokio::spawn(hear(heard, probe.clone()));
        let sending = tokio::spawn(send(js, format!("{prefix}.q.{node}"), every, probe.clone()));
        Ok(Self {
            probe,
            tasks: [listening.abort_handle(), sending.abort_handle()],
        })
    }

    /// How long the last probe took, or how long the one out has been out if that is longer.
    pub(crate) fn lag(&self) -> Duration {
        let probe = self.probe.lock();
        let waiting = probe.out.map_or(Duration::ZERO, |(_, sent)| sent.elapsed());
        probe.last.max(waiting)
    }
}

impl Drop for Lag {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn send(js: jetstream::Context, subject: String, every: Duration, probe: Arc<Mutex<Probe>>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let number = {
            let mut probe = probe.lock();
            if matches!(probe.out, Some((_, sent)) if sent.elapsed() < PROBE_LOST) {
                continue;
            }
            probe.sent += 1;
            let number = probe.sent;
            probe.out = Some((number, Instant::now()));
            number
        };
        // Not waited for: the probe's way back is what is measured.
        if let Err(e) = js
            .publish(subject.clone(), Bytes::from(number.to_string()))
            .await
        {
            tracing::debug!(error = %e, "nats: could not send a lag probe");
        }
    }
}

async fn hear(mut heard: async_nats::Subscriber, probe: Arc<Mutex<Probe>>) {
    while let Some(message) = heard.next().await {
        let Some(number) = std::str::from_utf8(&message.payload)
            .ok()
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let mut probe = probe.lock();
        if let Some((out, sent)) = probe.out {
            if out == number {
                probe.last = sent.elapsed();
                probe.out = None;
            }
        }
    }
}

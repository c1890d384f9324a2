//! The pub/sub connection itself, whatever the topology: one Redis's (`SUBSCRIBE` on one
//! connection), or a cluster's (each channel's publications `SSUBSCRIBE`d at the primary of
//! its slot; the nodes' own messages on classic pub/sub, which a cluster carries to every
//! node).
//!
//! On a cluster a node's connection can drop, or a slot can move to another primary (the
//! server then unsubscribes its shard channels), while the others go on. redis-rs would
//! resubscribe by itself, but nothing says when, so what was published in between could be
//! missed without a trace: the listener treats either as a lost connection instead, and
//! reconnects, resubscribes and catches up from history, as on one Redis.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use redis::{aio::PubSubSink, cluster_async::ClusterConnection, PushKind, RedisResult};

use crate::endpoint::Endpoint;

/// `SSUBSCRIBE`s sent at once on a cluster (one per slot: a command never spans two).
const SUBSCRIBE_PARALLEL: usize = 64;

/// The pub/sub connection's command half.
#[derive(Clone)]
pub(super) enum Subscriber {
    Single(PubSubSink),
    Cluster(ClusterConnection),
}

/// What the pub/sub connection hears.
pub(super) enum Heard {
    /// A message on a subscribed channel.
    Message(redis::Msg),
    /// The server unsubscribed this shard channel (its slot moved): lost, unless the
    /// listener asked for it.
    Unsubscribed(String),
    /// A cluster node's connection dropped: what it carried meanwhile may be lost.
    Dropped,
}

/// What the connection hears, until it closes.
pub(super) type Messages = Pin<Box<dyn Stream<Item = Heard> + Send>>;

/// A new pub/sub connection to wherever `endpoint` says.
pub(super) async fn connect(endpoint: &Endpoint) -> Result<(Subscriber, Messages), String> {
    if endpoint.is_cluster() {
        let (connection, pushes) = endpoint.cluster_pubsub().await.map_err(|e| e.to_string())?;
        let heard = futures_util::stream::unfold(pushes, |mut pushes| async move {
            let push = pushes.recv().await?;
            Some((push, pushes))
        })
        .filter_map(|push| async move { heard(push) });
        return Ok((Subscriber::Cluster(connection), Box::pin(heard)));
    }
    let client = endpoint.client().await.map_err(|e| e.to_string())?;
    let pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
    let (sink, messages) = pubsub.split();
    Ok((
        Subscriber::Single(sink),
        Box::pin(messages.map(Heard::Message)),
    ))
}

/// What a cluster node's push means to the listener; `None` for confirmations.
fn heard(push: redis::PushInfo) -> Option<Heard> {
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            redis::Msg::from_push_info(push).map(Heard::Message)
        }
        PushKind::SUnsubscribe => {
            let name = push.data.first()?;
            let name: String = redis::from_redis_value_ref(name).ok()?;
            Some(Heard::Unsubscribed(name))
        }
        PushKind::Disconnection => Some(Heard::Dropped),
        _ => None,
    }
}

impl Subscriber {
    /// Subscribes to channels' publications (`streams`) and to the nodes' own channels
    /// (`control`), and returns once every subscription is confirmed.
    pub(super) async fn subscribe(
        &mut self,
        streams: &[String],
        control: &[String],
    ) -> RedisResult<()> {
        match self {
            Subscriber::Single(sink) => {
                let all: Vec<&String> = streams.iter().chain(control).collect();
                if all.is_empty() {
                    return Ok(());
                }
                sink.subscribe(all).await
            }
            Subscriber::Cluster(connection) => {
                if !control.is_empty() {
                    connection.subscribe(control).await?;
                }
                // One SSUBSCRIBE per slot, for every channel in it.
                let mut by_slot: std::collections::HashMap<u16, Vec<String>> =
                    std::collections::HashMap::new();
                for name in streams {
                    let slot = crate::slot::slot(name.as_bytes());
                    by_slot.entry(slot).or_default().push(name.clone());
                }
                let mut waiting = by_slot.into_values();
                let mut running = futures_util::stream::FuturesUnordered::new();
                loop {
                    while running.len() < SUBSCRIBE_PARALLEL {
                        let Some(names) = waiting.next() else { break };
                        let mut connection = connection.clone();
                        running.push(async move { connection.ssubscribe(names).await });
                    }
                    match running.next().await {
                        Some(done) => done?,
                        None => break,
                    }
                }
                Ok(())
            }
        }
    }

    /// Unsubscribes from one channel's publications.
    pub(super) async fn unsubscribe(&mut self, stream: &str) -> RedisResult<()> {
        match self {
            Subscriber::Single(sink) => sink.unsubscribe(stream).await,
            Subscriber::Cluster(connection) => connection.sunsubscribe(stream).await,
        }
    }

    /// Whether the connection answers (on a cluster: every node's).
    pub(super) async fn ping(&mut self) -> RedisResult<()> {
        match self {
            Subscriber::Single(sink) => sink.ping::<redis::Value>().await.map(drop),
            Subscriber::Cluster(connection) => redis::cmd("PING")
                .query_async::<redis::Value>(connection)
                .await
                .map(drop),
        }
    }
}

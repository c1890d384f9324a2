//! Failed broker calls, counted by operation: the node's broker (and its link to other
//! nodes) wrapped once, so every caller (sessions, the API, the hub, the events log, the
//! operators' actions) is counted without knowing it.

use std::sync::Weak;

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    Broker, BrokerError, History, HistoryQuery, NodeLink, NodeRequests, SharedBroker, SharedLink,
    StreamPolicy,
};
use herald_protocol::{ChannelName, StreamPosition};
use prometheus_client::metrics::counter::Counter;

use super::Metrics;

/// A broker whose failed calls are counted in `herald_broker_errors_total{operation}`.
pub struct Counted {
    inner: SharedBroker,
    /// By operation, in the order of [`OPERATIONS`].
    errors: Vec<Counter>,
}

const OPERATIONS: [&str; 5] = [
    "publish",
    "history",
    "remove_history",
    "subscribe",
    "unsubscribe",
];

/// The link's, counted the same way.
const LINK_OPERATIONS: [&str; 3] = ["ask_node", "report_node", "nodes"];

fn counters(metrics: &Metrics, operations: &[&'static str]) -> Vec<Counter> {
    operations
        .iter()
        .map(|op| metrics.broker_errors(op))
        .collect()
}

fn counted<T>(
    errors: &[Counter],
    operation: usize,
    result: Result<T, BrokerError>,
) -> Result<T, BrokerError> {
    if result.is_err() {
        errors[operation].inc();
    }
    result
}

impl Counted {
    /// `inner`, counted in `metrics`.
    pub fn wrap(inner: SharedBroker, metrics: &Metrics) -> SharedBroker {
        let errors = counters(metrics, &OPERATIONS);
        std::sync::Arc::new(Self { inner, errors })
    }
}

/// A link whose failed calls are counted in `herald_broker_errors_total{operation}`.
pub struct CountedLink {
    inner: SharedLink,
    /// By operation, in the order of [`LINK_OPERATIONS`].
    errors: Vec<Counter>,
}

impl CountedLink {
    /// `inner`, counted in `metrics`.
    pub fn wrap(inner: SharedLink, metrics: &Metrics) -> SharedLink {
        let errors = counters(metrics, &LINK_OPERATIONS);
        std::sync::Arc::new(Self { inner, errors })
    }
}

#[async_trait]
impl NodeLink for CountedLink {
    fn node_id(&self) -> &str {
        self.inner.node_id()
    }

    async fn ask_node(&self, node: &str, request: Bytes) -> Result<Bytes, BrokerError> {
        counted(&self.errors, 0, self.inner.ask_node(node, request).await)
    }

    fn answer_nodes_with(&self, handler: Weak<dyn NodeRequests>) {
        self.inner.answer_nodes_with(handler);
    }

    async fn report_node(&self, figures: Bytes) -> Result<(), BrokerError> {
        counted(&self.errors, 1, self.inner.report_node(figures).await)
    }

    async fn nodes(&self) -> Result<Vec<Bytes>, BrokerError> {
        counted(&self.errors, 2, self.inner.nodes().await)
    }
}

#[async_trait]
impl Broker for Counted {
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError> {
        counted(
            &self.errors,
            0,
            self.inner.publish(channel, data, policy).await,
        )
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: std::time::Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        counted(
            &self.errors,
            0,
            self.inner
                .publish_once(channel, data, policy, key, window)
                .await,
        )
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        counted(&self.errors, 1, self.inner.history(channel, query).await)
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        counted(&self.errors, 2, self.inner.remove_history(channel).await)
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        counted(&self.errors, 3, self.inner.subscribe(channel).await)
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        counted(&self.errors, 4, self.inner.unsubscribe(channel).await)
    }

    fn channel_count(&self) -> usize {
        self.inner.channel_count()
    }

    fn health(&self) -> Result<(), String> {
        self.inner.health()
    }

    fn delivery_lag(&self) -> Option<std::time::Duration> {
        self.inner.delivery_lag()
    }

    fn reach(&self) -> Option<herald_broker::Reach> {
        self.inner.reach()
    }
}

#[cfg(test)]
mod tests {
    /// A decorator must forward every method: a default left in place would silently
    /// hide the inner broker's answer (as `node_id` once would have).
    #[test]
    fn forwards_what_it_does_not_count() {
        let source = include_str!("broker.rs");
        for (file, name) in [
            (
                include_str!("../../../broker/src/lib.rs"),
                "pub trait Broker",
            ),
            (
                include_str!("../../../broker/src/link.rs"),
                "pub trait NodeLink",
            ),
        ] {
            forwards(source, file, name);
        }
    }

    fn forwards(source: &str, trait_source: &str, name: &str) {
        let start = trait_source.find(name).unwrap();
        let end = start + trait_source[start..].find("\n}\n").unwrap();
        for line in trait_source[start..end].lines() {
            let line = line.trim();
            let Some(rest) = line.strip_prefix("async fn ").or(line.strip_prefix("fn ")) else {
                continue;
            };
            let name = &rest[..rest.find('(').unwrap()];
            assert!(
                source.contains(&format!("fn {name}(")),
                "Counted does not forward {name}"
            );
        }
    }
}

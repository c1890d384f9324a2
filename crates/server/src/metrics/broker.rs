//! Failed broker calls, counted by operation: the node's broker wrapped once, so every
//! caller (sessions, the API, the hub, the events log) is counted without knowing it.

use std::sync::Weak;

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    Broker, BrokerError, History, HistoryQuery, NodeRequests, SharedBroker, SharedPresence,
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

const OPERATIONS: [&str; 8] = [
    "publish",
    "history",
    "remove_history",
    "subscribe",
    "unsubscribe",
    "ask_node",
    "report_node",
    "nodes",
];

impl Counted {
    /// `inner`, counted in `metrics`.
    pub fn wrap(inner: SharedBroker, metrics: &Metrics) -> SharedBroker {
        let errors = OPERATIONS
            .iter()
            .map(|op| metrics.broker_errors(op))
            .collect();
        std::sync::Arc::new(Self { inner, errors })
    }

    fn counted<T>(
        &self,
        operation: usize,
        result: Result<T, BrokerError>,
    ) -> Result<T, BrokerError> {
        if result.is_err() {
            self.errors[operation].inc();
        }
        result
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
        self.counted(0, self.inner.publish(channel, data, policy).await)
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        self.counted(1, self.inner.history(channel, query).await)
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.counted(2, self.inner.remove_history(channel).await)
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.counted(3, self.inner.subscribe(channel).await)
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.counted(4, self.inner.unsubscribe(channel).await)
    }

    fn channel_count(&self) -> usize {
        self.inner.channel_count()
    }

    fn health(&self) -> Result<(), String> {
        self.inner.health()
    }

    fn node_id(&self) -> Option<&str> {
        self.inner.node_id()
    }

    async fn ask_node(&self, node: &str, request: Bytes) -> Option<Result<Bytes, BrokerError>> {
        let answer = self.inner.ask_node(node, request).await?;
        Some(self.counted(5, answer))
    }

    fn answer_nodes_with(&self, handler: Weak<dyn NodeRequests>) {
        self.inner.answer_nodes_with(handler);
    }

    fn presence(&self) -> Option<SharedPresence> {
        self.inner.presence()
    }

    async fn report_node(&self, figures: Bytes) -> Result<(), BrokerError> {
        self.counted(6, self.inner.report_node(figures).await)
    }

    async fn nodes(&self) -> Option<Result<Vec<Bytes>, BrokerError>> {
        let nodes = self.inner.nodes().await?;
        Some(self.counted(7, nodes))
    }

    fn delivery_lag(&self) -> Option<std::time::Duration> {
        self.inner.delivery_lag()
    }
}

#[cfg(test)]
mod tests {
    /// A decorator must forward every method: a default left in place would silently
    /// hide the inner broker's answer (as `node_id` once would have).
    #[test]
    fn forwards_what_it_does_not_count() {
        let source = include_str!("broker.rs");
        let trait_source = include_str!("../../../broker/src/lib.rs");
        let start = trait_source.find("pub trait Broker").unwrap();
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

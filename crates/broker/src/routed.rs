//! Two brokers behind one: each channel goes to one of them by a rule (durable
//! namespaces to the durable store, the rest to memory).

use async_trait::async_trait;
use bytes::Bytes;
use herald_protocol::{ChannelName, StreamPosition};

use crate::{Broker, BrokerError, History, HistoryQuery, SharedBroker, StreamPolicy};

/// Sends each channel to `durable` when `is_durable` says so, else to `memory`.
pub struct Routed {
    durable: SharedBroker,
    memory: SharedBroker,
    is_durable: Box<dyn Fn(&ChannelName) -> bool + Send + Sync>,
}

impl std::fmt::Debug for Routed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routed").finish_non_exhaustive()
    }
}

impl Routed {
    /// A broker routing by `is_durable`.
    pub fn new(
        durable: SharedBroker,
        memory: SharedBroker,
        is_durable: impl Fn(&ChannelName) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            durable,
            memory,
            is_durable: Box::new(is_durable),
        }
    }

    fn pick(&self, channel: &ChannelName) -> &SharedBroker {
        if (self.is_durable)(channel) {
            &self.durable
        } else {
            &self.memory
        }
    }
}

#[async_trait]
impl Broker for Routed {
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError> {
        self.pick(channel).publish(channel, data, policy).await
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: std::time::Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        self.pick(channel)
            .publish_once(channel, data, policy, key, window)
            .await
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        self.pick(channel).history(channel, query).await
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.pick(channel).remove_history(channel).await
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.pick(channel).subscribe(channel).await
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.pick(channel).unsubscribe(channel).await
    }

    fn channel_count(&self) -> usize {
        self.durable.channel_count() + self.memory.channel_count()
    }

    fn health(&self) -> Result<(), String> {
        self.durable.health().and(self.memory.health())
    }
}

//! A remote broker's calls made for clients, bounded in time. A subscription or a history
//! read waits on the broker inside the connection's own loop; on a broker out of reach it
//! would wait out the client library's timeouts (seconds, several times over), and the
//! connection would hear nothing meanwhile, not even the node's order to move its clients.
//! Past `command_timeout` such a call is refused for now (121), and the connection goes on.
//! Publications keep their own deadline and its "outcome unknown" (see [`crate::publish`]).

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{Broker, BrokerError, History, HistoryQuery, SharedBroker, StreamPolicy};
use herald_protocol::{ChannelName, StreamPosition};
use std::time::Duration;

/// `inner`, its waits bounded by `limit`.
pub struct Bounded {
    inner: SharedBroker,
    limit: Duration,
}

impl Bounded {
    /// `inner` with its calls bounded by `limit`, for a remote broker; an embedded one as it
    /// is (its own store answers for itself).
    pub fn wrap(inner: SharedBroker, limit: Duration) -> SharedBroker {
        if inner.reach().is_none() {
            return inner;
        }
        std::sync::Arc::new(Self { inner, limit })
    }

    async fn within<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        tokio::time::timeout(self.limit, call)
            .await
            .unwrap_or_else(|_| {
                Err(BrokerError::Unavailable(format!(
                    "the broker did not answer a {what} within {:?}",
                    self.limit
                )))
            })
    }
}

#[async_trait]
impl Broker for Bounded {
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError> {
        self.inner.publish(channel, data, policy).await
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        self.inner
            .publish_once(channel, data, policy, key, window)
            .await
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        self.within("history read", self.inner.history(channel, query))
            .await
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.within("history removal", self.inner.remove_history(channel))
            .await
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.within("subscription", self.inner.subscribe(channel))
            .await
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.within("unsubscription", self.inner.unsubscribe(channel))
            .await
    }

    fn channel_count(&self) -> usize {
        self.inner.channel_count()
    }

    fn health(&self) -> Result<(), String> {
        self.inner.health()
    }

    fn delivery_lag(&self) -> Option<Duration> {
        self.inner.delivery_lag()
    }

    fn reach(&self) -> Option<herald_broker::Reach> {
        self.inner.reach()
    }
}

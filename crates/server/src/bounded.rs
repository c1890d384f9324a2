//! A remote broker's calls, bounded in time. A subscription or a history read waits on the
//! broker inside the connection's own loop; on a broker out of reach it would wait out the
//! client library's timeouts (seconds, several times over), and the connection would hear
//! nothing meanwhile, not even the node's order to move its clients. Past `command_timeout`
//! such a call fails as unavailable (121 to the client), and the connection goes on. A
//! publication waits at most `publish_timeout`, and a failure then means "outcome unknown"
//! (122, see [`crate::publish`]): it was sent, and may be stored.

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{Broker, BrokerError, History, HistoryQuery, SharedBroker, StreamPolicy};
use herald_protocol::{ChannelName, StreamPosition};
use std::time::Duration;

use crate::settings::BrokerLimits;

/// `inner`, its waits bounded by `limits`.
pub struct Bounded {
    inner: SharedBroker,
    limits: BrokerLimits,
}

impl Bounded {
    /// `inner` with its calls bounded by `limits`, for a remote broker; an embedded one as
    /// it is (its own store answers for itself).
    pub fn wrap(inner: SharedBroker, limits: BrokerLimits) -> SharedBroker {
        if inner.reach().is_none() {
            return inner;
        }
        std::sync::Arc::new(Self { inner, limits })
    }

    async fn within<T>(
        &self,
        what: &str,
        limit: Duration,
        call: impl std::future::Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(BrokerError::Unavailable(format!(
                "the broker did not answer a {what} within {limit:?}"
            )))
        })
    }

    /// [`Bounded::within`] `command_timeout`: anything but a publication.
    async fn command<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        self.within(what, self.limits.command_timeout, call).await
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
        let publishing = self.inner.publish(channel, data, policy);
        self.within("publication", self.limits.publish_timeout, publishing)
            .await
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        let publishing = self.inner.publish_once(channel, data, policy, key, window);
        self.within("publication", self.limits.publish_timeout, publishing)
            .await
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        self.command("history read", self.inner.history(channel, query))
            .await
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.command("history removal", self.inner.remove_history(channel))
            .await
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.command("subscription", self.inner.subscribe(channel))
            .await
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.command("unsubscription", self.inner.unsubscribe(channel))
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

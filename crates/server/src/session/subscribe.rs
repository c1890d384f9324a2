//! Subscribing, with resume from a position, and the `history` command.

use herald_broker::{BrokerError, History, HistoryQuery};
use herald_protocol::{
    command::{HistoryRequest, SubscribeRequest},
    json::results,
    ErrorCode,
};

use super::{Position, Reply, Session};
use crate::{error::Failure, history};

impl Session {
    /// Joins the hub first, then reads history: publications that race with the read
    /// arrive through the queue as well, and [`Session::write_deliveries`] drops the
    /// ones already replayed. Nothing falls between the two.
    pub(super) async fn subscribe(
        &mut self,
        reply: Reply,
        req: SubscribeRequest,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let node = self.node().clone();
        let channel = req.channel;
        if !node
            .settings
            .namespace(channel.namespace())
            .client_subscribe
        {
            return Err(Failure::new(
                ErrorCode::PermissionDenied,
                format!("clients may not subscribe to {channel}: its namespace does not allow client_subscribe"),
            ));
        }
        if self.subscriptions.contains_key(&channel) {
            return Err(Failure::new(
                ErrorCode::AlreadySubscribed,
                format!("already subscribed to {channel}"),
            ));
        }
        let limit = node.settings.config.client.max_subscriptions;
        if self.subscriptions.len() >= limit {
            return Err(Failure::new(
                ErrorCode::LimitExceeded,
                format!("at most {limit} subscriptions per connection"),
            ));
        }
        node.hub
            .subscribe(&node.broker, &channel, self.id(), self.queue.clone())
            .await?;

        let max = node.settings.config.client.max_history_limit;
        let read = match req.since {
            None => node
                .broker
                .history(
                    &channel,
                    HistoryQuery {
                        since: None,
                        limit: 0,
                    },
                )
                .await
                .map(|h| (h, None)),
            Some(since) => {
                // One more than allowed tells "too many to replay" from "exactly the cap".
                let query = HistoryQuery {
                    since: Some(since),
                    limit: max + 1,
                };
                match node.broker.history(&channel, query).await {
                    Ok(h) if h.publications.len() <= max => Ok((h, Some(true))),
                    Ok(h) => Ok((
                        History {
                            position: h.position,
                            publications: Vec::new(),
                        },
                        Some(false),
                    )),
                    Err(BrokerError::Unrecoverable { current }) => Ok((
                        History {
                            position: current,
                            publications: Vec::new(),
                        },
                        Some(false),
                    )),
                    Err(e) => Err(e),
                }
            }
        };
        let (history, recovered) = match read {
            Ok(read) => read,
            Err(e) => {
                node.hub
                    .unsubscribe(&node.broker, &channel, self.id())
                    .await;
                return Err(e.into());
            }
        };
        let position = history.position;
        self.subscriptions.insert(
            channel,
            Position {
                epoch: position.epoch.clone(),
                offset: position.offset,
            },
        );
        Ok(reply.with(&results::Stream {
            epoch: &position.epoch,
            offset: position.offset,
            recovered,
            publications: &history.publications,
        }))
    }

    pub(super) async fn history(
        &mut self,
        reply: Reply,
        req: HistoryRequest,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let node = self.node().clone();
        if !node
            .settings
            .namespace(req.channel.namespace())
            .client_history
        {
            return Err(Failure::new(
                ErrorCode::PermissionDenied,
                format!("clients may not read the history of {}: its namespace does not allow client_history", req.channel),
            ));
        }
        let h = history::read(
            &node,
            &req.channel,
            req.since,
            req.limit.map(|l| l as usize),
        )
        .await?;
        Ok(reply.with(&results::Stream {
            epoch: &h.position.epoch,
            offset: h.position.offset,
            recovered: None,
            publications: &h.publications,
        }))
    }
}

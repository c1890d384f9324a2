//! Subscribing, with resume from a position, and the `history` command.

use std::sync::Arc;

use herald_broker::{BrokerError, History, HistoryQuery};
use herald_protocol::{
    command::{HistoryRequest, SubscribeRequest},
    json::{self, results},
    ChannelName, Epoch, ErrorCode, Publication, Since, StreamPosition,
};

use super::{Positions, Reply, Session};
use crate::{error::Failure, history, queue::Position};

impl Session {
    pub(super) async fn subscribe(
        &mut self,
        reply: Reply,
        req: SubscribeRequest,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let (position, recovered, history) = self.join(req.channel, req.since).await?;
        Ok(reply.with(&results::Stream {
            epoch: &position.epoch,
            offset: position.offset,
            recovered,
            publications: &history,
        }))
    }

    /// Subscribes for a transport that names its channels in the request (SSE,
    /// streaming, polling). Emits a `subscribe` push (unless a resume with a known epoch
    /// was complete), then
    /// each replayed publication as a `pub` push, each with the positions right after it,
    /// exactly as if they had arrived live.
    pub async fn open_channel(
        &mut self,
        channel: ChannelName,
        since: Option<Since>,
        mut emit: impl FnMut(&[u8], Positions<'_>),
    ) -> Result<(), Failure> {
        let known_epoch = since.as_ref().and_then(|s| s.epoch.clone());
        let (position, recovered, history) = self.join(channel.clone(), since).await?;
        if let Some(first) = history.first() {
            // Walk the position forward through the replay so each event's cursor is exact.
            self.set_offset(&channel, first.offset - 1);
        }
        // A complete resume in the epoch the client named needs no announcement. (Offset 0
        // resumes in any epoch; the client must then learn the new one.)
        if recovered != Some(true) || known_epoch.as_ref() != Some(&position.epoch) {
            #[derive(serde::Serialize)]
            struct Opened<'a> {
                channel: &'a ChannelName,
                epoch: &'a Epoch,
                offset: u64,
                #[serde(skip_serializing_if = "Option::is_none")]
                recovered: Option<bool>,
            }
            let opened = Opened {
                channel: &channel,
                epoch: &position.epoch,
                offset: position.offset,
                recovered,
            };
            let push = serde_json::to_vec(&serde_json::json!({ "subscribe": opened }))
                .expect("serialises");
            emit(&push, self.positions());
        }
        for p in &history {
            self.set_offset(&channel, p.offset);
            emit(&json::encode_pub(&channel, p), self.positions());
        }
        Ok(())
    }

    /// Joins the hub first, then reads history: publications that race with the read
    /// arrive through the queue as well, and [`Session::drain`] drops the ones already
    /// replayed. Nothing falls between the two.
    async fn join(
        &mut self,
        channel: ChannelName,
        since: Option<Since>,
    ) -> Result<(StreamPosition, Option<bool>, Vec<Publication>), Failure> {
        let node = self.node().clone();
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
        let started = Arc::new(Position::default());
        node.hub
            .subscribe(
                &node.broker,
                &channel,
                self.id(),
                self.queue.clone(),
                started.clone(),
            )
            .await?;

        let max = node.settings.config.client.max_history_limit;
        let read = match since {
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
        started.start(position.epoch.clone(), position.offset);
        self.subscriptions.insert(channel, started);
        Ok((position, recovered, history.publications))
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

//! Subscribing, with resume from a position, and the `history` command.

use std::sync::Arc;

use herald_broker::{check_since, BrokerError, History, HistoryQuery};
use herald_protocol::{
    command::{HistoryRequest, SubscribeRequest},
    results, ChannelName, ErrorCode, Outcome, Publication, Push, Since, StreamPosition,
};

use super::{raw_json, Positions, Reply, Session};
use crate::{
    error::Failure,
    history, hooks,
    node::Node,
    policy::{self, Action},
    queue::Position,
    token::ChannelGrant,
};

/// How a subscription takes its channel's live publications, as its client asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Takes {
    /// As deltas from the previous one (`delta: "fossil"`).
    pub deltas: bool,
    /// Skipping those a later one of the same conflation key replaced while they waited
    /// (`conflate: true`).
    pub conflation: bool,
}

impl Session {
    pub(super) async fn subscribe(
        &mut self,
        reply: Reply,
        req: SubscribeRequest,
    ) -> Result<Option<Vec<u8>>, Failure> {
        if let Some(token) = &req.token {
            self.accept_channel_token(&req.channel, token).await?;
        }
        let joined = self
            .join(
                req.channel.clone(),
                req.since,
                None,
                Takes {
                    deltas: req.delta,
                    conflation: req.conflate,
                },
            )
            .await;
        if joined.is_err() && req.token.is_some() {
            self.drop_grant(&req.channel);
        }
        let joined = joined?;
        Ok(reply.with(Outcome::Subscribe(results::Stream {
            epoch: &joined.position.epoch,
            offset: joined.position.offset,
            recovered: joined.recovered,
            publications: &joined.publications,
            data: joined.data.as_deref().map(raw_json),
            delta: req.delta.then_some(herald_protocol::delta::FOSSIL),
        })))
    }

    /// Whether this session may open `channels` (one HTTP request's), checked before the
    /// request is answered, so that a refusal is still an HTTP status: each must allow
    /// subscribing, by the rules and by the subscribe hook where its namespace has one
    /// (whose answers [`Session::join`] then uses instead of asking again), and together
    /// they must fit within `max_subscriptions`. Opening them can still fail later (the
    /// broker), not for these.
    pub async fn admit(
        &mut self,
        channels: &[(ChannelName, Option<Since>)],
    ) -> Result<(), Failure> {
        let node = self.node().clone();
        let limit = node.settings.config.client.max_subscriptions;
        if self.subscriptions.len() + channels.len() > limit {
            return Err(Failure::new(
                ErrorCode::LimitExceeded,
                format!("at most {limit} subscriptions per connection"),
            ));
        }
        self.cursor_fits(channels.iter().map(|(c, _)| c))?;
        // The rules for every channel first: a request they refuse costs the backend nothing.
        channels.iter().try_for_each(|(channel, _)| {
            policy::check(&node, self.asker(channel), Action::Subscribe, channel)
                .map_err(|f| f.about(channel))
        })?;
        for (channel, _) in channels {
            if node.settings.namespace(channel.namespace()).subscribe_hook {
                let asking = self.ask_subscribe_hook(channel, None);
                let answer = asking.await.map_err(|f| f.about(channel))?;
                self.credentials().admitted.push((channel.clone(), answer));
            }
        }
        Ok(())
    }

    /// Asks the subscribe hook whether this client may read `channel` (telling it what the
    /// client sent with its subscription, `params`, if anything); its answer's state on
    /// yes. Keeps nothing: the caller decides whether the yes outlives the call.
    async fn ask_subscribe_hook(
        &self,
        channel: &ChannelName,
        params: Option<&serde_json::value::RawValue>,
    ) -> Result<HookAnswer, Failure> {
        let node = self.node();
        let Some(hook) = node.settings.hooks.subscribe.as_ref() else {
            // Configuration refuses a namespace switch without its hook's address.
            return Err(Failure::new(
                ErrorCode::BackendUnavailable,
                "backend unavailable",
            ));
        };
        self.hook_budget()?;
        let request = hooks::SubscribeRequest {
            client: self.hook_client(),
            channel,
            params,
        };
        let answer: hooks::SubscribeResult = hook
            .call(&request)
            .await
            .map_err(|e| e.failure("subscribe"))?;
        let data = answer
            .data
            .map(|data| hooks::checked_data(&data, "subscribe"))
            .transpose()?;
        let info = answer
            .info
            .as_deref()
            .map(crate::token::checked_info)
            .transpose()
            .map_err(|e| {
                tracing::warn!(
                    "subscribe hook answered an `info` that cannot be kept: {e}; clients get 118"
                );
                hooks::HookError::Failed(format!("its {e}")).failure("subscribe")
            })?;
        Ok(HookAnswer {
            data,
            expires: answer.expires,
            info,
        })
    }

    /// Whether this client may read what was published to `channel` (`action`: history or
    /// presence): the rules, and in a namespace whose subscribe hook is on, the hook too,
    /// whose yes this connection holds only while subscribed (every subscription asked it).
    /// A hook that fails refuses (118): reading never reaches further than subscribing.
    pub(super) async fn may_read(
        &self,
        channel: &ChannelName,
        action: Action,
    ) -> Result<(), Failure> {
        let node = self.node();
        let ruled = policy::check(node, self.asker(channel), action, channel);
        // "Presence is off" (108) is no refusal of this client: the hook still decides
        // whether it may learn even that.
        if ruled
            .as_ref()
            .is_err_and(|f| f.code != ErrorCode::NotAvailable)
        {
            return ruled;
        }
        let hooked = node.settings.namespace(channel.namespace()).subscribe_hook;
        if hooked && !self.subscriptions.contains_key(channel) {
            self.ask_subscribe_hook(channel, None).await?;
        }
        ruled
    }

    /// Whether the cursor still fits the transport's bound with `more` channels added. An
    /// entry is counted at its longest (an epoch of 16 characters, an offset of 20 digits).
    fn cursor_fits<'c>(&self, more: impl Iterator<Item = &'c ChannelName>) -> Result<(), Failure> {
        let Some(bound) = self.cursor_bound else {
            return Ok(());
        };
        let entry = |c: &ChannelName| c.as_str().len() + 16 + 20 + 3;
        let length: usize =
            self.subscriptions.keys().map(entry).sum::<usize>() + more.map(entry).sum::<usize>();
        if length > bound {
            return Err(Failure::new(
                ErrorCode::LimitExceeded,
                format!(
                    "this stream's positions would not fit in its event id ({bound} bytes): \
                     subscribe to fewer or shorter channels, or use WebSocket"
                ),
            ));
        }
        Ok(())
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
        takes: Takes,
        mut emit: impl FnMut(&[u8], Positions<'_>),
    ) -> Result<(), Failure> {
        let known_epoch = since.as_ref().and_then(|s| s.epoch.clone());
        let Joined {
            position,
            recovered,
            publications: history,
            data,
        } = self.join(channel.clone(), since, None, takes).await?;
        if let Some(first) = history.first() {
            // Walk the position forward through the replay so each event's cursor is exact.
            self.set_offset(&channel, first.offset - 1);
        }
        // A complete resume in the epoch the client named needs no announcement. (Offset 0
        // resumes in any epoch; the client must then learn the new one.)
        // A hook's state is always announced: it is not in the client's positions.
        if recovered != Some(true)
            || known_epoch.as_ref() != Some(&position.epoch)
            || data.is_some()
        {
            let push = self.codec().push(&Push::Subscribe(&results::Subscribed {
                channel: &channel,
                epoch: &position.epoch,
                offset: position.offset,
                recovered,
                data: data.as_deref().map(raw_json),
            }));
            emit(&push, self.positions());
        }
        for p in &history {
            self.set_offset(&channel, p.offset);
            let push = self.codec().push(&Push::Pub {
                channel: &channel,
                publication: p,
            });
            emit(&push, self.positions());
        }
        Ok(())
    }

    /// Joins the hub first, then reads history: publications that race with the read
    /// arrive through the queue as well, and [`Session::drain`] drops the ones already
    /// replayed. Nothing falls between the two.
    pub(super) async fn join(
        &mut self,
        channel: ChannelName,
        since: Option<Since>,
        params: Option<&serde_json::value::RawValue>,
        takes: Takes,
    ) -> Result<Joined, Failure> {
        let node = self.node().clone();
        let hooked = node.settings.namespace(channel.namespace()).subscribe_hook;
        policy::check(&node, self.asker(&channel), Action::Subscribe, &channel)?;
        if self.subscriptions.contains_key(&channel) {
            return Err(Failure::new(
                ErrorCode::AlreadySubscribed,
                format!("already subscribed to {channel}"),
            ));
        }
        self.cursor_fits(std::iter::once(&channel))?;
        let limit = node.settings.config.client.max_subscriptions;
        if self.subscriptions.len() >= limit {
            return Err(Failure::new(
                ErrorCode::LimitExceeded,
                format!("at most {limit} subscriptions per connection"),
            ));
        }
        let data = if hooked {
            let admitted = self.auth.as_mut().and_then(|a| {
                let i = a.admitted.iter().position(|(c, _)| *c == channel)?;
                Some(a.admitted.swap_remove(i).1)
            });
            let answer = match admitted {
                Some(answer) => answer,
                None => self.ask_subscribe_hook(&channel, params).await?,
            };
            // The allowance is a grant for as long as the subscription lives (or
            // until its `expires`), so history and presence follow it.
            // A front's presence member (and its info) stays what the front granted.
            let (info, user, user_id) = self
                .granted(&channel)
                .map(|g| (g.info.clone(), g.user.clone(), g.user_id.clone()))
                .filter(|(_, user, _)| user.is_some())
                .unwrap_or((answer.info, None, None));
            self.grant(ChannelGrant {
                channel: channel.clone(),
                expires: answer.expires,
                info,
                user,
                user_id,
                sees_members: false,
            });
            answer.data
        } else {
            None
        };
        let may_read =
            policy::check(&node, self.asker(&channel), Action::History, &channel).is_ok();
        let started = Arc::new(Position::default());
        if takes.deltas {
            started.take_deltas();
        }
        if takes.conflation {
            started.conflate();
        }
        let subscribed = node
            .hub
            .subscribe(
                &node.broker,
                &channel,
                self.id(),
                self.queue.clone(),
                started.clone(),
                self.takes_join_leave(&channel),
            )
            .await;
        if let Err(e) = subscribed {
            if hooked {
                self.drop_grant(&channel);
            }
            return Err(e.into());
        }

        let read = match since {
            None => position_of(&node, &channel).await.map(|h| (h, None)),
            Some(since) => replay(&node, &channel, since, may_read).await,
        };
        let (history, recovered) = match read {
            Ok(read) => read,
            Err(e) => {
                node.hub
                    .unsubscribe(&node.broker, &channel, self.id())
                    .await;
                if hooked {
                    self.drop_grant(&channel);
                }
                return Err(e.into());
            }
        };
        let position = history.position;
        started.start(position.epoch.clone(), position.offset);
        self.event("subscribe", Some(&channel), None);
        self.join_presence(&channel).await;
        self.subscriptions.insert(channel, started);
        Ok(Joined {
            position,
            recovered,
            publications: history.publications,
            data,
        })
    }

    pub(super) async fn history(
        &mut self,
        reply: Reply,
        req: HistoryRequest,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let node = self.node().clone();
        self.may_read(&req.channel, Action::History).await?;
        let h = history::read(
            &node,
            &req.channel,
            req.since,
            req.limit.map(|l| l as usize),
        )
        .await?;
        Ok(reply.with(Outcome::History(results::Stream {
            epoch: &h.position.epoch,
            offset: h.position.offset,
            recovered: None,
            publications: &h.publications,
            data: None,
            delta: None,
        })))
    }
}

/// The subscribe hook's yes: the channel's state (checked JSON) and when the allowance
/// ends (Unix seconds).
/// The subscribe hook's yes: the channel's state for the client, when the grant ends, and
/// the connection's info in the channel.
#[derive(Debug)]
pub(super) struct HookAnswer {
    data: Option<bytes::Bytes>,
    expires: Option<u64>,
    info: Option<bytes::Bytes>,
}

/// What joining a channel gives: where its stream is, what was replayed, and the
/// subscribe hook's state (checked JSON, without line breaks).
pub(super) struct Joined {
    pub(super) position: StreamPosition,
    pub(super) recovered: Option<bool>,
    pub(super) publications: Vec<Publication>,
    pub(super) data: Option<bytes::Bytes>,
}

/// The stream's position, without publications.
async fn position_of(node: &Node, channel: &ChannelName) -> Result<History, BrokerError> {
    node.broker.history(channel, HistoryQuery::default()).await
}

/// What a resume from `since` replays, and whether that is everything missed
/// (`recovered`). A replay reads history, so it needs the history permission (`may_read`,
/// the policy's answer for this session); without it a
/// resume can only confirm that nothing was missed. A replay is bounded like a history
/// answer (`max_history_limit`, `max_history_bytes`); one that needs more is not partly
/// sent but answered `recovered: false`, and the client pages through history itself.
async fn replay(
    node: &Node,
    channel: &ChannelName,
    since: Since,
    may_read: bool,
) -> Result<(History, Option<bool>), BrokerError> {
    if !may_read {
        let at = position_of(node, channel).await?;
        let nothing_missed = since.offset == at.position.offset
            && check_since(&since, &at.position, at.position.offset + 1).is_ok();
        return Ok((at, Some(nothing_missed)));
    }
    let client = &node.settings.config.client;
    let next = since.offset + 1;
    // One more than allowed tells "too many to replay" from "exactly the cap".
    let query = HistoryQuery {
        since: Some(since),
        limit: client.max_history_limit + 1,
        max_bytes: Some(client.max_history_bytes),
    };
    // Whole: it starts right after the position (from offset 0, history may start later),
    // ends at the top, and is within the bounds.
    let whole = |h: &History| match (h.publications.first(), h.publications.last()) {
        (Some(first), Some(last)) => {
            first.offset == next
                && last.offset == h.position.offset
                && h.publications.len() <= client.max_history_limit
        }
        _ => h.position.offset + 1 == next,
    };
    match node.broker.history(channel, query).await {
        Ok(h) if whole(&h) => Ok((h, Some(true))),
        Ok(History { position, .. }) | Err(BrokerError::Unrecoverable { current: position }) => {
            Ok((
                History {
                    position,
                    publications: Vec::new(),
                },
                Some(false),
            ))
        }
        Err(e) => Err(e),
    }
}

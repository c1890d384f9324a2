//! The session's side of presence: its memberships, and the `presence` and
//! `presence_stats` commands.

use std::time::Duration;

use herald_protocol::{command::PresenceRequest, results, ChannelName, ErrorCode, Outcome};

use super::{Reply, Session};
use crate::{
    error::Failure,
    hub::presence::{member_id, user_member_id, Joining},
    policy::{self, Action},
};

/// Longest client id a client may send back as its first one.
const MAX_CLIENT_ID: usize = 64;

impl Session {
    /// Makes this session's memberships those of the client whose first connection had
    /// the id `client` (sent back by a reconnecting client).
    pub fn continues(&mut self, client: &str) -> Result<(), Failure> {
        if client.is_empty() || client.len() > MAX_CLIENT_ID {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                format!(
                    "client must be the id of an earlier connection (1 to {MAX_CLIENT_ID} bytes)"
                ),
            ));
        }
        self.first_client = Some(client.into());
        Ok(())
    }

    /// This session's membership of `channel`, if its namespace keeps presence.
    pub(super) fn membership(&self, channel: &ChannelName) -> Option<Joining> {
        let rules = self.node().settings.namespace(channel.namespace());
        rules.presence.access()?;
        let granted = self.granted(channel).filter(|g| g.user.is_some());
        let by_grant = self.auth.as_ref().is_some_and(|a| a.members_by_grant);
        let (user, info) = match granted {
            Some(g) => {
                let user = g.user.clone().expect("filtered on a user");
                let info = crate::token::sender(&user, g.info.as_deref(), None);
                let info = match &g.user_id {
                    Some(typed) => with_user_id(&info, typed),
                    None => info,
                };
                (Some(user), info)
            }
            None if by_grant => return None,
            None => (
                self.identity().map(|i| i.user.clone()),
                self.sender(channel)
                    .or_else(|| anonymous(self.granted(channel)?.info.as_deref()?))
                    .unwrap_or_default(),
            ),
        };
        let id = match user.as_deref() {
            // A front whose members are granted counts users, not connections: each of
            // the user's connections holds the one member (see `user_member_id`).
            Some(user) if by_grant => user_member_id(user),
            user => {
                let secret = self.first_client.as_deref().unwrap_or(&self.client);
                member_id(secret, user.unwrap_or(""))
            }
        };
        Some(Joining {
            member: herald_broker::Member { id, info },
            user,
            announce: rules.join_leave,
            address: self.address,
        })
    }

    /// Whether this session is pushed joins and leaves of `channel`.
    pub(super) fn takes_join_leave(&self, channel: &ChannelName) -> bool {
        let node = self.node();
        let by_grant = self.auth.as_ref().is_some_and(|a| a.members_by_grant);
        node.settings.namespace(channel.namespace()).join_leave
            && (!by_grant
                || self
                    .granted(channel)
                    .is_some_and(|g| g.user.is_some() || g.sees_members))
            && policy::check(node, self.asker(channel), Action::Presence, channel).is_ok()
    }

    /// Joins presence after subscribing. A store that fails does not fail the
    /// subscription: publications matter more than the member list.
    pub(super) async fn join_presence(&self, channel: &ChannelName) {
        let Some(joining) = self.membership(channel) else {
            return;
        };
        if let Err(e) = self.node().presence.join(channel, &joining).await {
            tracing::warn!(%channel, error = %e, "presence join failed");
        }
    }

    /// How long this session's memberships outlive it: pollers come back with their next
    /// request, other clients when they reconnect.
    pub(super) fn presence_grace(&self) -> Duration {
        let config = &self.node().settings.config.presence;
        if self.stateless {
            config.poll_grace
        } else {
            config.grace
        }
    }

    /// Ends a subscription the client or its expiry ended: out of the hub, and out of
    /// presence at once (no grace: the client left on purpose). False if not subscribed.
    pub(super) async fn leave_channel(&mut self, channel: &ChannelName) -> bool {
        if self.subscriptions.remove(channel).is_none() {
            return false;
        }
        self.queue.forget_superseded(channel);
        self.event("unsubscribe", Some(channel), None);
        let membership = self.membership(channel);
        let node = self.node().clone();
        node.hub.unsubscribe(&node.broker, channel, self.id()).await;
        if let Some(joining) = membership {
            node.presence.leave(channel, joining, Duration::ZERO).await;
        }
        true
    }

    /// `presence`: a page of members.
    pub(super) async fn presence(
        &mut self,
        reply: Reply,
        req: PresenceRequest,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let node = self.node().clone();
        self.may_read(&req.channel, Action::Presence).await?;
        let (members, cursor) = node
            .presence
            .page(
                &req.channel,
                req.cursor.as_deref(),
                req.limit.map(|l| l as usize),
            )
            .await?;
        let members = crate::hub::presence::listed(&members);
        Ok(reply.with(Outcome::Presence(results::Presence {
            members: &members,
            cursor,
        })))
    }

    /// `presence_stats`: how many clients and distinct users.
    pub(super) async fn presence_stats(
        &mut self,
        reply: Reply,
        channel: ChannelName,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let node = self.node().clone();
        self.may_read(&channel, Action::Presence).await?;
        let stats = node.presence.stats(&channel).await?;
        Ok(reply.with(Outcome::PresenceStats(results::PresenceStats {
            clients: stats.clients,
            users: stats.users,
        })))
    }
}

/// A member record (`{"user":…}`) with the user's id as its client wrote it, `user_id`.
fn with_user_id(record: &[u8], typed: &[u8]) -> bytes::Bytes {
    let open = record.strip_suffix(b"}").expect("a record is an object");
    let mut out = Vec::with_capacity(record.len() + typed.len() + 12);
    out.extend_from_slice(open);
    out.extend_from_slice(br#","user_id":"#);
    out.extend_from_slice(typed);
    out.push(b'}');
    out.into()
}

/// An anonymous member's record: only its info in the channel (`{"channel_info":…}`, from
/// the subscribe hook), which a front may show (a Phoenix join's metas).
fn anonymous(channel_info: &[u8]) -> Option<bytes::Bytes> {
    let mut out = br#"{"channel_info":"#.to_vec();
    out.extend_from_slice(channel_info);
    out.push(b'}');
    Some(out.into())
}

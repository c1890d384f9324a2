//! What a protocol front (Pusher) does with a session: the same steps Herald's own
//! commands take (grants, joining a channel with its presence, leaving it, a client's
//! publication), without Herald's wire format around them. The front decides who may do
//! what by its own protocol's rules (a Pusher signature) and says so with a grant; the
//! namespace's rules are still asked, so an operator's `nobody` holds for every front.

use bytes::Bytes;
use herald_protocol::{ChannelName, Publication, Since, StreamPosition};

use super::Session;
use herald_protocol::ErrorCode;

use crate::{
    config::Access,
    error::Failure,
    policy::Action,
    publish::{self, Published},
    token::ChannelGrant,
};

/// The presence user a front grants a channel as.
#[derive(Debug)]
pub struct GrantedMember {
    /// Its id, as text.
    pub user: Box<str>,
    /// Its `user_info`, JSON text.
    pub info: Bytes,
    /// Its id as JSON when the client wrote it as other than a string (a number).
    pub typed_id: Option<Bytes>,
}

/// A channel a front opened: where its stream is, and what a resume replayed.
#[derive(Debug)]
pub struct Opened {
    /// The stream's position once opened.
    pub position: StreamPosition,
    /// Whether a resume replayed everything missed (`None`: not a resume).
    pub recovered: Option<bool>,
    /// What it replayed.
    pub publications: Vec<Publication>,
}

impl Session {
    /// Makes this session a member only of channels whose grant names a presence user
    /// (see [`Session::grant_channel`]).
    pub fn members_by_grant(&mut self) {
        self.credentials().members_by_grant = true;
    }

    /// Grants `channel` to this session, as a subscription token would; with `member`,
    /// as that presence user.
    pub fn grant_channel(&mut self, channel: ChannelName, member: Option<GrantedMember>) {
        let (user, info, user_id) = match member {
            Some(m) => (Some(m.user), Some(m.info), m.typed_id),
            None => (None, None, None),
        };
        self.grant(ChannelGrant {
            channel,
            expires: None,
            info,
            user,
            user_id,
            sees_members: false,
        });
    }

    /// Grants `channel` to this session as one that follows its members without being
    /// one: it is pushed the channel's joins and leaves (in a namespace with `join_leave`)
    /// while a session whose members are granted is otherwise pushed them only in channels
    /// it is a member of.
    pub fn watch_channel(&mut self, channel: ChannelName) {
        self.grant(ChannelGrant {
            channel,
            expires: None,
            info: None,
            user: None,
            user_id: None,
            sees_members: true,
        });
    }

    /// Opens `channel` as the `subscribe` command does (the namespace's rules, its
    /// subscribe hook, told `params` when the client sent any, presence), resuming after
    /// `since` when given. A refusal takes the channel's grant back.
    pub async fn open(
        &mut self,
        channel: &ChannelName,
        since: Option<Since>,
        params: Option<&serde_json::value::RawValue>,
    ) -> Result<Opened, Failure> {
        let joined = self
            .join(channel.clone(), since, params, super::Takes::default())
            .await;
        match joined {
            Ok(j) => Ok(Opened {
                position: j.position,
                recovered: j.recovered,
                publications: j.publications,
            }),
            Err(f) => {
                self.drop_grant(channel);
                Err(f)
            }
        }
    }

    /// Where each subscription stands: the last offset written to the client.
    pub fn written_positions(&self) -> Vec<(ChannelName, Since)> {
        self.subscriptions
            .iter()
            .filter_map(|(channel, position)| {
                let (epoch, offset) = position.get()?;
                Some((
                    channel.clone(),
                    Since {
                        offset,
                        epoch: Some(epoch.clone()),
                    },
                ))
            })
            .collect()
    }

    /// Leaves `channel` (and its presence, at once) and takes its grant back; false when
    /// not subscribed.
    pub async fn close(&mut self, channel: &ChannelName) -> bool {
        let left = self.leave_channel(channel).await;
        self.drop_grant(channel);
        left
    }

    /// Takes one of the client's commands (a message, on a front) out of its allowances,
    /// as every command of Herald's own protocol is: the connection's
    /// (`client.max_commands_per_second`) and, for sessions that live one request each,
    /// its address's (`limits.commands_per_address`). The refusal (111) when one is spent:
    /// the command must not be executed.
    pub fn charge_command(&mut self) -> Result<(), Failure> {
        let address_allows = match self.address {
            Some(ip) if self.charge_commands => self.node().limits.command(ip),
            _ => true,
        };
        if !address_allows {
            let limit = self.node().settings.config.limits.commands_per_address;
            return Err(Failure::new(
                ErrorCode::TooManyRequests,
                format!(
                    "more than {limit} commands per second from this address; this one was not executed"
                ),
            ));
        }
        let limit = self.node().settings.config.client.max_commands_per_second;
        if !self.rate.take(limit) {
            return Err(Failure::new(
                ErrorCode::TooManyRequests,
                format!("more than {limit} commands per second; this one was not executed"),
            ));
        }
        Ok(())
    }

    /// Takes one call to the application's backend from the client address's allowance
    /// (`limits.hook_calls_per_address`): for what a front posts to the backend because
    /// of the client (a Pusher webhook). The refusal (111) when it is spent.
    pub fn charge_backend(&self) -> Result<(), Failure> {
        self.hook_budget()
    }

    /// The client's address, when its transport admitted it by one.
    pub fn address(&self) -> Option<std::net::IpAddr> {
        self.address
    }

    /// Whether this session is subscribed to `channel`.
    pub fn subscribed(&self, channel: &ChannelName) -> bool {
        self.subscriptions.contains_key(channel)
    }

    /// A client's publication the front allowed by its own rules (a Pusher client event on
    /// a channel it signed): the namespace must still let clients publish at all (an
    /// operator's `publish = "nobody"` closes it to every front), and it is charged to the
    /// client's address as every client's publication is.
    pub async fn publish_allowed(
        &mut self,
        channel: &ChannelName,
        data: Bytes,
    ) -> Result<Published, Failure> {
        let node = self.node().clone();
        if node.settings.namespace(channel.namespace()).publish == Access::Nobody {
            return Err(Failure::new(
                ErrorCode::PermissionDenied,
                format!(
                    "clients may not publish to {channel} (its namespace's `publish` is `nobody`)"
                ),
            ));
        }
        publish::from_client(&node, self.address, channel, (data, None), None, None).await
    }

    /// Accepts a subscription token for `channel` (as the `subscribe` command's `token`).
    pub async fn accept_token(
        &mut self,
        channel: &ChannelName,
        token: &str,
    ) -> Result<(), Failure> {
        self.accept_channel_token(channel, token).await
    }

    /// Identifies the client by its connection token, or asks the connect hook, as a
    /// `connect` command does (once, before anything else the client does); a refusal
    /// ends the connection.
    pub async fn identify_once(
        &mut self,
        token: Option<&str>,
    ) -> Result<(), crate::error::Disconnect> {
        if self.connected {
            return Ok(());
        }
        self.connected = true;
        self.identify(token).await.map_err(|d| d.disconnect())
    }

    /// A client's publication, as the `publish` command does it: the namespace's rules,
    /// its publish hook (which may refuse or rewrite it), the sender shown with it.
    pub async fn publish_checked(
        &mut self,
        channel: &ChannelName,
        data: Bytes,
    ) -> Result<Published, Failure> {
        self.publish_as_client(channel, data, None, None).await
    }

    /// The newest publication of `channel`, if any (a Pusher `cache-` channel's cached
    /// event); reading it asks what reading history asks.
    pub async fn last_publication(
        &self,
        channel: &ChannelName,
    ) -> Result<Option<Publication>, Failure> {
        let node = self.node().clone();
        self.may_read(channel, Action::History).await?;
        let newest = node
            .broker
            .history(channel, herald_broker::HistoryQuery::newest(1))
            .await?;
        Ok(newest.publications.into_iter().next_back())
    }

    /// Registers this connection as `user`'s, so that an operator's (or a front's)
    /// actions on that user reach it (a Pusher `pusher:signin`).
    pub fn known_as(&self, user: &str) {
        self.node().sessions.identified(&self.client, user);
    }

    /// The members of `channel` (up to `presence.max_page`), for a front that lists them
    /// when a client joins; its presence rule is asked as for the `presence` command.
    pub async fn members(
        &self,
        channel: &ChannelName,
    ) -> Result<Vec<herald_broker::Member>, Failure> {
        let node = self.node().clone();
        self.may_read(channel, Action::Presence).await?;
        let max = node.settings.config.presence.max_page;
        Ok(node.presence.page(channel, None, Some(max)).await?.0)
    }
}

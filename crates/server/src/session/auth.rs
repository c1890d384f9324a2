//! Who the session's client is, what it was granted, and until when.
//!
//! A session starts anonymous. A connection token (WebSocket `connect`, or an HTTP
//! transport's `Authorization: Bearer` / `token=`) gives it an [`Identity`]; subscription
//! tokens grant it single channels. Both may expire: `refresh` replaces them before then,
//! and [`Session::expire`] ends what was not refreshed (`leeway` late).

use std::{pin::Pin, sync::Arc, time::Duration};

use herald_protocol::{
    command::RefreshRequest,
    json::{self, results},
    ChannelName, DisconnectCode, ErrorCode,
};
use tokio::time::{Instant, Sleep};

use super::{Reply, Session};
use crate::{
    error::{Disconnect, Failure},
    policy::{
        token::{unix_now, ChannelGrant, Identity},
        Asker,
    },
};

/// What tokens gave a session. Boxed in the session: most connections never carry any.
#[derive(Debug, Default)]
pub(super) struct Credentials {
    pub(super) identity: Option<Arc<Identity>>,
    /// Channels granted by subscription tokens, at most one per subscription.
    pub(super) channels: Vec<ChannelGrant>,
}

/// What ending a command can mean: a failed command, or (a refused connection token) the
/// end of the connection.
#[derive(Debug)]
pub(super) enum Refusal {
    Command(Failure),
    Connection(Disconnect),
}

impl From<Failure> for Refusal {
    fn from(f: Failure) -> Self {
        Refusal::Command(f)
    }
}

impl Session {
    /// The identity an HTTP transport read from its request's token.
    pub fn authenticated(mut self, identity: Option<Identity>) -> Self {
        if let Some(identity) = identity {
            self.credentials().identity = Some(Arc::new(identity));
        }
        self
    }

    /// Adds a channel granted by a subscription token the transport checked.
    pub fn grant(&mut self, grant: ChannelGrant) {
        let channels = &mut self.credentials().channels;
        channels.retain(|g| g.channel != grant.channel);
        channels.push(grant);
    }

    /// The session's identity, if a token gave one.
    pub fn identity(&self) -> Option<&Identity> {
        self.auth.as_ref()?.identity.as_deref()
    }

    /// The user subscription tokens must name: the identity's, or empty when anonymous.
    pub fn user(&self) -> &str {
        self.identity().map_or("", |i| &i.user)
    }

    fn credentials(&mut self) -> &mut Credentials {
        self.auth.get_or_insert_with(Box::default)
    }

    /// Who asks, for the policy, about `channel`.
    pub(super) fn asker(&self, channel: &ChannelName) -> Asker<'_> {
        let channel_granted = self
            .auth
            .as_ref()
            .is_some_and(|a| a.channels.iter().any(|g| &g.channel == channel));
        Asker {
            identity: self.identity(),
            channel_granted,
        }
    }

    /// `connect`: checks the token, if any. A refused token ends the connection (3500
    /// invalid, 3504 expired) so that a browser sees a close code it can act on.
    pub(super) async fn connect(
        &mut self,
        reply: Reply,
        token: Option<String>,
    ) -> Result<Option<Vec<u8>>, Refusal> {
        if let Some(token) = token {
            let identity = self
                .node()
                .settings
                .tokens
                .connection(&token)
                .await
                .map_err(|e| Refusal::Connection(e.disconnect()))?;
            self.credentials().identity = Some(Arc::new(identity));
        }
        let mut answer = reply.with(&self.connect_result());
        // The token's `channels`: subscribed now, each announced by a `subscribe` push as
        // on the HTTP transports.
        let channels = self
            .identity()
            .map(|i| i.channels.clone())
            .unwrap_or_default();
        for channel in channels {
            let mut pushes = Vec::new();
            let opened = self
                .open_channel(channel.clone(), None, |push, _| {
                    super::line(&mut pushes, push)
                })
                .await;
            if let Err(f) = opened {
                super::line(
                    &mut pushes,
                    &json::encode_unsubscribe(&channel, f.code, &f.message),
                );
            }
            let out = answer.get_or_insert_with(Vec::new);
            super::line(out, &pushes);
        }
        Ok(answer)
    }

    /// The `connect` result of this session.
    pub(super) fn connect_result(&self) -> results::Connect<'_> {
        let ping = self
            .node()
            .settings
            .config
            .client
            .ping_interval
            .as_secs()
            .max(1);
        results::Connect {
            client: &self.client,
            version: env!("CARGO_PKG_VERSION"),
            ping,
            user: self.identity().map(|i| &*i.user),
            expiry: expiry(self.identity().and_then(|i| i.expires)),
        }
    }

    /// `refresh`: a new connection token for the same user, or a new subscription token.
    pub(super) async fn refresh(
        &mut self,
        reply: Reply,
        req: RefreshRequest,
    ) -> Result<Option<Vec<u8>>, Refusal> {
        let tokens = self.node().settings.tokens.clone();
        let expires = match req.channel {
            None => {
                let Some(current) = self.identity() else {
                    return Err(Failure::new(
                        ErrorCode::BadConnectState,
                        "this connection has no token to refresh; reconnect with one",
                    )
                    .into());
                };
                let user = current.user.clone();
                let identity = tokens
                    .connection(&req.token)
                    .await
                    .map_err(|e| e.failure())?;
                if identity.user != user {
                    return Err(Failure::new(
                        ErrorCode::Unauthorized,
                        "the new token is for another user; reconnect to change users",
                    )
                    .into());
                }
                let expires = identity.expires;
                self.credentials().identity = Some(Arc::new(identity));
                expires
            }
            Some(channel) => {
                if !self.subscriptions.contains_key(&channel) {
                    return Err(Failure::new(
                        ErrorCode::NotSubscribed,
                        format!("not subscribed to {channel}"),
                    )
                    .into());
                }
                let grant = tokens
                    .channel(&req.token, self.user(), &channel)
                    .await
                    .map_err(|e| e.failure())?;
                let expires = grant.expires;
                self.grant(grant);
                expires
            }
        };
        Ok(reply.with(&results::Refreshed {
            expiry: expiry(expires),
        }))
    }

    /// Checks a subscription token for `channel` and keeps its grant.
    pub(super) async fn accept_channel_token(
        &mut self,
        channel: &ChannelName,
        token: &str,
    ) -> Result<(), Failure> {
        let tokens = self.node().settings.tokens.clone();
        let grant = tokens
            .channel(token, self.user(), channel)
            .await
            .map_err(|e| e.failure())?;
        self.grant(grant);
        Ok(())
    }

    /// Forgets a channel's subscription-token grant (unsubscribed, or the subscribe failed).
    pub(super) fn drop_grant(&mut self, channel: &ChannelName) {
        if let Some(auth) = &mut self.auth {
            auth.channels.retain(|g| &g.channel != channel);
        }
    }

    /// When something this session holds has expired, `leeway` included (Unix seconds).
    pub fn deadline(&self) -> Option<u64> {
        let auth = self.auth.as_ref()?;
        let leeway = self.node().settings.tokens.leeway().as_secs();
        auth.identity
            .iter()
            .filter_map(|i| i.expires)
            .chain(auth.channels.iter().filter_map(|g| g.expires))
            .min()
            // As the token check: a token is valid through the second of its `exp`.
            .map(|at| at.saturating_add(leeway + 1))
    }

    /// Ends what expired: the connection (3504) if its token did, else each subscription
    /// whose subscription token did, returning an `unsubscribe` push (code 109) for each.
    pub async fn expire(&mut self) -> Result<Vec<Vec<u8>>, Disconnect> {
        let now = unix_now();
        let leeway = self.node().settings.tokens.leeway().as_secs();
        let past = |at: Option<u64>| at.is_some_and(|at| at.saturating_add(leeway) < now);
        let Some(auth) = &mut self.auth else {
            return Ok(Vec::new());
        };
        if past(auth.identity.as_ref().and_then(|i| i.expires)) {
            return Err(Disconnect::because(
                DisconnectCode::Expired,
                "token expired; connect again with a new one (refresh before it expires)",
            ));
        }
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut auth.channels)
            .into_iter()
            .partition(|g| past(g.expires));
        auth.channels = kept;
        let mut pushes = Vec::new();
        for grant in expired {
            if self.subscriptions.remove(&grant.channel).is_some() {
                let node = self.node().clone();
                node.hub
                    .unsubscribe(&node.broker, &grant.channel, self.id())
                    .await;
                pushes.push(json::encode_unsubscribe(
                    &grant.channel,
                    ErrorCode::TokenExpired,
                    "subscription token expired; subscribe again with a new one",
                ));
            }
        }
        Ok(pushes)
    }
}

fn expiry(expires: Option<u64>) -> Option<results::Expiry> {
    expires.map(|expires| results::Expiry {
        expires,
        ttl: expires.saturating_sub(unix_now()),
    })
}

/// A timer for a session's [`Session::deadline`], for transports' select loops.
#[derive(Debug, Default)]
pub struct ExpiryTimer {
    at: Option<u64>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl ExpiryTimer {
    /// Follows the session's current deadline (call after anything that may change it).
    pub fn follow(&mut self, session: &Session) {
        let deadline = session.deadline();
        if deadline == self.at {
            return;
        }
        self.at = deadline;
        self.sleep = deadline.map(|at| {
            let wait = Duration::from_secs(at.saturating_sub(unix_now()));
            Box::pin(tokio::time::sleep_until(Instant::now() + wait))
        });
    }

    /// Resolves at the deadline; never without one.
    pub async fn wait(&mut self) {
        match &mut self.sleep {
            Some(sleep) => {
                sleep.await;
                // Fired: the next `follow` sets it again if anything is still due.
                self.at = None;
                self.sleep = None;
            }
            None => std::future::pending().await,
        }
    }
}

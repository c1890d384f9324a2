//! Who the session's client is, what it was granted, and until when.
//!
//! A session starts anonymous. A connection token (WebSocket `connect`, or an HTTP
//! transport's `Authorization: Bearer` / `token=`) gives it an [`Identity`]; subscription
//! tokens grant it single channels. Both may expire: `refresh` replaces them before then,
//! and [`Session::expire`] ends what was not refreshed (`leeway` late).

use std::{pin::Pin, sync::Arc, time::Duration};

use herald_protocol::{
    command::RefreshRequest, results, ChannelName, DisconnectCode, ErrorCode, Outcome, Push,
};
use tokio::time::{Instant, Sleep};

use super::{Reply, Session};
use crate::{
    error::{Disconnect, Failure},
    hooks::{self, HookError, RequestFacts, Transport},
    policy::Asker,
    token::{unix_now, ChannelGrant, Identity, TokenError},
};

/// What tokens and hooks gave a session. Boxed in the session: most connections never
/// carry any.
#[derive(Debug, Default)]
pub(super) struct Credentials {
    pub(super) identity: Option<Arc<Identity>>,
    /// Whether the identity came from the connect hook (so the refresh hook extends it).
    pub(super) hooked: bool,
    /// Channels granted by subscription tokens or the subscribe hook, at most one per
    /// subscription.
    pub(super) channels: Vec<ChannelGrant>,
    /// The subscribe hook's answers (its state, if any) for channels an HTTP request
    /// names, asked before the request is answered and taken when each is opened, so a
    /// refusal is still an HTTP status and the backend is asked once per channel.
    pub(super) admitted: Vec<(ChannelName, super::subscribe::HookAnswer)>,
    /// What the connect hook may see of the request that opened the session; taken when
    /// the client is identified, so its presence means "not asked yet".
    pub(super) facts: Option<Box<RequestFacts>>,
    /// Whether the session is a member only of channels whose grant names a presence user
    /// (a Pusher connection: members of `presence-` channels only, as their signed
    /// `channel_data` says), not of every channel of a namespace that keeps presence.
    pub(super) members_by_grant: bool,
}

/// Why a client was not admitted: its token, or the connect hook.
#[derive(Debug)]
pub enum Denied {
    /// The token was refused.
    Token(TokenError),
    /// The connect hook refused, or the backend failed.
    Hook(HookError),
    /// The client's address asked the backend too often (`limits.hook_calls_per_address`):
    /// the hook was not asked.
    Limited(Failure),
}

impl Denied {
    /// As a request's failure (HTTP transports answer it before a stream starts).
    pub fn failure(self) -> Failure {
        match self {
            Denied::Token(e) => e.failure(),
            Denied::Hook(e) => e.failure("connect"),
            Denied::Limited(f) => f,
        }
    }

    /// As the end of a WebSocket connection (its close code).
    pub fn disconnect(self) -> Disconnect {
        match self {
            Denied::Token(e) => e.disconnect(),
            Denied::Hook(e) => e.disconnect("connect"),
            // Reconnect later, as when the backend fails.
            Denied::Limited(f) => {
                Disconnect::because(DisconnectCode::BackendUnavailable, f.message)
            }
        }
    }
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
    /// Says which transport carries the session, and what the connect hook may see of
    /// the request that opened it (see [`hooks::Hooks::facts`]).
    pub fn came_by(mut self, transport: Transport, facts: Option<Box<RequestFacts>>) -> Self {
        self.transport = transport;
        // Sends without a stream are commands, not connections: not counted as one.
        if transport != Transport::Send && !self.counted {
            self.node().metrics.opened(transport);
            self.counted = true;
            if let Some(wire) = self.node().metrics.wire(transport) {
                self.queue.count_in(wire);
            }
            if !transport.is_request() {
                let entry = crate::registry::Entry {
                    session: self.id(),
                    queue: self.queue.clone(),
                    transport,
                    user: None,
                    since: unix_now(),
                };
                self.node().sessions.insert(self.client.clone(), entry);
            }
        }
        if facts.is_some() {
            self.credentials().facts = facts;
        }
        self
    }

    /// Says who the client is: by its token when it has one and token keys are
    /// configured, else by the connect hook when there is one (which then sees the token,
    /// if any), else anonymous.
    pub async fn identify(&mut self, token: Option<&str>) -> Result<(), Denied> {
        let node = self.node().clone();
        let facts = self.auth.as_mut().and_then(|a| a.facts.take());
        let tokens = &node.settings.tokens;
        let hook = node.settings.hooks.connect.as_ref();
        let identity = match (token, hook) {
            // A dashboard's ticket is checked as one only, whatever else is configured.
            (Some(ticket), _) if crate::policy::operator::is_ticket(ticket) => Some(
                crate::policy::operator::verify(&node.settings, ticket).map_err(Denied::Token)?,
            ),
            (Some(token), None) => Some(tokens.connection(token).await.map_err(Denied::Token)?),
            (Some(token), Some(_)) if tokens.keyed() => {
                Some(tokens.connection(token).await.map_err(Denied::Token)?)
            }
            (_, Some(hook)) => {
                self.hook_budget().map_err(Denied::Limited)?;
                let facts = facts.unwrap_or_default();
                let request = hooks::ConnectRequest {
                    client: self.hook_client(),
                    address: self.address,
                    headers: &facts.headers,
                    cookies: &facts.cookies,
                    token,
                    params: &facts.params,
                };
                let answer: hooks::ConnectResult =
                    hook.call(&request).await.map_err(Denied::Hook)?;
                let identity = answer.identity().map_err(Denied::Hook)?;
                if identity.is_some() {
                    self.credentials().hooked = true;
                }
                identity
            }
            (None, None) => None,
        };
        if let Some(identity) = identity {
            node.sessions.identified(&self.client, &identity.user);
            self.credentials().identity = Some(Arc::new(identity));
        }
        Ok(())
    }

    /// Takes one call to the application's backend from the client address's allowance
    /// (`limits.hook_calls_per_address`), before any hook is asked for this client.
    pub(super) fn hook_budget(&self) -> Result<(), Failure> {
        match self.address {
            Some(ip) => self.node().limits.hook_call(ip),
            None => Ok(()),
        }
    }

    /// Whether the connect hook is still to be asked about this session.
    pub(super) fn unidentified(&self) -> bool {
        self.auth.as_ref().is_some_and(|a| a.facts.is_some())
    }

    /// Who this session is, for hook requests.
    pub(super) fn hook_client(&self) -> hooks::Client<'_> {
        hooks::Client {
            client: &self.client,
            transport: self.transport,
            user: self.identity().map(|i| &*i.user),
        }
    }

    /// Adds a channel granted by a subscription token the transport checked.
    pub fn grant(&mut self, grant: ChannelGrant) {
        let channels = &mut self.credentials().channels;
        channels.retain(|g| g.channel != grant.channel);
        // Most connections hold one grant (a Pusher client per channel it subscribed,
        // a token's single channel): room for exactly one, not the four a first push
        // makes room for (320 bytes per connection).
        if channels.is_empty() {
            channels.reserve_exact(1);
        }
        channels.push(grant);
    }

    /// Who the connection's publications in `channel` say sent them: its user and `info`,
    /// and the `info` of the channel's subscription token if it had one; anonymous: none.
    pub(super) fn sender(&self, channel: &ChannelName) -> Option<bytes::Bytes> {
        let identity = self.identity()?;
        let channel_info = self
            .auth
            .as_ref()?
            .channels
            .iter()
            .find(|g| &g.channel == channel)
            .and_then(|g| g.info.as_deref());
        Some(match channel_info {
            None => identity.from.clone(),
            Some(ci) => crate::token::sender(&identity.user, identity.info.as_deref(), Some(ci)),
        })
    }

    /// What grants this session `channel`, if anything does.
    pub(super) fn granted(&self, channel: &ChannelName) -> Option<&ChannelGrant> {
        let auth = self.auth.as_ref()?;
        auth.channels.iter().find(|g| &g.channel == channel)
    }

    /// The session's identity, if a token gave one.
    pub fn identity(&self) -> Option<&Identity> {
        self.auth.as_ref()?.identity.as_deref()
    }

    /// The user subscription tokens must name: the identity's, or empty when anonymous.
    pub fn user(&self) -> &str {
        self.identity().map_or("", |i| &i.user)
    }

    pub(super) fn credentials(&mut self) -> &mut Credentials {
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

    /// `connect`: checks the token, if any, or asks the connect hook. A refused token ends
    /// the connection (3500 invalid, 3504 expired) so that a browser sees a close code it
    /// can act on; so does a hook's refusal (see [`HookError::disconnect`]).
    pub(super) async fn connect(
        &mut self,
        reply: Reply,
        token: Option<String>,
    ) -> Result<Option<Vec<u8>>, Refusal> {
        self.identify(token.as_deref())
            .await
            .map_err(|d| Refusal::Connection(d.disconnect()))?;
        self.announce();
        let mut answer = reply.with(Outcome::Connect(self.connect_result()));
        let codec = self.codec();
        // The token's `channels`: subscribed now, each announced by a `subscribe` push as
        // on the HTTP transports.
        let channels = self
            .identity()
            .map(|i| i.channels.clone())
            .unwrap_or_default();
        for channel in channels {
            let mut pushes = Vec::new();
            let opened = self
                .open_channel(channel.clone(), None, super::Takes::default(), |push, _| {
                    codec.join(&mut pushes, push)
                })
                .await;
            if let Err(f) = opened {
                let refused = codec.push(&Push::Unsubscribe {
                    channel: &channel,
                    code: f.code,
                    reason: &f.message,
                });
                codec.join(&mut pushes, &refused);
            }
            let out = answer.get_or_insert_with(Vec::new);
            codec.join(out, &pushes);
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
        let subscription = req.channel.is_some();
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
        Ok(reply.with(Outcome::Refresh(results::Refreshed {
            expiry: expiry(expires),
            subscription,
        })))
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

    /// Whether something its tokens granted has expired already (see [`Self::deadline`]).
    pub fn past_deadline(&self) -> bool {
        self.deadline().is_some_and(|at| at <= unix_now())
    }

    /// Ends what expired: the connection (3504) if its token did, else each subscription
    /// whose subscription token did, returning an `unsubscribe` push (code 109) for each.
    pub async fn expire(&mut self) -> Result<Vec<Vec<u8>>, Disconnect> {
        let now = unix_now();
        let leeway = self.node().settings.tokens.leeway().as_secs();
        let past = |at: Option<u64>| at.is_some_and(|at| at.saturating_add(leeway) < now);
        let Some(auth) = &self.auth else {
            return Ok(Vec::new());
        };
        if past(auth.identity.as_ref().and_then(|i| i.expires)) && auth.hooked {
            self.refresh_by_hook().await?;
        }
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
            if self.leave_channel(&grant.channel).await {
                pushes.push(self.codec().push(&Push::Unsubscribe {
                    channel: &grant.channel,
                    code: ErrorCode::TokenExpired,
                    reason: "subscription token expired; subscribe again with a new one",
                }));
            }
        }
        Ok(pushes)
    }
}

impl Session {
    /// Asks the refresh hook for a new expiry of a connection the connect hook admitted;
    /// without a refresh hook the connection ends as an expired token's would.
    async fn refresh_by_hook(&mut self) -> Result<(), Disconnect> {
        let node = self.node().clone();
        let Some(hook) = node.settings.hooks.refresh.as_ref() else {
            return Err(Disconnect::because(
                DisconnectCode::Expired,
                "the connection expired (the connect hook's `expires`) and no refresh hook extends it",
            ));
        };
        let request = hooks::RefreshRequest {
            client: self.hook_client(),
        };
        let answer: hooks::RefreshResult = hook
            .call(&request)
            .await
            .map_err(|e| e.disconnect("refresh"))?;
        if let Some(identity) = self.auth.as_mut().and_then(|a| a.identity.as_mut()) {
            Arc::make_mut(identity).expires = answer.expires;
        }
        Ok(())
    }
}

fn expiry(expires: Option<u64>) -> Option<results::Expiry> {
    expires.map(|expires| results::Expiry {
        expires,
        ttl: seconds_left(expires, std::time::SystemTime::now()),
    })
}

/// Whole seconds left at `now` until `expires` (Unix seconds), rounded down: a client
/// schedules its refresh from it, and must never be told more time than it has.
fn seconds_left(expires: u64, now: std::time::SystemTime) -> u64 {
    let now = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Duration::from_secs(expires).saturating_sub(now).as_secs()
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

    /// Whether the deadline has passed already (then it counts as fired): a connection
    /// woken for something else, or a request taken up after it, handles the expiry
    /// first, so that nothing queued goes out past it.
    pub fn due(&mut self) -> bool {
        let due = self.at.is_some_and(|at| at <= unix_now());
        if due {
            self.at = None;
            self.sleep = None;
        }
        due
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

#[cfg(test)]
mod ttl_tests {
    use std::time::{Duration, UNIX_EPOCH};

    /// A client schedules its refresh from `ttl`: it must never be told more time than the
    /// token has. Rounding the clock down told it up to a second too many (a 3 s token
    /// minted at .9 of a second said 3 with 2.1 left), and the refresh came after the
    /// token had expired (3504 now and then in the SDK's 3 s token test).
    #[test]
    fn the_time_left_is_never_more_than_the_token_has() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(super::seconds_left(3, at(900)), 2);
        assert_eq!(super::seconds_left(3, at(0)), 3);
        assert_eq!(super::seconds_left(3, at(2_999)), 0);
        assert_eq!(super::seconds_left(3, at(5_000)), 0);
    }
}

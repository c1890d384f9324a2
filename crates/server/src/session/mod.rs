//! The session: one client's state, whatever transport carries it.
//!
//! A transport feeds the session the frames it reads ([`Session::handle_frame`]) and asks
//! it for what to write ([`Session::write_deliveries`]). The session answers commands,
//! tracks each subscription's position, and filters the queue so that every publication
//! reaches the client exactly once and in order: a delivery at or below the position is a
//! duplicate (already replayed from history) and is skipped; one beyond the next offset,
//! or from another epoch, means something was lost, and the session ends with
//! "insufficient state" so the client resumes from history rather than skip silently.

mod auth;
mod deliveries;
mod front;
mod presence;
mod subscribe;
mod subscriptions;

use auth::{Credentials, Refusal};
pub use auth::{Denied, ExpiryTimer};
pub use deliveries::{Drained, Positions};
pub use front::{GrantedMember, Opened};
pub use subscribe::Takes;
use subscriptions::Subscriptions;

use std::sync::Arc;

use herald_protocol::{
    json::DecodeError, results, ChannelName, Codec, Command, DisconnectCode, Encoding, ErrorCode,
    Method, Outcome, Push,
};

use crate::{
    error::{Disconnect, Failure},
    hooks,
    node::{ConnectionGuard, Node},
    policy::{self, Action},
    publish,
    queue::Queue,
};

/// One client's state.
#[derive(Debug)]
pub struct Session {
    guard: ConnectionGuard,
    queue: Arc<Queue>,
    /// Ordered by name, so that a cursor lists the same positions the same way every time
    /// (a poll's ETag is the cursor's hash).
    subscriptions: Subscriptions,
    connected: bool,
    stateless: bool,
    client: Arc<str>,
    rate: crate::limits::Bucket,
    /// The client's address, when the transport knows it: channels its publications make
    /// exist are charged to it.
    address: Option<std::net::IpAddr>,
    /// Whether each command is charged to `address` too: stateless sessions (one request
    /// each), since a fresh session per request must not mean a fresh allowance per request.
    charge_commands: bool,
    /// Longest cursor this session's transport can carry (an SSE event id), if bounded.
    cursor_bound: Option<usize>,
    /// What tokens and hooks gave this client; none while anonymous without grants.
    auth: Option<Box<Credentials>>,
    /// The transport, as hooks are told it.
    transport: crate::hooks::Transport,
    /// Whether the backend was told of this connection (events), so it is told of its end.
    announced: bool,
    /// The client id of this client's first connection, when it sent one (`connect`'s
    /// `client`, `client=`): its presence memberships are that client's.
    first_client: Option<Box<str>>,
    /// Whether it is counted as a connection of its transport in the metrics (once the
    /// transport said which, and unless it is a send).
    counted: bool,
    /// Whether its end (close code) was counted.
    end_counted: bool,
    /// Whether the client closed the connection saying so: its memberships then leave at
    /// once, not after the presence grace kept for connections that dropped.
    left_on_purpose: bool,
    /// The codec the client speaks (nothing in memory while there is one).
    encoding: Encoding,
}

impl Session {
    /// A new session on `node`.
    pub fn new(node: &Arc<Node>) -> Self {
        let queue = Arc::new(Queue::new(node.settings.config.client.queue_max_bytes));
        let guard = node.connection();
        // NODE-RANDOM: the node first, so a send can be forwarded to it; then 128 bits from
        // the operating system's generator, since the id is the only capability a
        // `send?session=` needs (no counter: it would tell how many connections came before).
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).expect("the operating system's random generator works");
        let client: Arc<str> = format!("{}-{:032x}", node.id, u128::from_le_bytes(secret)).into();
        Self {
            guard,
            queue,
            subscriptions: Subscriptions::default(),
            connected: false,
            stateless: false,
            client,
            rate: crate::limits::Bucket::full(node.settings.config.client.max_commands_per_second),
            address: None,
            charge_commands: false,
            cursor_bound: None,
            auth: None,
            transport: Default::default(),
            announced: false,
            first_client: None,
            counted: false,
            end_counted: false,
            left_on_purpose: false,
            encoding: Encoding::default(),
        }
    }

    /// How this session's replies and pushes are written, and its commands read.
    pub fn codec(&self) -> &'static dyn Codec {
        self.encoding.codec()
    }

    /// The session's codec.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// This session, speaking `encoding` (a front's codec) instead of Herald's JSON.
    pub fn speaking(mut self, encoding: Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    pub(crate) fn node(&self) -> &Arc<Node> {
        self.guard.node()
    }

    /// The session's id, unique within the process.
    pub fn id(&self) -> u64 {
        self.guard.id
    }

    /// Where the hub puts this session's publications.
    pub fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    /// Handles every command in `frame`, appending replies to `out` (one JSON line each).
    /// Fails only when the frame cannot be trusted at all (malformed JSON), or when handling
    /// it panicked: a defect, contained here so that it ends this connection with 3006
    /// (dropping the session releases its subscriptions) instead of dropping the socket
    /// without a word.
    pub async fn handle_frame(
        &mut self,
        frame: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Disconnect> {
        self.handle_frame_until(frame, out, usize::MAX)
            .await
            .map(|_| ())
    }

    /// Like [`Session::handle_frame`], but stops after the command whose reply brings `out`
    /// to `flush_at` bytes, and returns the part of the frame not handled yet (empty when
    /// done). A transport writes `out` and calls again with the rest: replies leave in
    /// pieces as the client reads them, so a frame full of history reads is never held whole.
    pub async fn handle_frame_until<'f>(
        &mut self,
        frame: &'f [u8],
        out: &mut Vec<u8>,
        flush_at: usize,
    ) -> Result<&'f [u8], Disconnect> {
        use futures_util::FutureExt;
        let handled = std::panic::AssertUnwindSafe(self.handle_commands(frame, out, flush_at))
            .catch_unwind()
            .await;
        handled.unwrap_or_else(|_| {
            Err(Disconnect::because(
                DisconnectCode::ServerError,
                "internal error while handling a command; reconnect",
            ))
        })
    }

    async fn handle_commands<'f>(
        &mut self,
        frame: &'f [u8],
        out: &mut Vec<u8>,
        flush_at: usize,
    ) -> Result<&'f [u8], Disconnect> {
        let codec = self.codec();
        let mut rest = frame;
        while !rest.is_empty() {
            let (part, after) = codec.split(rest);
            rest = after;
            match codec.decode(part) {
                None => {}
                Some(Ok(command)) => self.handle(command, out).await?,
                Some(Err(DecodeError::Invalid { id, code, message })) => {
                    self.refuse(out, id, code, &message);
                }
                Some(Err(e @ DecodeError::Malformed(_))) => {
                    return Err(Disconnect::because(
                        DisconnectCode::BadRequest,
                        e.to_string(),
                    ));
                }
            }
            if out.len() >= flush_at {
                break;
            }
        }
        Ok(rest)
    }

    async fn handle(&mut self, command: Command, out: &mut Vec<u8>) -> Result<(), Disconnect> {
        if let Err(f) = self.charge_command() {
            self.refuse(out, command.id, f.wire_code(), &f.message);
            return Ok(());
        }
        let method = command.method.name();
        let reply = Reply {
            id: command.id,
            codec: self.codec(),
        };
        let started = std::time::Instant::now();
        let done = self.dispatch(reply, command.method).await;
        self.node().metrics.command(method, started.elapsed());
        match done {
            Ok(Some(bytes)) => self.codec().join(out, &bytes),
            Ok(None) => {}
            Err(Refusal::Command(f)) => self.refuse(out, command.id, f.wire_code(), &f.message),
            Err(Refusal::Connection(d)) => return Err(d),
        }
        Ok(())
    }

    async fn dispatch(&mut self, reply: Reply, method: Method) -> Result<Option<Vec<u8>>, Refusal> {
        if !matches!(method, Method::Connect(_)) && !self.connected {
            // Commands before `connect` open a session implicitly: anonymous, or whoever
            // the connect hook says.
            self.connected = true;
            if self.unidentified() {
                self.identify(None)
                    .await
                    .map_err(|d| Refusal::Connection(d.disconnect()))?;
            }
            if self.transport == hooks::Transport::Websocket {
                self.announce();
            }
        }
        match method {
            Method::Connect(req) => {
                if self.connected {
                    return Err(Failure::new(ErrorCode::BadConnectState, "already connected").into());
                }
                if let Some(client) = req.client.as_deref() {
                    self.continues(client)?;
                }
                self.connected = true;
                self.connect(reply, req.token).await
            }
            Method::Refresh(req) => self.refresh(reply, req).await,
            Method::Subscribe(_) | Method::Unsubscribe { .. } if self.stateless => Err(Failure::new(
                ErrorCode::BadRequest,
                "subscribe and unsubscribe need a session: send them with ?session=ID of an open stream, \
                 or name channels in the poll request",
            )
            .into()),
            Method::Subscribe(req) => Ok(self.subscribe(reply, req).await?),
            Method::Unsubscribe { channel } => {
                if !self.leave_channel(&channel).await {
                    return Err(Failure::new(
                        ErrorCode::NotSubscribed,
                        format!("not subscribed to {channel}"),
                    )
                    .into());
                }
                self.drop_grant(&channel);
                Ok(reply.with(Outcome::Unsubscribe))
            }
            Method::Publish {
                channel,
                data,
                idempotency_key,
                conflation_key,
            } => {
                let keys = (idempotency_key.as_deref(), conflation_key.as_deref());
                Ok(self.publish(reply, channel, data, keys).await?)
            }
            Method::History(req) => Ok(self.history(reply, req).await?),
            Method::Rpc(req) => Ok(self.rpc(reply, req).await?),
            Method::Presence(req) => Ok(self.presence(reply, req).await?),
            Method::PresenceStats { channel } => Ok(self.presence_stats(reply, channel).await?),
            Method::Ping => Ok(reply.with(Outcome::Ping)),
        }
    }

    /// `publish`: the rules, then the namespace's publish hook (which may refuse or
    /// rewrite the data), then the broker.
    async fn publish(
        &mut self,
        reply: Reply,
        channel: ChannelName,
        data: bytes::Bytes,
        (key, conflation): (Option<&str>, Option<&str>),
    ) -> Result<Option<Vec<u8>>, Failure> {
        let position = self
            .publish_as_client(&channel, data, key, conflation)
            .await?;
        Ok(reply.with(Outcome::Publish(results::Published {
            offset: position.position.offset,
            epoch: &position.position.epoch,
            repeat: position.repeat,
        })))
    }

    /// A client's publication: the rules, then the namespace's publish hook (which may
    /// refuse or rewrite the data), then the broker; `key` its idempotency key,
    /// `conflation` its conflation key.
    pub(super) async fn publish_as_client(
        &mut self,
        channel: &ChannelName,
        data: bytes::Bytes,
        key: Option<&str>,
        conflation: Option<&str>,
    ) -> Result<publish::Published, Failure> {
        let node = self.node().clone();
        let hooked = node.settings.namespace(channel.namespace()).publish_hook;
        policy::check(&node, self.asker(channel), Action::Publish, channel)?;
        let data = match node.settings.hooks.publish.as_ref().filter(|_| hooked) {
            None => data,
            Some(hook) => {
                self.hook_budget()?;
                let raw = raw_json(&data);
                let request = hooks::PublishRequest {
                    client: self.hook_client(),
                    channel,
                    data: raw,
                };
                let answer: hooks::DataResult = hook
                    .call(&request)
                    .await
                    .map_err(|e| e.failure("publish"))?;
                match answer.data {
                    Some(rewritten) => hooks::checked_data(&rewritten, "publish")?,
                    None => data,
                }
            }
        };
        let from = self.sender(channel);
        let key = key.map(|k| (k, self.publisher()));
        let published = (data, from.as_deref());
        publish::from_client(&node, self.address, channel, published, conflation, key).await
    }

    /// Whose idempotency keys this client's are: its user's, or when anonymous its
    /// connection's, or without one (a stateless send) its address's (see
    /// [`publish::Publisher`]).
    fn publisher(&self) -> publish::Publisher<'_> {
        match (self.user(), self.address) {
            ("", Some(ip)) if self.stateless => publish::Publisher::Address(ip),
            ("", _) => publish::Publisher::Connection(self.first_client()),
            (user, _) => publish::Publisher::User(user),
        }
    }

    /// `rpc`: the client's call, answered by the backend's rpc hook.
    async fn rpc(
        &mut self,
        reply: Reply,
        req: herald_protocol::command::RpcRequest,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let data = self
            .call_rpc(&req.method, raw_json(&req.data), None)
            .await?;
        Ok(reply.with(Outcome::Rpc(results::Rpc {
            data: raw_json(&data),
        })))
    }

    /// Asks the backend's rpc hook `method` with `data` (about `channel`, for a front
    /// whose calls are made on one: a Phoenix push the app answers as `handle_in` would):
    /// its answer's data (`null` when it has none), checked JSON.
    pub async fn call_rpc(
        &mut self,
        method: &str,
        data: &serde_json::value::RawValue,
        channel: Option<&ChannelName>,
    ) -> Result<bytes::Bytes, Failure> {
        let node = self.node().clone();
        if self.identity().is_some_and(|i| i.operator) {
            return Err(Failure::new(
                ErrorCode::PermissionDenied,
                "a dashboard ticket reads Herald's own channels only; rpc needs the application's token",
            ));
        }
        let Some(hook) = node.settings.hooks.rpc.as_ref() else {
            return Err(Failure::new(
                ErrorCode::NotAvailable,
                "rpc needs a backend to answer it: this server has no hooks.rpc_url",
            ));
        };
        self.hook_budget()?;
        let request = hooks::RpcRequest {
            client: self.hook_client(),
            method,
            data,
            channel: channel.map(ChannelName::as_str),
        };
        let answer: hooks::DataResult = hook.call(&request).await.map_err(|e| e.failure("rpc"))?;
        match answer.data {
            Some(data) => hooks::checked_data(&data, "rpc"),
            None => Ok(bytes::Bytes::from_static(b"null")),
        }
    }

    /// The id clients use to address this session (`client` in the connect result);
    /// unguessable, so that only the client that opened a stream can send into it.
    pub fn client(&self) -> &str {
        &self.client
    }

    /// The id this client sends back when it reconnects or polls again (see
    /// [`Session::continues`]): its first connection's.
    pub fn first_client(&self) -> &str {
        self.first_client.as_deref().unwrap_or(&self.client)
    }

    /// The `connect` push that opens streams whose client sent no `connect` command.
    pub fn connect_push(&self) -> Vec<u8> {
        self.codec().push(&Push::Connect(&self.connect_result()))
    }

    /// Makes `subscribe` and `unsubscribe` fail: for sessions that live for one request
    /// (polling, sending without a stream), where a subscription would outlive nothing.
    pub fn stateless(mut self) -> Self {
        self.stateless = true;
        self
    }

    /// Refuses subscriptions that would make the cursor longer than `bytes`: for SSE, whose
    /// event ids carry the whole cursor and come back as `Last-Event-ID` (a header, which
    /// proxies bound too).
    pub fn cursor_bound(mut self, bytes: usize) -> Self {
        self.cursor_bound = Some(bytes);
        self
    }

    /// Charges every command of this session to client address `ip` as well.
    pub fn charged_to(mut self, ip: std::net::IpAddr) -> Self {
        self.address = Some(ip);
        self.charge_commands = true;
        self
    }

    /// The client's address (see [`crate::limits`]), when the transport admitted it by one.
    pub fn at_address(mut self, ip: Option<std::net::IpAddr>) -> Self {
        self.address = ip;
        self
    }
}

/// Events for the backend (`hooks.events_url`, see [`hooks::events`]).
impl Session {
    /// Tells the backend this connection is open: for connections that live (WebSocket
    /// and the streams), once; polls and sends are requests, not connections.
    pub fn announce(&mut self) {
        let request = self.transport.is_request();
        if self.announced || request || self.node().events.is_none() {
            return;
        }
        self.announced = true;
        self.event("connect", None, None);
    }

    /// Records an event of this (announced) connection.
    fn event(&self, kind: &'static str, channel: Option<&ChannelName>, end: Option<(u16, &str)>) {
        let Some(events) = self.node().events.as_ref().filter(|_| self.announced) else {
            return;
        };
        events.record(&hooks::events::Event {
            kind,
            client: &self.client,
            user: self.identity().map(|i| &*i.user),
            transport: self.transport,
            channel,
            code: end.map(|(code, _)| code),
            reason: end.map(|(_, reason)| reason),
            time: hooks::events::now_ms(),
        });
    }

    /// The client closed its connection saying so (a WebSocket close frame, a page that
    /// was closed or navigated away): its memberships leave at once, as after an
    /// unsubscribe, since nobody is coming back for them.
    pub fn left_on_purpose(&mut self) {
        self.left_on_purpose = true;
    }

    /// Tells the backend the connection ended, and why (`None`: the client closed it).
    pub fn ending(&mut self, why: Option<&Disconnect>) {
        let end = why.map_or((1000, "closed by the client"), |d| {
            (d.wire_code(), &d.reason)
        });
        // Connections that live end once; a poll's end is its request's.
        if self.counted && !self.transport.is_request() && !self.end_counted {
            self.end_counted = true;
            self.node().metrics.disconnected(end.0);
        }
        self.event("disconnect", None, Some(end));
        self.announced = false;
    }
}

/// The node a client id names (ids are `NODE-RANDOM`, see [`Session::new`]), if it can be
/// one: node ids are short and alphanumeric, and anything else is not worth a round trip
/// through the broker.
pub fn node_of(client: &str) -> Option<&str> {
    let node = client.split('-').next()?;
    let plausible =
        (1..=32).contains(&node.len()) && node.bytes().all(|b| b.is_ascii_alphanumeric());
    plausible.then_some(node)
}

/// Validated JSON text (a payload checked when it was decoded) as a raw value.
pub(crate) fn raw_json(data: &[u8]) -> &serde_json::value::RawValue {
    let text = std::str::from_utf8(data).expect("payloads are checked UTF-8 JSON");
    serde_json::from_str(text).expect("payloads are checked JSON")
}

impl Drop for Session {
    fn drop(&mut self) {
        // The transport ended without saying why: the client left (or a defect's panic
        // unwound it). Nothing is recorded when the transport said already.
        self.ending(None);
        if self.counted {
            self.node().metrics.closed(self.transport);
            // Only connections are registered (`came_by`): a poll's end takes no lock.
            if !self.transport.is_request() {
                self.node().sessions.remove(&self.client);
            }
        }
        if self.subscriptions.is_empty() {
            return;
        }
        let channels = self.subscriptions.take_channels();
        let grace = if self.left_on_purpose {
            std::time::Duration::ZERO
        } else {
            self.presence_grace()
        };
        self.leave_later(channels, grace);
    }
}

impl Session {
    /// Leaves the hub's `channels` (and their presence, after `grace`) in a task of its
    /// own: leaving is async (the broker may need a round trip), and the caller cannot
    /// wait (a session being dropped, a transport draining its queue).
    fn leave_later(&self, channels: Vec<ChannelName>, grace: std::time::Duration) {
        let node = self.node().clone();
        let id = self.id();
        let memberships: Vec<_> = channels
            .iter()
            .filter_map(|c| Some((c.clone(), self.membership(c)?)))
            .collect();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for channel in channels {
                    node.hub.unsubscribe(&node.broker, &channel, id).await;
                }
                for (channel, joining) in memberships {
                    node.presence.leave(&channel, joining, grace).await;
                }
            });
        }
    }
}

/// How to answer the command being handled: commands without an id get no reply.
#[derive(Clone, Copy)]
struct Reply {
    id: Option<u64>,
    codec: &'static dyn Codec,
}

impl Reply {
    fn with(self, outcome: Outcome<'_>) -> Option<Vec<u8>> {
        self.id.map(|id| {
            self.codec
                .reply(&herald_protocol::Reply::Done { id, outcome })
        })
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply").field("id", &self.id).finish()
    }
}

impl Session {
    /// Appends a command's failure to `out`.
    fn refuse(&self, out: &mut Vec<u8>, id: Option<u64>, code: impl Into<u16>, message: &str) {
        let codec = self.codec();
        let refusal = codec.reply(&herald_protocol::Reply::error(id, code, message));
        codec.join(out, &refusal);
    }

    /// Appends an encoded push or reply to `out`, a frame being built.
    pub(crate) fn append(&self, out: &mut Vec<u8>, encoded: &[u8]) {
        self.codec().join(out, encoded);
    }
}

#[cfg(test)]
mod tests;

//! The node: what every connection and request shares.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use herald_broker::{
    DurableBroker, Engine, MemoryBroker, OpenError, PublicationSink, Routed, SharedBroker,
    SharedLink,
};
use tokio_util::{
    sync::{CancellationToken, WaitForCancellationFuture},
    task::TaskTracker,
};

use crate::{hub::Hub, settings::Settings};

/// The node's shutdown: waited for like a [`CancellationToken`], and asked about with one
/// atomic load (a token's `is_cancelled` takes a lock every connection shares, several
/// times a long-poll).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
    started: Arc<AtomicBool>,
}

impl Shutdown {
    /// Starts the shutdown.
    pub fn cancel(&self) {
        self.started.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// Whether the shutdown has started.
    pub fn is_cancelled(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    /// Done when the shutdown starts.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// A token cancelled with the shutdown, for what waits on one (cancelling it does not
    /// shut the node down).
    pub fn token(&self) -> CancellationToken {
        self.token.child_token()
    }
}

/// The engines the server carries itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedded {
    /// Durable namespaces in `data_dir` (surviving restarts), the rest in memory.
    Durable,
    /// Everything in memory, nothing written to disk.
    Memory,
}

/// Shared state of one Herald process.
pub struct Node {
    /// This node's id among the nodes sharing its broker (random when it is alone). Stream
    /// sessions' ids start with it, so any node can tell where a session lives.
    pub id: Box<str>,
    /// Checked configuration.
    pub settings: Settings,
    /// Where publications are stored and ordered.
    pub broker: SharedBroker,
    /// What keeps them (`memory`, `durable`, `redis`, …), as its engine names it.
    pub storage: &'static str,
    /// The link to the other nodes that share the broker; `None` when the node is alone.
    pub link: Option<SharedLink>,
    /// Local subscribers.
    pub hub: Arc<Hub>,
    /// Who is in which channel (namespaces with `presence`), and join/leave pushes.
    pub presence: Arc<crate::hub::presence::Presence>,
    /// Cancelled when the server starts shutting down; connections close with 3001.
    pub shutdown: Shutdown,
    /// Connection tasks, awaited (with a bound) on shutdown.
    pub tasks: TaskTracker,
    /// Per-client-address counters.
    pub limits: Arc<crate::limits::AddressLimits>,
    /// Open TCP sockets, whatever they carry (counted from `accept`, so a socket that never
    /// sends a whole request counts too).
    pub sockets: Arc<AtomicUsize>,
    /// Where sessions record events for the backend (`hooks.events_url`).
    pub events: Option<Arc<crate::hooks::events::EventLog>>,
    /// Each Pusher app's webhook log (by its place in `pusher.apps`), for the apps that
    /// have a `webhook_url`.
    pub webhooks: Vec<Option<Arc<crate::hooks::events::EventLog>>>,
    /// With several nodes on one broker: which of them delivers each of the shared logs
    /// above.
    pub lead: Option<crate::hooks::lead::Lead>,
    /// The names of the logs above this node delivers (`events`, `pusher-APP`), told to the
    /// other nodes with its figures.
    pub hook_logs: Vec<String>,
    /// What `GET /metrics` reports.
    pub metrics: crate::metrics::Metrics,
    /// Open connections by client id, for operators' actions.
    pub sessions: crate::registry::Registry,
    /// Set while the node sends its clients elsewhere (see [`Node::is_moving_clients`]).
    moving_clients: std::sync::atomic::AtomicBool,
    /// Wakes what waits for [`Node::moving_clients_started`].
    moving_started: tokio::sync::Notify,
    connections: AtomicUsize,
    next_session: AtomicU64,
    started: Instant,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("connections", &self.connection_count())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// A node alone on a broker built by `make_broker` around the node's hub, which keeps
    /// publications in memory.
    pub fn new(
        settings: Settings,
        make_broker: impl FnOnce(Arc<dyn PublicationSink>) -> SharedBroker,
    ) -> Arc<Self> {
        Self::with_engine(settings, |sink| Engine::alone(make_broker(sink), "memory"))
    }

    /// A node on an engine built by `make_engine` around the node's hub: a broker shared with
    /// other nodes comes with its link to them and the presence they share.
    pub fn with_engine(
        settings: Settings,
        make_engine: impl FnOnce(Arc<dyn PublicationSink>) -> Engine,
    ) -> Arc<Self> {
        let built: Result<_, std::convert::Infallible> =
            Self::try_new(settings, |sink| Ok(make_engine(sink)));
        let Ok(node) = built;
        node
    }

    /// Like [`Node::with_engine`], for engines whose construction can fail (opening a file).
    pub fn try_new<E>(
        settings: Settings,
        make_engine: impl FnOnce(Arc<dyn PublicationSink>) -> Result<Engine, E>,
    ) -> Result<Arc<Self>, E> {
        let threads = match settings.config.fanout_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get() / 2),
            n => n,
        };
        let hub = Arc::new(Hub::new(threads));
        let metrics = crate::metrics::Metrics::default();
        let Engine {
            broker,
            link,
            presence: store,
            storage,
        } = make_engine(hub.clone())?;
        let broker = crate::bounded::Bounded::wrap(broker, settings.broker);
        let broker = crate::metrics::Counted::wrap(broker, &metrics);
        let link = link.map(|link| crate::metrics::CountedLink::wrap(link, &metrics));
        let id: Box<str> = link.as_ref().map_or_else(
            || {
                herald_protocol::Epoch::random(|| fastrand::u64(..))
                    .as_str()
                    .into()
            },
            |link| link.node_id().into(),
        );
        let store = store.unwrap_or_else(|| herald_broker::MemoryPresence::new());
        let presence =
            crate::hub::presence::Presence::start(store, settings.config.presence.clone(), &hub);
        settings.tokens.prefetch();
        let limits = crate::limits::AddressLimits::new(settings.config.limits.clone());
        crate::limits::spawn_sweeper(&limits);
        // Several nodes share the logs below: for each, one of them delivers it.
        let lead = link
            .as_ref()
            .map(|link| crate::hooks::lead::Lead::new(link.clone(), Arc::from(&*id)));
        let lead_of = |log: &str| lead.as_ref().map(|lead| lead.of(log));
        let mut hook_logs = Vec::new();
        let events = settings.hooks.events(&settings.config.hooks).map(|caller| {
            caller.count_into(metrics.hook(caller.name()));
            hook_logs.push(crate::hooks::events::EVENTS_LOG.to_string());
            crate::hooks::events::EventLog::start(
                &settings.config.hooks,
                caller,
                (broker.clone(), lead_of(crate::hooks::events::EVENTS_LOG)),
            )
        });
        // Each Pusher app's webhook, delivered like the events hook, from its own log.
        let webhooks = settings
            .config
            .pusher
            .apps
            .iter()
            .map(|app| {
                let sink = crate::hooks::webhook::PusherWebhook::of(app)?;
                let name = format!("pusher-{}", app.id);
                let streams = crate::hooks::events::Streams::named(&name);
                let log = crate::hooks::events::EventLog::start_to(
                    &settings.config.hooks,
                    streams,
                    Arc::new(sink),
                    (broker.clone(), lead_of(&name)),
                );
                hook_logs.push(name);
                Some(log)
            })
            .collect();
        let shutdown = Shutdown::default();
        let node = Arc::new(Self {
            events,
            webhooks,
            lead,
            hook_logs,
            id,
            limits,
            settings,
            broker,
            storage,
            link,
            hub,
            presence,
            shutdown,
            tasks: TaskTracker::new(),
            sockets: Arc::default(),
            metrics,
            sessions: Default::default(),
            moving_clients: Default::default(),
            moving_started: tokio::sync::Notify::new(),
            connections: AtomicUsize::new(0),
            next_session: AtomicU64::new(1),
            started: Instant::now(),
        });
        // Other nodes forward commands for this node's stream sessions (`transport::send`).
        if let Some(link) = &node.link {
            let weak: std::sync::Weak<dyn herald_broker::NodeRequests> = Arc::downgrade(&node) as _;
            link.answer_nodes_with(weak);
        }
        for caller in node.settings.hooks.callers() {
            caller.count_into(node.metrics.hook(caller.name()));
        }
        Ok(node)
    }

    /// A node with the embedded memory broker.
    pub fn with_memory_broker(settings: Settings) -> Arc<Self> {
        let policies = settings.policies();
        Self::new(settings, |sink| MemoryBroker::with_policies(sink, policies))
    }

    /// A node on an embedded engine: with [`Embedded::Durable`], durable namespaces in
    /// `data_dir` and the rest in memory. (Remote brokers are the binary's to build: see
    /// [`Node::with_engine`].)
    pub fn embedded(settings: Settings, engine: Embedded) -> Result<Arc<Self>, OpenError> {
        if engine == Embedded::Memory {
            return Ok(Self::with_memory_broker(settings));
        }
        let dir = settings.config.data_dir.clone();
        if settings.config.store_cache_bytes.is_some() {
            tracing::warn!("store_cache_bytes is ignored: the store reads history through the operating system's page cache, which gives memory back when it is needed (remove the setting)");
        }
        let options = herald_broker::StoreOptions {
            sync: settings.config.sync.into(),
            sync_interval: std::time::Duration::from_millis(settings.config.sync_interval_ms),
            segment_bytes: settings.config.store_segment_bytes,
            checkpoint_bytes: settings.config.store_checkpoint_bytes,
        };
        let rules = settings.clone();
        let policies = settings.policies();
        Self::try_new(settings, |sink| {
            let memory: SharedBroker = MemoryBroker::with_policies(sink.clone(), policies.clone());
            let durable = DurableBroker::open_with(&dir, options, sink, policies)?;
            let is_durable =
                move |c: &herald_protocol::ChannelName| rules.namespace(c.namespace()).durable;
            Ok(Engine::alone(
                Arc::new(Routed::new(durable, memory, is_durable)),
                "durable",
            ))
        })
    }

    /// Registers a new connection; the guard unregisters it when dropped.
    pub fn connection(self: &Arc<Self>) -> ConnectionGuard {
        self.connections.fetch_add(1, Ordering::Relaxed);
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard {
            node: self.clone(),
            id,
        }
    }

    /// Whether the node sends its clients elsewhere (its broker out of reach past
    /// `clients_move_after`, see [`crate::relocate`]): no kept-alive HTTP connection then
    /// carries another request, so a client's next one goes through its load balancer to a
    /// node that is ready.
    pub fn is_moving_clients(&self) -> bool {
        self.moving_clients
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts or stops sending clients elsewhere.
    pub fn set_moving_clients(&self, away: bool) {
        let was = self
            .moving_clients
            .swap(away, std::sync::atomic::Ordering::Relaxed);
        if away && !was {
            self.moving_started.notify_waiters();
        }
    }

    /// Returns once the node sends its clients elsewhere: what waits on the broker for a
    /// client (a poll being opened) gives up then, instead of outliving the grace.
    pub async fn moving_clients_started(&self) {
        let started = self.moving_started.notified();
        tokio::pin!(started);
        started.as_mut().enable();
        if self.is_moving_clients() {
            return;
        }
        started.await;
    }

    /// Open connections.
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Time since start.
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// This node's figures, as `/api/info` and `/api/nodes` give them.
    pub fn figures(&self) -> serde_json::Value {
        let (publications, deliveries) = self.hub.counters();
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "node": &*self.id,
            "storage": self.storage,
            "uptime_seconds": self.uptime().as_secs(),
            "connections": self.connection_count(),
            "channels": self.broker.channel_count(),
            "subscribed_channels": self.hub.channel_count(),
            "publications_fanned_out": publications,
            "deliveries": deliveries,
            "hook_logs": &self.hook_logs,
        })
    }

    /// Every live node's figures (this one's fresh), sorted by node id. A node that stops
    /// reporting leaves the list within the broker's time to live (10 s on Redis).
    pub async fn figures_everywhere(
        &self,
    ) -> Result<Vec<serde_json::Value>, crate::error::Failure> {
        let mut all = vec![self.figures()];
        let own = all[0]["node"].clone();
        if let Some(link) = &self.link {
            let reported = link.nodes().await;
            // Shared storage: anyone who can write there could put anything, so only
            // objects with a node id are listed.
            all.extend(
                reported?
                    .iter()
                    .filter_map(|f| serde_json::from_slice::<serde_json::Value>(f).ok())
                    .filter(|f| f["node"].is_string() && f["node"] != own),
            );
        }
        all.sort_by(|a, b| a["node"].as_str().cmp(&b["node"].as_str()));
        Ok(all)
    }

    /// `GET /metrics`: the Prometheus text of this node.
    pub fn metrics_text(&self) -> String {
        let (publications_fanned_out, deliveries) = self.hub.counters();
        self.metrics.encode(crate::metrics::Snapshot {
            publications_fanned_out,
            deliveries,
            channels: self.broker.channel_count() as u64,
            subscribed_channels: self.hub.channel_count() as u64,
            subscriptions: self.hub.subscription_count() as u64,
            sockets: self.sockets.load(Ordering::Relaxed) as u64,
            broker_lag: self.broker.delivery_lag(),
            broker_reach: self.broker.reach(),
            events_dropped: self.events.as_ref().map_or(0, |e| e.dropped()),
            refusals: self.limits.refusals.counts(),
        })
    }
}

/// How often a node of several tells the others its figures (`/api/nodes`; sent by
/// the dashboard's sampler, which [`crate::serve`] starts, with the dashboard's digest).
pub const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Counts a connection while it lives and gives it a process-unique id.
#[derive(Debug)]
pub struct ConnectionGuard {
    node: Arc<Node>,
    /// The connection's id.
    pub id: u64,
}

impl ConnectionGuard {
    /// The node this connection belongs to.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.node.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

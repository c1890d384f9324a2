//! What an operator scrapes from `GET /metrics` (Prometheus text format): counted where
//! things happen, by code that knows nothing else of the server. Nothing here takes a lock
//! per delivery:
//! - deliveries are counted by the hub per publication (one add for all its subscribers);
//! - pushes and their bytes by transport are added by each queue a batch at a time, into
//!   [`Sharded`](sharded::Sharded) sums (a slot per thread, summed when scraped), and one
//!   write in 64 per thread has its latency observed;
//! - histograms ([`Durations`]) are atomic bucket counts, not locked;
//! - figures the node already keeps (channels, sockets, process CPU and memory) are read
//!   when scraped.
//!
//! A connection's open and close are atomic adds on counters made once per transport; a
//! publication, a command, a close code or a hook call looks its counter up under a shared
//! read lock. Label values are bounded: transports, namespaces the configuration names
//! (others count as `_other`), close codes, command methods, broker operations; never
//! channel names.

mod broker;
mod histogram;
mod reading;
mod scraped;
mod sharded;
mod wire;

pub use histogram::Durations;
pub use reading::Reading;

pub use broker::{Counted, CountedLink};
pub use wire::Wire;

use scraped::Scraped;
#[cfg(test)]
use scraped::{thread_cpu, threads};

use std::{sync::Arc, time::Duration};

use crate::transports::Transport;

use parking_lot::Mutex;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportLabel {
    transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabel {
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabel {
    hook: &'static str,
}

/// One backend hook's counters, held by its caller (shared with the families).
#[derive(Clone, Debug)]
pub struct HookCounters {
    duration: Durations,
    failures: Counter,
}

impl HookCounters {
    /// A call answered (or failed: no answer in time, not a hook answer, the circuit
    /// open) after `took`. A refusal the backend answered is an answer, not a failure.
    pub fn called(&self, took: Duration, failed: bool) {
        self.duration.observe(took);
        if failed {
            self.failures.inc();
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StorageLabel {
    storage: &'static str,
}

/// Name prefixes of the threads whose CPU `/metrics` shows one by one (a thread's name is
/// at most 15 bytes): the runtime's workers (named by `herald serve`) and the hub's fan-out
/// threads. Others are summed as `other`.
pub const WORKER_THREAD: &str = "herald-w-";
pub const FANOUT_THREAD: &str = "herald-f-";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabel {
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThreadLabel {
    thread: String,
}

/// Figures the node keeps anyway, read at each scrape.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Publications fanned out and deliveries handed to queues since start.
    pub publications_fanned_out: u64,
    pub deliveries: u64,
    /// Channels the broker holds, and channels with subscribers on this node.
    pub channels: u64,
    pub subscribed_channels: u64,
    /// Subscriptions of this node's sessions, over every channel.
    pub subscriptions: u64,
    /// Open TCP sockets, whatever they carry.
    pub sockets: u64,
    /// How far behind the broker's hand-over of publications to this node was at its last
    /// check (Redis: pub/sub), when the broker measures it.
    pub broker_lag: Option<Duration>,
    /// Whether the node reaches its remote broker, when it has one.
    pub broker_reach: Option<herald_broker::Reach>,
    /// Events the backend's events hook never got: dropped while too many were pending.
    pub events_dropped: u64,
    /// Clients refused, by the setting of the limit that refused them.
    pub refusals: Vec<(&'static str, u64)>,
}

/// One node's metrics.
pub struct Metrics {
    registry: Registry,
    /// Per entry of [`Transport::COUNTED`]: its connections' counts (also held by their
    /// queues).
    wires: Arc<[Arc<Wire>]>,
    disconnects: Family<CodeLabel, Counter>,
    slow_cuts: Counter,
    publications: Family<NamespaceLabel, Counter>,
    publish_seconds: Family<StorageLabel, Durations>,
    command_seconds: Family<MethodLabel, Durations>,
    hook_seconds: Family<HookLabel, Durations>,
    hook_failures: Family<HookLabel, Counter>,
    broker_errors: Family<OperationLabel, Counter>,
    /// Long-poll sessions kept between their client's requests (Herald's and the Phoenix
    /// front's: one store).
    pub longpolls_kept: Reading,
    /// Kept long-poll sessions taken up by their client's next request: `[direct, routed]`
    /// (without the router, as an exact continuation; or through it).
    pub longpolls_taken_up: [Counter; 2],
    /// Held long-polls answered by the thread that fanned a publication out, without
    /// their connection's task (`transport::poll::lane`).
    pub longpolls_answered_by_hub: Counter,
    snapshot: Arc<Mutex<Snapshot>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopologyLabel {
    topology: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("herald");
        let connections = Family::<TransportLabel, Gauge>::default();
        registry.register(
            "connections",
            "Open connections by transport (long-polls and polls: requests in progress)",
            connections.clone(),
        );
        let accepted = Family::<TransportLabel, Counter>::default();
        registry.register(
            "connections_accepted",
            "Connections accepted by transport (long-polls and polls: requests)",
            accepted.clone(),
        );
        let disconnects = Family::<CodeLabel, Counter>::default();
        registry.register(
            "disconnects",
            "Connections ended, by close code (1000: the client left; 3003: slow consumer cut; see docs/protocol.md)",
            disconnects.clone(),
        );
        let publications = Family::<NamespaceLabel, Counter>::default();
        registry.register(
            "publications",
            "Publications accepted (from clients and the API), by namespace (_other: namespaces the configuration does not name)",
            publications.clone(),
        );
        let publish_seconds = Family::<StorageLabel, Durations>::default();
        registry.register(
            "publish_duration_seconds",
            "From a publication's arrival to its acknowledgement (stored, offset given), by storage",
            publish_seconds.clone(),
        );
        let command_seconds = Family::<MethodLabel, Durations>::default();
        registry.register(
            "command_duration_seconds",
            "Client commands from arrival to reply, by method",
            command_seconds.clone(),
        );
        let hook_seconds = Family::<HookLabel, Durations>::default();
        registry.register(
            "hook_duration_seconds",
            "Calls of the application backend's hooks, from asking to the answer (or the failure), by hook",
            hook_seconds.clone(),
        );
        let hook_failures = Family::<HookLabel, Counter>::default();
        registry.register(
            "hook_failures",
            "Hook calls that failed: no answer within hooks.timeout, not a hook answer, HTTP errors, or the circuit open (clients got 118 or 3008)",
            hook_failures.clone(),
        );
        let slow_cuts = Counter::default();
        registry.register(
            "slow_consumer_cuts",
            "Connections closed with 3003, slow consumers: their queue passed client.queue_max_bytes or a write took longer than client.write_timeout (they resume from history)",
            slow_cuts.clone(),
        );
        let latency = Family::<TransportLabel, Durations>::default();
        registry.register(
            "delivery_latency_seconds",
            "From the hub receiving a publication to its push being handed to a client's socket, by transport; one write in 64 per thread is observed",
            latency.clone(),
        );
        let broker_errors = Family::<OperationLabel, Counter>::default();
        registry.register(
            "broker_errors",
            "Broker calls that failed (storage or Redis unavailable, refused), by operation",
            broker_errors.clone(),
        );
        let longpolls_kept = Reading::default();
        registry.register(
            "longpoll_sessions_kept",
            "Long-poll sessions kept, still subscribed, between their client's requests (Herald's session_key, for http.longpoll_grace; the Phoenix front's long-polls)",
            longpolls_kept.clone(),
        );
        let taken_up = Family::<PathLabel, Counter>::default();
        let longpolls_taken_up =
            ["direct", "routed"].map(|path| taken_up.get_or_create(&PathLabel { path }).clone());
        registry.register(
            "longpoll_sessions_taken_up",
            "Kept long-poll sessions taken up by their client's next request, by path (direct: an exact continuation answered without the router)",
            taken_up,
        );
        let longpolls_answered_by_hub = Counter::default();
        registry.register(
            "longpoll_hub_answers",
            "Held long-polls answered with a publication by the thread that fanned it out, without waking their connection's task",
            longpolls_answered_by_hub.clone(),
        );
        let wires: Arc<[Arc<Wire>]> = Transport::COUNTED
            .iter()
            .map(|t| {
                let transport = t.name();
                let label = TransportLabel { transport };
                Arc::new(Wire::new(
                    transport,
                    latency.get_or_create(&label).clone(),
                    connections.get_or_create(&label).clone(),
                    accepted.get_or_create(&label).clone(),
                ))
            })
            .collect();
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        registry.register_collector(Box::new(Scraped {
            snapshot: snapshot.clone(),
            wires: wires.clone(),
        }));
        Self {
            registry,
            wires,
            disconnects,
            slow_cuts,
            broker_errors,
            publications,
            publish_seconds,
            command_seconds,
            hook_seconds,
            hook_failures,
            longpolls_kept,
            longpolls_taken_up,
            longpolls_answered_by_hub,
            snapshot,
        }
    }
}

impl Metrics {
    /// A connection (or poll request) of `transport` opened.
    pub fn opened(&self, transport: Transport) {
        if let Some(wire) = self.transport(transport) {
            wire.opened();
        }
    }

    /// A connection counted by [`Metrics::opened`] is gone.
    pub fn closed(&self, transport: Transport) {
        if let Some(wire) = self.transport(transport) {
            wire.closed();
        }
    }

    /// The counts of one of [`Transport::COUNTED`].
    fn transport(&self, transport: Transport) -> Option<&Arc<Wire>> {
        self.wires.get(transport.counted()?)
    }

    /// The counts of `transport`'s connections, for their queues to hold.
    pub fn wire(&self, transport: Transport) -> Option<Arc<Wire>> {
        self.transport(transport).cloned()
    }

    /// A connection ended with close `code` (1000 when the client left).
    pub fn disconnected(&self, code: u16) {
        if code == herald_protocol::DisconnectCode::Slow.code() {
            self.slow_cuts.inc();
        }
        self.disconnects.get_or_create(&CodeLabel { code }).inc();
    }

    /// The counter of failed broker calls of `operation`, for [`Counted`] to hold.
    fn broker_errors(&self, operation: &'static str) -> Counter {
        self.broker_errors
            .get_or_create(&OperationLabel { operation })
            .clone()
    }

    /// A publication was accepted in `namespace` (a name the configuration lists, or
    /// `_other`) after `took`, on `storage`.
    pub fn published(&self, namespace: &str, storage: &'static str, took: Duration) {
        self.publications
            .get_or_create(&NamespaceLabel {
                namespace: namespace.to_string(),
            })
            .inc();
        self.publish_seconds
            .get_or_create(&StorageLabel { storage })
            .observe(took);
    }

    /// A client command of `method` was answered after `took`.
    pub fn command(&self, method: &'static str, took: Duration) {
        self.command_seconds
            .get_or_create(&MethodLabel { method })
            .observe(took);
    }

    /// The counters of the backend hook `hook`, for its caller to hold.
    pub fn hook(&self, hook: &'static str) -> HookCounters {
        let label = HookLabel { hook };
        HookCounters {
            duration: self.hook_seconds.get_or_create(&label).clone(),
            failures: self.hook_failures.get_or_create(&label).clone(),
        }
    }

    /// Everything, in the Prometheus text format, with `snapshot` as the node's figures.
    pub fn encode(&self, snapshot: Snapshot) -> String {
        *self.snapshot.lock() = snapshot;
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests;

//! What connects the nodes that share a broker, beside the streams: each node's id, requests
//! from one node to another, and the registry of live nodes. A broker that serves one node
//! has none of it; a remote one (Redis, and the engines to come) provides it through the
//! same connection as its streams. Presence shared between nodes comes with it too: an
//! [`Engine`] is all three, as one remote store gives them.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use bytes::Bytes;

use crate::{BrokerError, SharedBroker, SharedPresence};

/// The link between the nodes that share a broker.
#[async_trait]
pub trait NodeLink: Send + Sync + 'static {
    /// This node's id among the nodes that share the broker.
    fn node_id(&self) -> &str;

    /// Sends `request` to the node with id `node` and returns its answer: for a command that
    /// must reach a session living on that node.
    async fn ask_node(&self, node: &str, request: Bytes) -> Result<Bytes, BrokerError>;

    /// Where requests from other nodes go (see [`NodeLink::ask_node`]).
    fn answer_nodes_with(&self, handler: Weak<dyn NodeRequests>);

    /// Tells the other nodes that this one is alive, with its `figures` (JSON, opaque here),
    /// for [`NodeLink::nodes`].
    async fn report_node(&self, figures: Bytes) -> Result<(), BrokerError>;

    /// The latest figures of every node that reported within the link's time to live.
    async fn nodes(&self) -> Result<Vec<Bytes>, BrokerError>;
}

/// A link behind a shared handle.
pub type SharedLink = Arc<dyn NodeLink>;

/// Answers what other nodes [ask](NodeLink::ask_node) this one.
#[async_trait]
pub trait NodeRequests: Send + Sync + 'static {
    /// The answer to one request.
    async fn answer(&self, request: Bytes) -> Bytes;
}

/// What a node runs on: its broker and, when the broker is shared by several nodes, the
/// link between them and the presence store they share.
#[derive(Clone)]
pub struct Engine {
    /// Publications, history and subscriptions.
    pub broker: SharedBroker,
    /// `None`: the node is alone.
    pub link: Option<SharedLink>,
    /// `None`: the node keeps presence itself ([`crate::MemoryPresence`]).
    pub presence: Option<SharedPresence>,
    /// What keeps publications (`memory`, `durable`, `redis`, …), for `/api/info` and
    /// metrics' labels.
    pub storage: &'static str,
}

impl Engine {
    /// A broker that serves one node, keeping publications in `storage`.
    pub fn alone(broker: SharedBroker, storage: &'static str) -> Self {
        Self {
            broker,
            link: None,
            presence: None,
            storage,
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("linked", &self.link.is_some())
            .field("shared_presence", &self.presence.is_some())
            .finish_non_exhaustive()
    }
}

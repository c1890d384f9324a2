//! The link between the nodes on one NATS: requests travel as core NATS requests to the
//! asked node's own subject, and each node's figures live in a key-value bucket whose
//! entries expire when a node stops reporting.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use async_nats::{
    jetstream::{self, kv},
    Client,
};
use bytes::Bytes;
use futures_util::StreamExt;
use herald_broker::{BrokerError, NodeRequests};
use parking_lot::Mutex;
use tokio::task::AbortHandle;

use crate::{names::Names, unavailable, COMMAND_WAIT};

/// How long a node that stopped reporting stays in the list of nodes: nodes report every
/// 2 s (the server's choice), so a node that dies leaves the list within this.
pub const NODE_REPORT_TTL: Duration = Duration::from_secs(10);

/// How long a node waits for another node's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// The link, as one node holds it.
pub(crate) struct Link {
    client: Client,
    names: Names,
    pub(crate) node_id: String,
    figures: kv::Store,
    answerer: Arc<Mutex<Option<Weak<dyn NodeRequests>>>>,
    answering: AbortHandle,
}

impl Link {
    /// Finds or makes the figures bucket, and starts answering this node's requests.
    pub(crate) async fn open(
        client: Client,
        js: &jetstream::Context,
        names: Names,
        node_id: String,
        replicas: usize,
    ) -> Result<Self, BrokerError> {
        let figures =
            crate::bucket::open(js, &names.nodes_bucket(), Some(NODE_REPORT_TTL), replicas).await?;
        let requests = client
            .subscribe(names.node(&node_id))
            .await
            .map_err(unavailable)?;
        let answerer: Arc<Mutex<Option<Weak<dyn NodeRequests>>>> = Arc::default();
        let answering = tokio::spawn(answer(client.clone(), requests, answerer.clone()));
        Ok(Self {
            client,
            names,
            node_id,
            figures,
            answerer,
            answering: answering.abort_handle(),
        })
    }

    pub(crate) async fn ask(&self, node: &str, request: Bytes) -> Result<Bytes, BrokerError> {
        let asking = self.client.request(self.names.node(node), request);
        match tokio::time::timeout(ANSWER_WAIT, asking).await {
            Ok(Ok(answer)) => Ok(answer.payload),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => Err(
                BrokerError::Unavailable(format!("node {node} is not connected")),
            ),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => Err(BrokerError::Unavailable(format!(
                "node {node} did not answer within {ANSWER_WAIT:?}"
            ))),
        }
    }

    pub(crate) fn answer_with(&self, handler: Weak<dyn NodeRequests>) {
        *self.answerer.lock() = Some(handler);
    }

    pub(crate) async fn report(&self, figures: Bytes) -> Result<(), BrokerError> {
        tokio::time::timeout(COMMAND_WAIT, self.figures.put(&self.node_id, figures))
            .await
            .map_err(|_| BrokerError::Unavailable("nats: reporting timed out".into()))?
            .map(|_| ())
            .map_err(unavailable)
    }

    pub(crate) async fn nodes(&self) -> Result<Vec<Bytes>, BrokerError> {
        let listing = async {
            let mut keys = self.figures.keys().await.map_err(unavailable)?;
            let mut figures = Vec::new();
            while let Some(key) = keys.next().await {
                let key = key.map_err(unavailable)?;
                if let Some(value) = self.figures.get(key).await.map_err(unavailable)? {
                    figures.push(value);
                }
            }
            Ok(figures)
        };
        tokio::time::timeout(COMMAND_WAIT, listing)
            .await
            .map_err(|_| BrokerError::Unavailable("nats: listing nodes timed out".into()))?
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.answering.abort();
    }
}

/// Answers each request to this node, each in its own task (one slow answer holds up no
/// other).
async fn answer(
    client: Client,
    mut requests: async_nats::Subscriber,
    answerer: Arc<Mutex<Option<Weak<dyn NodeRequests>>>>,
) {
    while let Some(request) = requests.next().await {
        let Some(reply) = request.reply else { continue };
        let Some(handler) = answerer.lock().as_ref().and_then(Weak::upgrade) else {
            continue;
        };
        let client = client.clone();
        tokio::spawn(async move {
            let answer = handler.answer(request.payload).await;
            if let Err(e) = client.publish(reply, answer).await {
                tracing::info!(error = %e, "nats: could not answer another node");
            }
        });
    }
}

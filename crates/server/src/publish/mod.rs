//! ① Publishing: the checks every publication passes, whoever sends it.

pub mod http_api;

use bytes::Bytes;
use herald_protocol::{ChannelName, ErrorCode, StreamPosition};

use crate::{error::Failure, node::Node};

/// Checks a publication against its namespace's limits and hands it to the broker.
/// Permission to publish is the caller's to check (clients need the namespace's
/// `client_publish`; API callers have a key).
pub async fn publish(
    node: &Node,
    channel: &ChannelName,
    data: Bytes,
) -> Result<StreamPosition, Failure> {
    let ns = node.settings.namespace(channel.namespace());
    if data.len() > ns.max_message_size {
        return Err(Failure::new(
            ErrorCode::MessageTooLarge,
            format!(
                "publication is {} bytes; the limit in this namespace is {}",
                data.len(),
                ns.max_message_size
            ),
        ));
    }
    if node.shutdown.is_cancelled() {
        return Err(Failure::new(
            ErrorCode::ShuttingDown,
            "server is shutting down",
        ));
    }
    Ok(node
        .broker
        .publish(channel, data, ns.stream_policy())
        .await?)
}

//! Reading history, the same way for clients and for the HTTP API.

use herald_broker::{History, HistoryQuery};
use herald_protocol::{ChannelName, Since};

use crate::{error::Failure, node::Node};

/// Reads up to `limit` publications (capped by `client.max_history_limit`; `None` means
/// the cap) after `since`, or the newest ones without it: one page, at most about
/// `client.max_history_bytes` of data. The answer's position tells whether more follow.
pub async fn read(
    node: &Node,
    channel: &ChannelName,
    since: Option<Since>,
    limit: Option<usize>,
) -> Result<History, Failure> {
    let client = &node.settings.config.client;
    let max = client.max_history_limit;
    let query = HistoryQuery {
        since,
        limit: limit.map_or(max, |l| l.min(max)),
        max_bytes: Some(client.max_history_bytes),
    };
    Ok(node.broker.history(channel, query).await?)
}

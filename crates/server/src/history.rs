//! Reading history, the same way for clients and for the HTTP API.

use herald_broker::{History, HistoryQuery};
use herald_protocol::{ChannelName, Since};

use crate::{error::Failure, node::Node};

/// Reads up to `limit` publications (capped by `client.max_history_limit`; `None` means
/// the cap) after `since`, or the newest ones without it.
pub async fn read(
    node: &Node,
    channel: &ChannelName,
    since: Option<Since>,
    limit: Option<usize>,
) -> Result<History, Failure> {
    let max = node.settings.config.client.max_history_limit;
    let limit = limit.map_or(max, |l| l.min(max));
    Ok(node
        .broker
        .history(channel, HistoryQuery { since, limit })
        .await?)
}

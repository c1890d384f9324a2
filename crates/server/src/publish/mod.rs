//! ① Publishing: the checks every publication passes, whoever sends it.

use std::net::IpAddr;

use bytes::Bytes;
use herald_broker::HistoryQuery;
use herald_protocol::{ChannelName, ErrorCode, Publication, StreamPosition};

use crate::{error::Failure, node::Node};

/// A client's publication, from `address` when known: as [`publish`], and a publication
/// that makes its channel exist is charged to the address's `new_channels_per_address`, so
/// no client can make channel state without bound (each stream is kept by its namespace's
/// rules, durable ones on disk). Permission is the caller's to check, as for [`publish`].
/// `from`: who sent it (`{"user":…,"info":…}`), shown with it, for an authenticated client.
pub async fn from_client(
    node: &Node,
    address: Option<IpAddr>,
    channel: &ChannelName,
    data: Bytes,
    from: Option<&[u8]>,
) -> Result<StreamPosition, Failure> {
    if let Some(ip) = address {
        // Only an address over its allowance pays for the look; others publish at once
        // and are charged afterwards if the publication was its channel's first.
        if !node.limits.may_create_channel(ip) && !exists(node, channel).await? {
            let limit = node.settings.config.limits.new_channels_per_address;
            node.limits.refusals.count(
                crate::limits::Limit::NewChannelsPerAddress,
                Some(ip),
                format_args!("{limit}/min"),
            );
            return Err(Failure::new(
                ErrorCode::TooManyRequests,
                format!(
                    "this address made more than {limit} new channels per minute; \
                     publish to an existing channel or retry later"
                ),
            ));
        }
    }
    let position = publish(node, channel, data, from).await?;
    if let (Some(ip), 1) = (address, position.offset) {
        node.limits.created_channel(ip);
    }
    Ok(position)
}

/// Whether a channel has a stream with publications.
async fn exists(node: &Node, channel: &ChannelName) -> Result<bool, Failure> {
    let position = node
        .broker
        .history(channel, HistoryQuery::newest(0))
        .await?
        .position;
    Ok(position.offset > 0)
}

/// Checks a publication against its namespace's limits and hands it to the broker.
/// Permission to publish is the caller's to check (clients ask [`crate::policy`]; API
/// callers have a key). The size limit is the data's; `from` (see [`from_client`]) is
/// stored with it.
pub async fn publish(
    node: &Node,
    channel: &ChannelName,
    data: Bytes,
    from: Option<&[u8]>,
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
    let started = std::time::Instant::now();
    let position = node
        .broker
        .publish(channel, Publication::record(data, from), ns.stream_policy())
        .await?;
    let storage = match node.settings.config.storage {
        crate::config::StorageEngine::Redis => "redis",
        _ if ns.durable
            && node.settings.config.storage == crate::config::StorageEngine::Durable =>
        {
            "durable"
        }
        _ => "memory",
    };
    node.metrics.published(
        node.settings.namespace_label(channel.namespace()),
        storage,
        started.elapsed(),
    );
    Ok(position)
}

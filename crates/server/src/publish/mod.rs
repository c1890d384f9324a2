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
/// `from`: who sent it (`{"user":…,"info":…}`), shown with it, for an authenticated client;
/// `conflation`: its conflation key.
pub async fn from_client(
    node: &Node,
    address: Option<IpAddr>,
    channel: &ChannelName,
    (data, from): (Bytes, Option<&[u8]>),
    conflation: Option<&str>,
    key: Option<(&str, Publisher<'_>)>,
) -> Result<Published, Failure> {
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
    let published = publish_keyed(node, channel, (data, from), conflation, key).await?;
    if let (Some(ip), 1, false) = (address, published.position.offset, published.repeat) {
        node.limits.created_channel(ip);
    }
    Ok(published)
}

/// A publication as stored.
#[derive(Debug, Clone)]
pub struct Published {
    /// Where.
    pub position: StreamPosition,
    /// Whether an earlier publish with the same idempotency key stored it (this one stored
    /// nothing).
    pub repeat: bool,
}

/// Longest idempotency key, in bytes.
pub const MAX_KEY_LEN: usize = herald_broker::once::MAX_KEY_LEN;

/// Who publishes with an idempotency key. A key only ever matches keys of the same
/// publisher, so that nobody can make another's publication a "repeat" by using its key
/// first (a client that guesses the backend's next order id).
#[derive(Debug, Clone, Copy)]
pub enum Publisher<'a> {
    /// The backend, through the HTTP API (every API key alike: they are all the
    /// operator's, and a retry may come with the next key of a rotation).
    Backend,
    /// A client identified as this user: every connection of the user alike.
    User(&'a str),
    /// An anonymous client: the id of its first connection, which it sends back when it
    /// reconnects (a 128-bit secret of its own).
    Connection(&'a str),
    /// An anonymous client without a connection (a stateless `POST /connection/send`, as
    /// the poll transports publish): its address, so that its retries still meet.
    Address(IpAddr),
}

impl Publisher<'_> {
    /// `key` as the broker keeps it. The backend's keys are kept as sent (as earlier
    /// versions kept them, so that nodes of both agree). A client's get a space and its
    /// scope after them: no key sent has a space, so none can be one of these, and two
    /// scopes never share one. The scope is hashed: fixed in length, and no user id is
    /// written into the store's keys.
    fn scoped(self, key: &str) -> std::borrow::Cow<'_, str> {
        use sha2::Digest;
        let address;
        let (kind, who) = match self {
            Publisher::Backend => return key.into(),
            Publisher::User(user) => ('u', user),
            Publisher::Connection(client) => ('c', client),
            Publisher::Address(ip) => {
                address = ip.to_string();
                ('a', address.as_str())
            }
        };
        let digest = sha2::Sha256::digest(who.as_bytes());
        format!("{key} {kind}{}", hex::encode(&digest[..16])).into()
    }
}

/// Checks an idempotency key: 1 to 128 visible ASCII characters.
pub fn checked_key(key: &str) -> Result<&str, Failure> {
    let fits =
        !key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(|b| b.is_ascii_graphic());
    fits.then_some(key).ok_or_else(|| {
        Failure::new(
            ErrorCode::BadRequest,
            format!("idempotency_key must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
        )
    })
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
    Ok(publish_keyed(node, channel, (data, from), None, None)
        .await?
        .position)
}

/// [`publish`], once per idempotency `key` (of its publisher: see [`Publisher`]) and
/// channel within `idempotency_window`, with a `conflation` key when given (see
/// [`herald_protocol::Publication::conflation_key`]).
pub async fn publish_keyed(
    node: &Node,
    channel: &ChannelName,
    (data, from): (Bytes, Option<&[u8]>),
    conflation: Option<&str>,
    key: Option<(&str, Publisher<'_>)>,
) -> Result<Published, Failure> {
    if let Some(c) = conflation.filter(|c| !herald_protocol::valid_conflation_key(c)) {
        let why = format!(
            "conflation_key must be 1 to {} bytes without control characters; got {} bytes",
            herald_protocol::MAX_CONFLATION_KEY,
            c.len()
        );
        return Err(Failure::new(ErrorCode::BadRequest, why));
    }
    let key = match key {
        Some((key, publisher)) => Some(publisher.scoped(checked_key(key)?)),
        None => None,
    };
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
    // A node that knows it cannot reach its broker says so at once, and sends nothing.
    // Asked once: whether the broker is remote, and whether its way is known lost.
    let reach = node.broker.reach();
    let remote = reach.is_some();
    if let Some(why) = reach.and_then(|r| r.writes_lost) {
        return Err(Failure::new(
            ErrorCode::BrokerUnavailable,
            format!("not stored: this node cannot reach its broker ({why}); retry, on another node if you can"),
        ));
    }
    let started = std::time::Instant::now();
    let record = Publication::keyed_record(data, from, conflation);
    let window = node.settings.config.idempotency_window;
    // A remote broker's answer is waited for at most `publish_timeout` (see
    // `crate::bounded`); the node's own store answers for itself (a full disk is an error,
    // not a silence).
    let published = match key {
        Some(key) => {
            node.broker
                .publish_once(channel, record, ns.stream_policy(), &key, window)
                .await
        }
        None => node
            .broker
            .publish(channel, record, ns.stream_policy())
            .await
            .map(|p| (p, false)),
    };
    let (position, repeat) = match published {
        Ok(published) => published,
        Err(e @ herald_broker::BrokerError::Unrecoverable { .. }) => return Err(e.into()),
        // Sent, and not confirmed (an error, or no answer in time): it may be stored.
        Err(e @ herald_broker::BrokerError::Unavailable(_)) if remote => {
            return Err(Failure::new(
                ErrorCode::OutcomeUnknown,
                format!("outcome unknown: the broker did not confirm the publication ({e}); it may be stored, and a retry may store it twice"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    // The embedded durable engine keeps only durable namespaces on disk.
    let storage = match node.storage {
        "durable" if !ns.durable => "memory",
        storage => storage,
    };
    node.metrics.published(
        node.settings.namespace_label(channel.namespace()),
        storage,
        started.elapsed(),
    );
    Ok(Published { position, repeat })
}

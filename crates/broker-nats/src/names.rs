//! How Herald names what it keeps in NATS. Every name starts with the node's prefix, so
//! several Herald clusters (or other programs) can share one NATS.
//!
//! A channel name may hold characters NATS subjects cannot (`.`, `*`, `>`, spaces), so in
//! subjects a channel is its name in lowercase hex: one token, any name.
//!
//! - Streams of publications, one per retention (history size and age: in practice one
//!   per namespace): `PREFIX_h{size}_t{ttl_ms}`, subjects `PREFIX.c.{size}.{ttl_ms}.{CH}`.
//!   Each republishes what it stored to `PREFIX.live.{CH}`, where nodes listen.
//! - `PREFIX_empty`: the epoch of channels read before anyone published (`PREFIX.e.{CH}`).
//! - `PREFIX_once`: idempotency keys (`PREFIX.k.{CH}.{KEY}`).
//! - Requests between nodes on `PREFIX.node.{NODE}`; presence batches on `PREFIX.presence`.
//! - Key-value buckets `PREFIX_nodes` (node figures) and `PREFIX_presence`.

use herald_broker::StreamPolicy;
use herald_protocol::ChannelName;

/// Names under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
}

/// Whether `prefix` can start NATS subjects and stream names: letters, digits, `-`, `_`.
pub fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The stream that keeps channels with `policy`'s retention.
    pub(crate) fn stream(&self, policy: &StreamPolicy) -> String {
        format!(
            "{}_h{}_t{}",
            self.prefix,
            policy.history_size,
            policy.history_ttl.as_millis()
        )
    }

    /// What that stream takes in.
    pub(crate) fn stream_subjects(&self, policy: &StreamPolicy) -> String {
        format!(
            "{}.c.{}.{}.>",
            self.prefix,
            policy.history_size,
            policy.history_ttl.as_millis()
        )
    }

    /// Where `channel`'s publications are stored.
    pub(crate) fn subject(&self, channel: &ChannelName, policy: &StreamPolicy) -> String {
        format!(
            "{}.c.{}.{}.{}",
            self.prefix,
            policy.history_size,
            policy.history_ttl.as_millis(),
            hex::encode(channel.as_str().as_bytes())
        )
    }

    /// Where stored publications are republished (any stream: `>` keeps the channel).
    pub(crate) fn live_all(&self) -> String {
        format!("{}.live.>", self.prefix)
    }

    /// Where nodes hear `channel`'s stored publications.
    pub(crate) fn live(&self, channel: &ChannelName) -> String {
        format!(
            "{}.live.{}",
            self.prefix,
            hex::encode(channel.as_str().as_bytes())
        )
    }

    pub(crate) fn empty_stream(&self) -> String {
        format!("{}_empty", self.prefix)
    }

    pub(crate) fn empty_subjects(&self) -> String {
        format!("{}.e.>", self.prefix)
    }

    /// Where the epoch of `channel` is kept while nothing is published to it.
    pub(crate) fn empty(&self, channel: &ChannelName) -> String {
        format!(
            "{}.e.{}",
            self.prefix,
            hex::encode(channel.as_str().as_bytes())
        )
    }

    pub(crate) fn once_stream(&self) -> String {
        format!("{}_once", self.prefix)
    }

    pub(crate) fn once_subjects(&self) -> String {
        format!("{}.k.>", self.prefix)
    }

    /// Where idempotency key `key` of `channel` is kept.
    pub(crate) fn once(&self, channel: &ChannelName, key: &str) -> String {
        format!(
            "{}.k.{}.{}",
            self.prefix,
            hex::encode(channel.as_str().as_bytes()),
            hex::encode(key.as_bytes())
        )
    }

    /// Where requests to node `node` go.
    pub(crate) fn node(&self, node: &str) -> String {
        format!("{}.node.{}", self.prefix, node)
    }

    /// Where presence batches travel between nodes.
    pub(crate) fn presence_batches(&self) -> String {
        format!("{}.presence", self.prefix)
    }

    pub(crate) fn nodes_bucket(&self) -> String {
        format!("{}_nodes", self.prefix)
    }

    pub(crate) fn presence_bucket(&self) -> String {
        format!("{}_presence", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_survive_the_round_trip_through_a_subject() {
        let names = Names::new("herald");
        for name in ["lobby", "chat:room.1", "a/b=c+d,e~f!g@h"] {
            let channel = ChannelName::new(name).unwrap();
            let live = names.live(&channel);
            let token = live.strip_prefix("herald.live.").unwrap();
            assert!(!token.contains('.'), "{live}: one token");
            assert_eq!(hex::decode(token).unwrap(), name.as_bytes());
        }
        assert!(hex::decode("zz").is_err());
        assert!(hex::decode("616").is_err());
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(valid_prefix("herald-prod_2"));
        for bad in ["", "a.b", "a*", "a>", "a b"] {
            assert!(!valid_prefix(bad), "{bad:?}");
        }
    }
}

//! Who may do what with a channel: the one check every client read and write goes through.
//!
//! Every path that hands a client publications asks [`check`] first, whatever the transport:
//! subscribing (WebSocket `subscribe`, SSE, streaming, forever frame and polling opens),
//! replaying from a position (`since`, `Last-Event-ID`, every HTTP cursor) and the `history`
//! command. The rules compose so that no path reaches further than another:
//!
//! - [`Action::Subscribe`] receives what is published from now on.
//! - [`Action::History`] reads what was published before, whether through the `history`
//!   command or a replay from a position. It includes subscribing: a namespace closed to
//!   subscribers is not readable by polling its history either.
//! - [`Action::Publish`] sends into the channel.
//!
//! Today the rules are the namespace's `client_*` flags. Tokens and backend hooks are further
//! rules of the same shape, consulted here too, so a transport never needs to know them.

use herald_protocol::{ChannelName, ErrorCode};

use crate::{config::NamespaceConfig, error::Failure, node::Node};

/// What a client asks to do with a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Receive publications made from now on.
    Subscribe,
    /// Read publications made before now (the `history` command, or a replay from a
    /// position).
    History,
    /// Publish into the channel.
    Publish,
}

impl Action {
    fn allowed_by(self, rules: &NamespaceConfig) -> bool {
        match self {
            Action::Subscribe => rules.client_subscribe,
            Action::History => rules.client_subscribe && rules.client_history,
            Action::Publish => rules.client_publish,
        }
    }

    /// The namespace setting that allows this action, named in refusals.
    fn setting(self, rules: &NamespaceConfig) -> &'static str {
        match self {
            Action::History if !rules.client_subscribe => "client_subscribe",
            Action::Subscribe => "client_subscribe",
            Action::History => "client_history",
            Action::Publish => "client_publish",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Action::Subscribe => "subscribe to",
            Action::History => "read the history of",
            Action::Publish => "publish to",
        }
    }
}

/// Whether a client of `node` may do `action` with `channel`; the refusal (103) says which
/// setting forbids it.
pub fn check(node: &Node, action: Action, channel: &ChannelName) -> Result<(), Failure> {
    let rules = node.settings.namespace(channel.namespace());
    if action.allowed_by(rules) {
        return Ok(());
    }
    Err(Failure::new(
        ErrorCode::PermissionDenied,
        format!(
            "clients may not {} {channel}: its namespace does not allow {}",
            action.verb(),
            action.setting(rules)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(subscribe: bool, history: bool) -> NamespaceConfig {
        NamespaceConfig {
            client_subscribe: subscribe,
            client_history: history,
            ..NamespaceConfig::default()
        }
    }

    #[test]
    fn reading_history_needs_both_flags_and_subscribing_only_its_own() {
        assert!(Action::History.allowed_by(&rules(true, true)));
        assert!(!Action::History.allowed_by(&rules(true, false)));
        assert!(
            !Action::History.allowed_by(&rules(false, true)),
            "a namespace closed to subscribers is not readable through history"
        );
        assert!(Action::Subscribe.allowed_by(&rules(true, false)));
        assert!(!Action::Subscribe.allowed_by(&rules(false, true)));
        assert_eq!(
            Action::History.setting(&rules(false, true)),
            "client_subscribe"
        );
        assert_eq!(
            Action::History.setting(&rules(true, false)),
            "client_history"
        );
    }
}

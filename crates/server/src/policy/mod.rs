//! Who may do what with a channel: the one check every client read and write goes through.
//!
//! Every path that hands a client publications, or takes one from it, asks [`check`] first,
//! whatever the transport: subscribing (WebSocket `subscribe`, SSE, streaming, forever frame
//! and polling opens, a token's `channels`), replaying from a position (`since`,
//! `Last-Event-ID`, every HTTP cursor), the `history` command, and publishing. The rules
//! compose so that no path reaches further than another:
//!
//! - [`Action::Subscribe`] receives what is published from now on.
//! - [`Action::History`] reads what was published before, whether through the `history`
//!   command or a replay from a position. It includes subscribing: a namespace closed to
//!   subscribers is not readable by polling its history either.
//! - [`Action::Presence`] sees who is subscribed; it includes subscribing too.
//! - [`Action::Publish`] sends into the channel.
//!
//! Each namespace sets a level per action ([`Access`]: anyone, authenticated, granted,
//! nobody). What a connection brings is an [`Asker`]: its identity (from its token,
//! [`crate::token`], or the connect hook, [`crate::hooks`]) and whether this channel was granted
//! to it alone (a subscription token, or the subscribe hook). In a namespace whose
//! subscribe or publish hook is on, that action counts as granted here: the backend
//! decides, asked by the session after these rules pass. Transports never see the rules:
//! they hand the session what the client sent, and the session asks here.

pub mod api_key;
pub mod operator;
pub mod origin;

use herald_protocol::{ChannelName, ErrorCode};

use crate::token::Identity;
use crate::{
    config::{Access, NamespaceConfig},
    error::Failure,
    node::Node,
};

/// What a client asks to do with a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Receive publications made from now on.
    Subscribe,
    /// Read publications made before now (the `history` command, or a replay from a
    /// position).
    History,
    /// See who is subscribed.
    Presence,
    /// Publish into the channel.
    Publish,
}

/// Who asks, as far as the rules care.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asker<'a> {
    /// The connection's identity, from its token; none when anonymous.
    pub identity: Option<&'a Identity>,
    /// Whether this connection holds a grant for this very channel (a subscription
    /// token, or the subscribe hook's allowance), beyond its identity's.
    pub channel_granted: bool,
}

impl Action {
    /// The namespace settings this action needs, each of which must admit the asker:
    /// reading history or presence needs the subscribe rule too, so no path reads a
    /// channel that its subscribers' rule closes.
    fn levels(self, r: &NamespaceConfig) -> [Option<(&'static str, Access)>; 2] {
        let subscribe = Some(("subscribe", r.subscribe));
        match self {
            Action::Subscribe => [subscribe, None],
            Action::History => [subscribe, Some(("history", r.history))],
            Action::Presence => [
                subscribe,
                Some(("presence", r.presence.access().unwrap_or(Access::Nobody))),
            ],
            Action::Publish => [Some(("publish", r.publish)), None],
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Action::Subscribe => "subscribe to",
            Action::History => "read the history of",
            Action::Presence => "see the presence of",
            Action::Publish => "publish to",
        }
    }
}

/// Whether `asker` may do `action` with `channel` on `node`; the refusal (103) says which
/// rule refused.
pub fn check(
    node: &Node,
    asker: Asker<'_>,
    action: Action,
    channel: &ChannelName,
) -> Result<(), Failure> {
    let rules = node.settings.namespace(channel.namespace());
    let operator = asker.identity.is_some_and(|i| i.operator);
    if operator && channel.namespace() != operator::NAMESPACE {
        // A ticket comes with any API key, a read-only one included: it must not become a
        // way to act as an authenticated user of the application's channels.
        return Err(refuse(format!(
            "a dashboard ticket reads Herald's own channels (`{}:*`) only, not {channel}",
            operator::NAMESPACE
        )));
    }
    if channel.namespace() == operator::NAMESPACE && !operator {
        return Err(refuse(format!(
            "{channel} is one of Herald's own channels (the `{}` namespace): only the dashboard, with a ticket from /api/dashboard/ticket, may {} it",
            operator::NAMESPACE,
            action.verb()
        )));
    }
    let granted = granted(rules, asker, action, channel);
    // Own personal channels count as granted, so this refuses only other users' ones.
    if rules.personal && !granted {
        return Err(refuse(
            format!(
                "{channel} is a personal channel of another user: only its user (or a connection granted it) may {} it",
                action.verb()
            ),
        ));
    }
    for (name, level) in action.levels(rules).into_iter().flatten() {
        if name == "presence" && rules.presence.access().is_none() {
            // Only now, after the subscribe rule: a client that may not read the channel
            // learns nothing of whether it keeps presence.
            return Err(presence_off_for_clients(node, channel));
        }
        let admitted = match level {
            Access::Anyone => true,
            Access::Authenticated => asker.identity.is_some(),
            Access::Granted => granted,
            Access::Nobody => false,
        };
        if !admitted {
            let why = match level {
                Access::Nobody => format!("its namespace's `{name}` is nobody"),
                Access::Authenticated => format!("its namespace's `{name}` needs an authenticated connection (a token)"),
                _ => format!("its namespace's `{name}` needs a grant for it (a token's claims, a subscription token or a personal channel)"),
            };
            let message = format!("clients may not {} {channel}: {why}", action.verb());
            return Err(refuse(message));
        }
    }
    Ok(())
}

/// Whether `channel`'s namespace keeps presence at all (108 if not, with the operator's
/// advice): the HTTP API asks this alone; clients are told less, through [`check`].
pub fn presence_kept(node: &Node, channel: &ChannelName) -> Result<(), Failure> {
    let namespace = channel.namespace();
    if node
        .settings
        .namespace(namespace)
        .presence
        .access()
        .is_none()
    {
        return Err(Failure::new(
            ErrorCode::NotAvailable,
            format!("presence is off for {channel}: turn it on with `presence = true` in the rules of namespace {namespace:?}"),
        ));
    }
    Ok(())
}

/// What a client asking for presence where it is off is told (108), without the operator's
/// advice, which goes to the log once per namespace.
fn presence_off_for_clients(node: &Node, channel: &ChannelName) -> Failure {
    static TOLD: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    // Labels are bounded by the configuration (any other namespace is `_other`).
    let label = node.settings.namespace_label(channel.namespace());
    let mut told = TOLD.lock().unwrap_or_else(|e| e.into_inner());
    if !told.iter().any(|t| t == label) {
        told.push(label.to_string());
        tracing::info!(
            namespace = label,
            "a client asked for presence where it is off; turn it on with `presence = true` in the namespace's rules if clients should see it"
        );
    }
    Failure::new(
        ErrorCode::NotAvailable,
        format!("presence is not available for {channel}"),
    )
}

/// A refusal by the rules: 103, whoever asks. (101 and 109 are kept for tokens that fail
/// their check, so that a client can tell "get a new token" and "stop" from "not allowed".)
fn refuse(message: String) -> Failure {
    Failure::new(ErrorCode::PermissionDenied, message)
}

/// Whether the channel is granted to this asker for this action.
fn granted(
    rules: &NamespaceConfig,
    asker: Asker<'_>,
    action: Action,
    channel: &ChannelName,
) -> bool {
    // The namespace's hook decides, after these rules (its allowance is a grant).
    let hooked = match action {
        Action::Subscribe => rules.subscribe_hook,
        Action::Publish => rules.publish_hook,
        Action::History | Action::Presence => false,
    };
    if hooked {
        return true;
    }
    let own = rules.personal && is_own(asker, channel);
    let Some(identity) = asker.identity else {
        return asker.channel_granted && action != Action::Publish;
    };
    own || match action {
        Action::Publish => identity.publish.allow(channel),
        Action::Subscribe | Action::History | Action::Presence => {
            asker.channel_granted
                || identity.subscribe.allow(channel)
                || identity.channels.contains(channel)
        }
    }
}

/// Whether `channel` is `NAMESPACE:USER` of the asker's own user.
fn is_own(asker: Asker<'_>, channel: &ChannelName) -> bool {
    let Some(identity) = asker.identity else {
        return false;
    };
    let name = channel.as_str();
    let ns = channel.namespace();
    !ns.is_empty() && name.len() > ns.len() + 1 && name[ns.len() + 1..] == *identity.user
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn node(configure: impl FnOnce(&mut Config)) -> std::sync::Arc<Node> {
        let mut c = Config::default();
        c.auth.hmac_secret = Some("k".repeat(32));
        configure(&mut c);
        Node::with_memory_broker(c.validate().unwrap())
    }

    fn user(name: &str, subscribe: &[&str]) -> Identity {
        Identity::new(
            name.into(),
            None,
            &[],
            subscribe.iter().map(|s| s.to_string()).collect(),
            Vec::new(),
            None,
        )
        .unwrap()
    }

    fn ch(name: &str) -> ChannelName {
        ChannelName::new(name).unwrap()
    }

    #[tokio::test]
    async fn history_and_presence_need_the_subscribe_rule_too() {
        let node = node(|c| {
            c.channels.subscribe = Some(Access::Nobody);
            c.channels.history = Some(Access::Anyone);
            c.channels.presence = Some(crate::config::Presence::On(Access::Anyone));
        });
        let anyone = Asker::default();
        assert!(check(&node, anyone, Action::History, &ch("x")).is_err());
        assert!(check(&node, anyone, Action::Presence, &ch("x")).is_err());
    }

    #[tokio::test]
    async fn levels_admit_who_they_say() {
        let node = node(|c| {
            c.channels.subscribe = Some(Access::Granted);
        });
        let alice = user("alice", &["news:*"]);
        let anonymous = Asker::default();
        let signed_in = Asker {
            identity: Some(&alice),
            channel_granted: false,
        };
        let e = check(&node, anonymous, Action::Subscribe, &ch("x")).unwrap_err();
        assert!(e.message.contains("needs a grant"), "{e:?}");
        let e = check(&node, signed_in, Action::Subscribe, &ch("x")).unwrap_err();
        assert_eq!(e.code, ErrorCode::PermissionDenied);
        assert!(check(&node, signed_in, Action::Subscribe, &ch("news:today")).is_ok());
        let with_token = Asker {
            identity: Some(&alice),
            channel_granted: true,
        };
        assert!(check(&node, with_token, Action::History, &ch("x")).is_ok());
        assert!(
            check(&node, with_token, Action::Publish, &ch("x")).is_err(),
            "publish is nobody"
        );
        assert!(check(&node, anonymous, Action::Subscribe, &ch("chat:x")).is_ok());
    }

    #[tokio::test]
    async fn personal_channels_are_their_users_only() {
        let node = node(|c| {
            c.namespaces.insert(
                "user".into(),
                crate::config::NamespaceOverride {
                    personal: Some(true),
                    subscribe: Some(Access::Granted),
                    ..Default::default()
                },
            );
        });
        let u42 = user("42", &[]);
        let u43 = user("43", &[]);
        let asker = |i| Asker {
            identity: Some(i),
            channel_granted: false,
        };
        assert!(check(&node, asker(&u42), Action::Subscribe, &ch("user:42")).is_ok());
        assert!(check(&node, asker(&u43), Action::Subscribe, &ch("user:42")).is_err());
        assert!(check(&node, asker(&u43), Action::History, &ch("user:42")).is_err());
        assert!(check(&node, asker(&u42), Action::Subscribe, &ch("user:42:x")).is_err());
        assert!(check(&node, Asker::default(), Action::Subscribe, &ch("user:42")).is_err());
    }
}

//! Rules per namespace: retention, sizes, and who may do what.
//!
//! Each rule is declared once, in [`namespace_rules!`]: that makes the resolved
//! [`NamespaceConfig`], the [`NamespaceOverride`] a config file writes (every field
//! optional), the merge of the two, and the built-in defaults.

use std::time::Duration;

use herald_broker::StreamPolicy;
use serde::{Deserialize, Serialize};

use super::{bad, ConfigError};

/// Who may do something with a namespace's channels. Each level admits everyone the
/// levels before it admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// No client (the HTTP API still may publish and read).
    Nobody,
    /// A connection granted the channel: by its token's grants (`subscribe`, `publish`,
    /// `channels` claims), by a subscription token, by a personal channel of its user, or
    /// (later) by a backend hook.
    Granted,
    /// Any connection with a valid token.
    Authenticated,
    /// Any client, anonymous ones included.
    Anyone,
}

impl Access {
    /// The name used in config files and messages.
    pub fn name(self) -> &'static str {
        match self {
            Access::Nobody => "nobody",
            Access::Granted => "granted",
            Access::Authenticated => "authenticated",
            Access::Anyone => "anyone",
        }
    }
}

/// Whether a namespace keeps presence (who is subscribed), and who may see it. Written
/// `false` (off), `true` (on, for whoever may subscribe) or an [`Access`] level (on, for
/// those: `"nobody"` keeps it for the HTTP API only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Not kept.
    Off,
    /// Kept, and shown to clients this level admits (and the subscribe rule).
    On(Access),
}

impl Presence {
    /// Who may see it; `None` when it is off.
    pub fn access(self) -> Option<Access> {
        match self {
            Presence::Off => None,
            Presence::On(level) => Some(level),
        }
    }
}

impl Serialize for Presence {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Presence::Off => s.serialize_bool(false),
            Presence::On(level) => level.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Presence {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Switch(bool),
            Level(Access),
        }
        match Written::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "presence is true, false, or who may see it: anyone, authenticated, granted or nobody",
            )
        })? {
            Written::Switch(false) => Ok(Presence::Off),
            Written::Switch(true) => Ok(Presence::On(Access::Anyone)),
            Written::Level(level) => Ok(Presence::On(level)),
        }
    }
}

macro_rules! namespace_rules {
    (|$keyed:ident| $( $(#[$meta:meta])* $field:ident : $ty:ty = $default:expr; )* ) => {
        /// Rules for the channels of a namespace, resolved: `[channels]` over the built-in
        /// defaults, then `[namespaces.NAME]` over that.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct NamespaceConfig {
            $( $(#[$meta])* pub $field: $ty, )*
        }

        /// A namespace's rules as a config file gives them: every field left out falls back
        /// (`[namespaces.NAME]` to `[channels]`, `[channels]` to the built-in default).
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct NamespaceOverride {
            $( $(#[$meta])* #[serde(skip_serializing_if = "Option::is_none")] pub $field: Option<$ty>, )*
            /// Replaced by `publish`; named in the error that says so.
            #[serde(skip_serializing)]
            pub client_publish: Option<bool>,
            /// Replaced by `subscribe`; named in the error that says so.
            #[serde(skip_serializing)]
            pub client_subscribe: Option<bool>,
            /// Replaced by `history`; named in the error that says so.
            #[serde(skip_serializing)]
            pub client_history: Option<bool>,
        }

        impl NamespaceConfig {
            /// The built-in rules. `$keyed`: whether any token key is configured, which closes
            /// reading to anonymous clients by default.
            pub fn built_in($keyed: bool) -> Self {
                Self { $( $field: $default, )* }
            }

            /// These rules with `o`'s fields over them.
            pub fn apply(&self, o: &NamespaceOverride) -> Self {
                Self { $( $field: o.$field.clone().unwrap_or_else(|| self.$field.clone()), )* }
            }
        }
    };
}

namespace_rules! { |keyed|
    /// Publications kept per channel. Default 1000: a durable server should still have
    /// this morning's messages this afternoon.
    history_size: usize = 1000;
    /// Age after which publications leave history. Default `7days`.
    #[serde(with = "humantime_serde")]
    history_ttl: Duration = Duration::from_secs(7 * 24 * 3600);
    /// How long an idle channel's epoch and offset are remembered. Default `30days`.
    #[serde(with = "humantime_serde")]
    history_meta_ttl: Duration = Duration::from_secs(30 * 24 * 3600);
    /// Who may subscribe. Default `anyone` without token keys, `authenticated` with one.
    subscribe: Access = if keyed { Access::Authenticated } else { Access::Anyone };
    /// Who may read history (the `history` command, and replays when resuming). Reading
    /// history also needs `subscribe`. Default as `subscribe`.
    history: Access = if keyed { Access::Authenticated } else { Access::Anyone };
    /// Whether the namespace keeps presence (who is subscribed: the `presence` and
    /// `presence_stats` commands and API calls), and who may see it: `true` (whoever may
    /// subscribe), an access level, or `false`. Default false.
    presence: Presence = Presence::Off;
    /// Whether subscribers that may see presence are pushed who joins and leaves, in batches
    /// (see `[presence]`). Needs `presence`. Default false.
    join_leave: bool = false;
    /// Who may publish (the HTTP API always may). Default `nobody`.
    publish: Access = Access::Nobody;
    /// Personal channels: every channel `NS:X` belongs to the user `X` (`user:42:x` to the
    /// user `42:x`), and is only for that user or a connection granted it explicitly; the
    /// levels above apply on top. Default false.
    personal: bool = false;
    /// Largest publication, in bytes of JSON. Default 65536.
    max_message_size: usize = 65536;
    /// Whether the backend's subscribe hook (`hooks.subscribe_url`) is asked before each
    /// subscription; what it allows counts as granted. Default false.
    subscribe_hook: bool = false;
    /// Whether the backend's publish hook (`hooks.publish_url`) is asked before each
    /// client publication (it may refuse or rewrite it); what it allows counts as granted.
    /// Default false.
    publish_hook: bool = false;
    /// Whether history is kept in the durable store (when `storage = "durable"`) or only in
    /// memory (lost on restart: clients then see a new epoch). Default true.
    durable: bool = true;
}

impl NamespaceConfig {
    /// The broker retention policy these rules imply.
    pub fn stream_policy(&self) -> StreamPolicy {
        StreamPolicy {
            history_size: self.history_size,
            history_ttl: self.history_ttl,
            meta_ttl: self.history_meta_ttl.max(self.history_ttl),
        }
    }

    /// Checks the resolved rules of `key` (`channels` or `namespaces.NAME`).
    pub(super) fn check(&self, key: &str, hooks: &super::HooksConfig) -> Result<(), ConfigError> {
        if self.subscribe_hook && hooks.subscribe_url.is_none() {
            return Err(bad(
                format!("{key}.subscribe_hook"),
                "needs hooks.subscribe_url (the address to ask)",
            ));
        }
        if self.publish_hook && hooks.publish_url.is_none() {
            return Err(bad(
                format!("{key}.publish_hook"),
                "needs hooks.publish_url (the address to ask)",
            ));
        }
        if self.history_size > 0 && self.history_ttl.is_zero() {
            return Err(bad(
                format!("{key}.history_ttl"),
                "must be greater than 0 when history_size is",
            ));
        }
        if self.join_leave && self.presence == Presence::Off {
            return Err(bad(
                format!("{key}.join_leave"),
                "needs presence (write `presence = true` too)",
            ));
        }
        if self.max_message_size == 0 {
            return Err(bad(format!("{key}.max_message_size"), "must be at least 1"));
        }
        Ok(())
    }
}

impl NamespaceOverride {
    /// Refuses the `client_*` switches of earlier versions, saying what replaces them.
    pub(super) fn check_replaced(&self, key: &str) -> Result<(), ConfigError> {
        let replaced = [
            ("client_publish", self.client_publish, "publish", "nobody"),
            (
                "client_subscribe",
                self.client_subscribe,
                "subscribe",
                "nobody",
            ),
            ("client_history", self.client_history, "history", "nobody"),
        ];
        for (old, value, new, off) in replaced {
            if let Some(on) = value {
                let level = if on { "anyone" } else { off };
                return Err(bad(
                    format!("{key}.{old}"),
                    format!(
                        "replaced by `{new}` (anyone, authenticated, granted or nobody): \
                         write `{new} = \"{level}\"`; see docs/configuration.md, \"Namespaces\""
                    ),
                ));
            }
        }
        Ok(())
    }
}

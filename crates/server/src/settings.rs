//! Settings: a checked configuration with what it takes to act on it (the token keys
//! loaded, the backend's hooks) and every namespace's rules resolved. What the node runs
//! with; the configuration itself ([`crate::config`]) is only data.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    config::Access,
    config::{ApiKey, ApiScope, Config, ConfigError, NamespaceConfig, EVENTS_NAMESPACE},
    hooks::Hooks,
    token::Verifier,
};

/// A checked configuration with namespace rules resolved and token keys loaded.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The configuration as given.
    pub config: Config,
    /// Checks client tokens against the configured keys.
    pub tokens: Arc<Verifier>,
    /// The application backend's hooks.
    pub hooks: Arc<Hooks>,
    /// How the node treats a remote broker that stops answering (set by whoever builds the
    /// engine: the binary, from `[redis]`).
    pub broker: BrokerLimits,
    default_namespace: NamespaceConfig,
    namespaces: BTreeMap<String, NamespaceConfig>,
}

/// How the node treats a remote broker that stops answering. The embedded brokers always
/// answer, so these matter only with one that can fall out of reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerLimits {
    /// How long a publication may wait for the broker to confirm it before it is answered
    /// "outcome unknown" (122; HTTP 504 with `Retry-After`).
    pub publish_timeout: std::time::Duration,
    /// How long the node keeps its clients once it found the broker out of reach, before it
    /// ends their connections with 3009 (reconnect elsewhere and resume). Zero: never.
    pub clients_move_after: std::time::Duration,
    /// How long anything else done for a client (a subscription, a history read) may wait
    /// for the broker before it is refused for now (121): a connection waiting on a broker
    /// out of reach would otherwise not hear that it must move.
    pub command_timeout: std::time::Duration,
}

impl Default for BrokerLimits {
    fn default() -> Self {
        Self {
            publish_timeout: std::time::Duration::from_secs(2),
            clients_move_after: std::time::Duration::from_secs(2),
            command_timeout: std::time::Duration::from_secs(3),
        }
    }
}

impl Config {
    /// Checks every value, loads the token keys (files, a JWKS address) and resolves the
    /// namespaces' rules.
    pub fn validate(self) -> Result<Settings, ConfigError> {
        self.check()?;
        let tokens = Arc::new(Verifier::new(&self.auth)?);
        let (default_namespace, namespaces) = self.namespace_rules()?;
        Ok(Settings {
            tokens,
            hooks: Arc::new(Hooks::new(&self.hooks)),
            broker: BrokerLimits::default(),
            default_namespace,
            namespaces,
            config: self,
        })
    }
}

impl Settings {
    /// The rules for a channel's namespace (or the `[channels]` defaults).
    pub fn namespace(&self, namespace: &str) -> &NamespaceConfig {
        self.namespaces
            .get(namespace)
            .unwrap_or(&self.default_namespace)
    }

    /// A channel's namespace as metrics label it: its name when the configuration lists it
    /// (bounded by the configuration), else `_other` (clients can make up any).
    pub fn namespace_label<'a>(&'a self, namespace: &str) -> &'a str {
        self.namespaces
            .get_key_value(namespace)
            .map_or("_other", |(name, _)| name.as_str())
    }

    /// Each channel's retention by its namespace's rules, for the broker.
    pub fn policies(&self) -> herald_broker::Policies {
        let rules = self.clone();
        let events = self.config.hooks.events_policy();
        std::sync::Arc::new(move |c| match c.namespace() {
            EVENTS_NAMESPACE => events,
            ns => rules.namespace(ns).stream_policy(),
        })
    }

    /// Every accepted API key, with its scope.
    pub fn api_keys(&self) -> impl Iterator<Item = (&str, ApiScope)> {
        let single = self.config.api_key.as_deref().map(|k| (k, ApiScope::All));
        self.config.api_keys.iter().map(ApiKey::parts).chain(single)
    }

    /// Namespaces (by name; `[channels]` as the empty name) whose channels anonymous
    /// clients may read or publish to, with what they may do: said at start-up, so an
    /// operator sees what is open.
    pub fn open_to_anyone(&self) -> Vec<(&str, Vec<&'static str>)> {
        let open = |ns: &NamespaceConfig| {
            let mut can = Vec::new();
            if ns.subscribe == Access::Anyone {
                can.push("subscribe");
                if ns.history == Access::Anyone {
                    can.push("read history");
                }
            }
            if ns.publish == Access::Anyone {
                can.push("publish");
            }
            can
        };
        std::iter::once(("", &self.default_namespace))
            .chain(self.namespaces.iter().map(|(n, ns)| (n.as_str(), ns)))
            .map(|(name, ns)| (name, open(ns)))
            .filter(|(_, can)| !can.is_empty())
            .collect()
    }
}

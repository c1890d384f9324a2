//! `[hooks]`: where the application's backend is asked, and how patiently.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, ConfigError};

/// Addresses of the application's backend that Herald asks (see `docs/hooks.md`). Each one
/// left out is not asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HooksConfig {
    /// Asked when a client connects without a token (or with one, when no token key is
    /// configured): who the client is, or a refusal. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_url: Option<String>,
    /// Asked before a subscription, in namespaces with `subscribe_hook = true`. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribe_url: Option<String>,
    /// Asked before a client's publication, in namespaces with `publish_hook = true`; may
    /// rewrite it. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish_url: Option<String>,
    /// Asked when a connection whose connect hook gave an expiry reaches it: a new expiry,
    /// or the end of the connection. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_url: Option<String>,
    /// Asked for a client's `rpc` command. Default none (`rpc` answers 108).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpc_url: Option<String>,
    /// Where `connect`, `disconnect`, `subscribe` and `unsubscribe` events are posted, at
    /// least once and in order per client (see `docs/hooks.md`). Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_url: Option<String>,
    /// Most events per post (and per stored batch). Default 100.
    pub events_batch: usize,
    /// Most events recorded but not stored yet; more are dropped and counted (`dropped`
    /// in the next post). Default 100000.
    pub events_max_pending: usize,
    /// Stored batches kept for delivery; older ones are trimmed and counted
    /// (`lost_batches`). Default 10000.
    pub events_kept: usize,
    /// How long a stored batch waits for delivery before it is trimmed. Default `24h`.
    #[serde(with = "humantime_serde")]
    pub events_ttl: Duration,
    /// Longest wait for one answer, the wait for a free slot included; a client then gets
    /// error 118. Default `1s`.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Most requests in flight per hook; more wait for a slot within `timeout`. Default 64.
    pub max_in_flight: usize,
    /// Largest answer read, in bytes; a longer one counts as the backend failing.
    /// Default 4 MiB.
    pub max_response_size: usize,
    /// Failures in a row after which a hook is not asked for `circuit_open` (clients get
    /// 118 at once), then tried again. Default 5.
    pub circuit_failures: u32,
    /// How long a failing hook is left alone. Default `2s`.
    #[serde(with = "humantime_serde")]
    pub circuit_open: Duration,
    /// Request headers passed to the connect hook (names, any case), e.g. `["user-agent"]`.
    /// Default none.
    pub headers: Vec<String>,
    /// Cookies passed to the connect hook (names), e.g. `["sessionid"]`. Default none.
    pub cookies: Vec<String>,
}

impl Default for HooksConfig {
    fn default() -> Self {
        Self {
            connect_url: None,
            subscribe_url: None,
            publish_url: None,
            refresh_url: None,
            rpc_url: None,
            events_url: None,
            events_batch: 100,
            events_max_pending: 100_000,
            events_kept: 10_000,
            events_ttl: Duration::from_secs(24 * 3600),
            timeout: Duration::from_secs(1),
            max_in_flight: 64,
            max_response_size: 4 << 20,
            circuit_failures: 5,
            circuit_open: Duration::from_secs(2),
            headers: Vec::new(),
            cookies: Vec::new(),
        }
    }
}

impl HooksConfig {
    /// How the stored events are kept.
    pub fn events_policy(&self) -> herald_broker::StreamPolicy {
        herald_broker::StreamPolicy {
            history_size: self.events_kept,
            history_ttl: self.events_ttl,
            meta_ttl: self.events_ttl.max(Duration::from_secs(7 * 24 * 3600)),
        }
    }

    /// Every configured hook address, by its key.
    pub fn urls(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("hooks.connect_url", &self.connect_url),
            ("hooks.subscribe_url", &self.subscribe_url),
            ("hooks.publish_url", &self.publish_url),
            ("hooks.refresh_url", &self.refresh_url),
            ("hooks.rpc_url", &self.rpc_url),
            ("hooks.events_url", &self.events_url),
        ]
        .into_iter()
        .filter_map(|(key, url)| url.as_deref().map(|u| (key, u)))
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        for (key, url) in self.urls() {
            match reqwest::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                Ok(_) => return Err(bad(key, "must be an http:// or https:// address")),
                Err(e) => {
                    return Err(bad(
                        key,
                        format!("{url:?} is not an address ({e}); write it whole, e.g. http://127.0.0.1:3000/herald/connect"),
                    ))
                }
            }
        }
        if self.events_batch == 0 || self.events_kept == 0 || self.events_ttl.is_zero() {
            return Err(bad(
                "hooks.events_batch",
                "hooks.events_batch, events_kept and events_ttl must be greater than 0",
            ));
        }
        if self.timeout.is_zero() {
            return Err(bad("hooks.timeout", "must be greater than 0"));
        }
        if self.max_in_flight == 0 {
            return Err(bad("hooks.max_in_flight", "must be at least 1"));
        }
        if self.max_response_size < 1024 {
            return Err(bad("hooks.max_response_size", "must be at least 1024"));
        }
        if self.circuit_failures == 0 {
            return Err(bad("hooks.circuit_failures", "must be at least 1"));
        }
        for name in &self.headers {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(bad(
                    "hooks.headers",
                    format!("{name:?} is not a header name"),
                ));
            }
        }
        Ok(())
    }
}

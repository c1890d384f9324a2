//! Refusals by the limit that made them: counted for `/metrics` (and so the dashboard), and
//! logged at most once per 10 s per limit, naming the limit and an address it refused. An
//! operator whose clients are refused sees which limit did it, and for whom; a client that
//! is refused a million times cannot fill the log.

use std::{
    net::IpAddr,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use crate::{config::LimitsConfig, throttle::Throttle};

/// A limit that refuses clients: the node's own, and those per client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `max_connections`: the node holds as many sockets or connections as it may.
    MaxConnections,
    /// `limits.connections_per_address`.
    ConnectionsPerAddress,
    /// `limits.connection_rate_per_address`.
    ConnectionRatePerAddress,
    /// `limits.commands_per_address`.
    CommandsPerAddress,
    /// `limits.new_channels_per_address`.
    NewChannelsPerAddress,
    /// `limits.hook_calls_per_address`.
    HookCallsPerAddress,
    /// `limits.held_bytes_per_address`.
    HeldBytesPerAddress,
}

impl Limit {
    /// Every limit, in the order `/metrics` lists them.
    pub const ALL: [Limit; 7] = [
        Limit::MaxConnections,
        Limit::ConnectionsPerAddress,
        Limit::ConnectionRatePerAddress,
        Limit::CommandsPerAddress,
        Limit::NewChannelsPerAddress,
        Limit::HookCallsPerAddress,
        Limit::HeldBytesPerAddress,
    ];

    /// The setting's name in the configuration file: `/metrics` labels and log lines use it.
    pub fn setting(self) -> &'static str {
        match self {
            Limit::MaxConnections => "max_connections",
            Limit::ConnectionsPerAddress => "limits.connections_per_address",
            Limit::ConnectionRatePerAddress => "limits.connection_rate_per_address",
            Limit::CommandsPerAddress => "limits.commands_per_address",
            Limit::NewChannelsPerAddress => "limits.new_channels_per_address",
            Limit::HookCallsPerAddress => "limits.hook_calls_per_address",
            Limit::HeldBytesPerAddress => "limits.held_bytes_per_address",
        }
    }

    fn index(self) -> usize {
        Limit::ALL.iter().position(|l| *l == self).unwrap_or(0)
    }
}

/// Seconds between two log lines about one limit.
const LOG_EVERY_SECONDS: u64 = 10;

/// Refusals counted by limit, with their log lines.
#[derive(Debug)]
pub struct Refusals {
    counts: [AtomicU64; Limit::ALL.len()],
    lines: [Throttle; Limit::ALL.len()],
    /// Whether the configuration lists no proxy: then a refused loopback or private address
    /// may well be a proxy that every client shares.
    no_proxies: bool,
}

impl Refusals {
    pub(super) fn new(config: &LimitsConfig) -> Self {
        Self {
            counts: Default::default(),
            lines: std::array::from_fn(|_| Throttle::new(LOG_EVERY_SECONDS)),
            no_proxies: config.trusted_proxies.is_empty(),
        }
    }

    /// Counts one refusal by `limit` (whose value is `value`) of client address `ip`, and
    /// logs it when a line is due.
    pub fn count(&self, limit: Limit, ip: Option<IpAddr>, value: impl std::fmt::Display) {
        let i = limit.index();
        self.counts[i].fetch_add(1, Relaxed);
        let Some(refused) = self.lines[i].due() else {
            return;
        };
        let setting = limit.setting();
        let address = ip.map_or_else(|| "-".to_string(), |ip| ip.to_string());
        let shared = ip.is_some_and(|ip| match ip {
            IpAddr::V4(v4) => v4.is_loopback() || v4.is_private(),
            IpAddr::V6(v6) => v6.is_loopback() || (v6.segments()[0] & 0xfe00) == 0xfc00,
        });
        if self.no_proxies && shared && limit != Limit::MaxConnections {
            tracing::warn!(
                limit = setting,
                address,
                refused,
                "refused clients over {setting} ({value}) at {address}: {refused} since the last such line. If clients reach Herald through a proxy at this address, list it in limits.trusted_proxies (and have it send X-Forwarded-For), or they all share one address's limits"
            );
        } else {
            tracing::warn!(
                limit = setting,
                address,
                refused,
                "refused clients over {setting} ({value}) at {address}: {refused} since the last such line"
            );
        }
    }

    /// Refusals so far, by setting name.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        Limit::ALL
            .iter()
            .map(|l| (l.setting(), self.counts[l.index()].load(Relaxed)))
            .collect()
    }
}

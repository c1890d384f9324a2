//! Limits per client address: how many sockets and connections one address may hold, how
//! fast it may open them, and how many stateless commands it may send. The address is the
//! TCP peer's, or, when the peer is a configured trusted proxy, the last address in
//! `X-Forwarded-For` that is not itself a trusted proxy.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use axum::http::HeaderMap;
use herald_protocol::ErrorCode;
use parking_lot::Mutex;

pub use crate::config::Network;
use crate::{config::LimitsConfig, error::Failure};

mod held;
mod refusals;
pub use held::HeldBytes;
pub use refusals::{Limit, Refusals};

/// The TCP peer of a request, put into its extensions by the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// How fast a [`Bucket`] refills: `count` per `window` on average, bursts of twice that
/// (or, `strict`, of no more than `count`). A count of 0 means no limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    count: u32,
    window: Duration,
    strict: bool,
}

impl Rate {
    pub(crate) const fn per_second(count: u32) -> Self {
        Self {
            count,
            window: Duration::from_secs(1),
            strict: false,
        }
    }

    pub(crate) const fn per_minute(count: u32) -> Self {
        Self {
            count,
            window: Duration::from_secs(60),
            strict: false,
        }
    }

    /// `count` a second, and bursts of no more (Pusher's client events: 10 a second).
    pub(crate) const fn strictly_per_second(count: u32) -> Self {
        Self {
            strict: true,
            ..Self::per_second(count)
        }
    }

    fn per_sec(self) -> f64 {
        f64::from(self.count) / self.window.as_secs_f64()
    }

    fn burst(self) -> f64 {
        f64::from(self.count) * if self.strict { 1.0 } else { 2.0 }
    }
}

impl From<u32> for Rate {
    fn from(per_second: u32) -> Self {
        Self::per_second(per_second)
    }
}

/// A token bucket. Serves the per-address limits here and each session's
/// `client.max_commands_per_second`.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    pub(crate) fn full(rate: impl Into<Rate>) -> Self {
        Self {
            tokens: rate.into().burst(),
            refilled: Instant::now(),
        }
    }

    fn refill(&mut self, rate: Rate) {
        let now = Instant::now();
        let earned = now.duration_since(self.refilled).as_secs_f64() * rate.per_sec();
        self.tokens = (self.tokens + earned).min(rate.burst());
        self.refilled = now;
    }

    /// Takes a token if there is one.
    pub(crate) fn take(&mut self, rate: impl Into<Rate>) -> bool {
        let rate = rate.into();
        if rate.count == 0 {
            return true;
        }
        self.refill(rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes `n` tokens, even past what it holds: a debt its refill pays before it has a
    /// token again. For costs known only once incurred (the bytes a compressed message
    /// inflated to).
    pub(crate) fn charge(&mut self, rate: impl Into<Rate>, n: f64) {
        let rate = rate.into();
        if rate.count > 0 {
            self.refill(rate);
            self.tokens -= n;
        }
    }

    /// How long until its debt is paid; none while it has none.
    pub(crate) fn debt(&mut self, rate: impl Into<Rate>) -> Option<Duration> {
        let rate = rate.into();
        if rate.count == 0 {
            return None;
        }
        self.refill(rate);
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / rate.per_sec()))
    }

    /// Whether a token is there, without taking it.
    fn has_token(&mut self, rate: Rate) -> bool {
        if rate.count == 0 {
            return true;
        }
        self.refill(rate);
        self.tokens >= 1.0
    }

    fn is_full(&self, rate: impl Into<Rate>) -> bool {
        let rate = rate.into();
        let earned = self.refilled.elapsed().as_secs_f64() * rate.per_sec();
        self.tokens + earned >= rate.burst()
    }
}

#[derive(Debug)]
struct Entry {
    /// Open TCP sockets from this peer (only counted for peers that are not proxies).
    sockets: usize,
    /// Open client connections (sessions of every transport) of this client address.
    connections: usize,
    opened: Bucket,
    commands: Bucket,
    /// Channels this address made exist by publishing.
    created: Bucket,
    /// Calls to the application's backend its clients caused.
    hooked: Bucket,
    /// Bytes the server holds for its clients beyond their connections (see [`HeldBytes`]).
    held: usize,
}

/// The per-address counters of a node.
#[derive(Debug)]
pub struct AddressLimits {
    config: LimitsConfig,
    table: Mutex<HashMap<IpAddr, Entry>>,
    /// Refusals by limit (these and the node's `max_connections`).
    pub refusals: Refusals,
}

impl AddressLimits {
    /// Counters for `config`'s limits.
    pub fn new(config: LimitsConfig) -> Arc<Self> {
        Arc::new(Self {
            refusals: Refusals::new(&config),
            config,
            table: Mutex::default(),
        })
    }

    fn with_entry<T>(&self, ip: IpAddr, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut table = self.table.lock();
        let c = &self.config;
        let entry = table.entry(ip).or_insert_with(|| Entry {
            sockets: 0,
            connections: 0,
            opened: Bucket::full(c.connection_rate_per_address),
            commands: Bucket::full(c.commands_per_address),
            created: Bucket::full(Rate::per_minute(c.new_channels_per_address)),
            hooked: Bucket::full(c.hook_calls_per_address),
            held: 0,
        });
        f(entry)
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_proxy(&self, ip: IpAddr) -> bool {
        self.config.trusted_proxies.iter().any(|p| p.contains(ip))
    }

    /// The client's address: the peer's, or behind trusted proxies the nearest address in
    /// `X-Forwarded-For` that is not one of them.
    pub fn client_address(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.is_proxy(peer) {
            return peer;
        }
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|a| a.trim().parse::<IpAddr>().ok())
            .collect::<Vec<_>>();
        forwarded
            .into_iter()
            .rev()
            .find(|a| !self.is_proxy(*a))
            .unwrap_or(peer)
    }

    /// Counts a newly accepted TCP socket of `peer`; `None` when the peer already holds
    /// `connections_per_address` sockets. Proxies are not counted here: their clients are
    /// counted by address when they connect.
    pub fn socket(self: &Arc<Self>, peer: IpAddr) -> Option<SocketGuard> {
        if self.is_proxy(peer) {
            return Some(SocketGuard {
                limits: None,
                ip: peer,
            });
        }
        let limit = self.config.connections_per_address;
        let admitted = self.with_entry(peer, |e| {
            if limit > 0 && e.sockets >= limit {
                return false;
            }
            e.sockets += 1;
            true
        });
        if !admitted {
            self.refusals
                .count(Limit::ConnectionsPerAddress, Some(peer), limit);
        }
        admitted.then(|| SocketGuard {
            limits: Some(self.clone()),
            ip: peer,
        })
    }

    /// Admits a connection (or a poll) of client address `ip`: within the connection rate
    /// and the concurrent connections of that address. The guard counts it while it lives.
    pub fn connection(self: &Arc<Self>, ip: IpAddr) -> Result<AddressGuard, Failure> {
        let c = &self.config;
        let admitted = self.with_entry(ip, |e| {
            if c.connections_per_address > 0 && e.connections >= c.connections_per_address {
                self.refusals.count(
                    Limit::ConnectionsPerAddress,
                    Some(ip),
                    c.connections_per_address,
                );
                return Err(Failure::new(
                    ErrorCode::LimitExceeded,
                    format!(
                        "this address holds its maximum of {} connections; close one or retry later",
                        c.connections_per_address
                    ),
                ));
            }
            if !e.opened.take(c.connection_rate_per_address) {
                self.refusals.count(
                    Limit::ConnectionRatePerAddress,
                    Some(ip),
                    format_args!("{}/s", c.connection_rate_per_address),
                );
                return Err(Failure::new(
                    ErrorCode::TooManyRequests,
                    format!(
                        "more than {} new connections per second from this address; retry later",
                        c.connection_rate_per_address
                    ),
                ));
            }
            e.connections += 1;
            Ok(())
        });
        admitted?;
        Ok(AddressGuard {
            limits: self.clone(),
            ip,
        })
    }

    /// Takes one stateless command of `ip` from its allowance; false when over the rate.
    pub fn command(&self, ip: IpAddr) -> bool {
        let rate = self.config.commands_per_address;
        let taken = self.with_entry(ip, |e| e.commands.take(rate));
        if !taken {
            self.refusals.count(
                Limit::CommandsPerAddress,
                Some(ip),
                format_args!("{rate}/s"),
            );
        }
        taken
    }

    /// Takes one backend call of `ip` from its allowance (`limits.hook_calls_per_address`);
    /// the refusal when over it.
    pub fn hook_call(&self, ip: IpAddr) -> Result<(), Failure> {
        let rate = self.config.hook_calls_per_address;
        if self.with_entry(ip, |e| e.hooked.take(rate)) {
            return Ok(());
        }
        self.refusals.count(
            Limit::HookCallsPerAddress,
            Some(ip),
            format_args!("{rate}/s"),
        );
        Err(Failure::new(
            ErrorCode::TooManyRequests,
            format!(
                "more than {rate} calls to the application's backend per second from this address; retry later"
            ),
        ))
    }

    /// Whether `ip` may make another channel exist now (see
    /// `limits.new_channels_per_address`).
    pub fn may_create_channel(&self, ip: IpAddr) -> bool {
        let rate = Rate::per_minute(self.config.new_channels_per_address);
        self.with_entry(ip, |e| e.created.has_token(rate))
    }

    /// Charges a channel `ip` made exist to its allowance.
    pub fn created_channel(&self, ip: IpAddr) {
        let rate = Rate::per_minute(self.config.new_channels_per_address);
        self.with_entry(ip, |e| e.created.take(rate));
    }

    /// Forgets addresses that hold nothing and whose allowances are full again, so the
    /// table holds only addresses active recently. Called every few seconds.
    pub fn sweep(&self) {
        let c = &self.config;
        self.table.lock().retain(|_, e| {
            e.sockets > 0
                || e.connections > 0
                || e.held > 0
                || !e.opened.is_full(c.connection_rate_per_address)
                || !e.commands.is_full(c.commands_per_address)
                || !e
                    .created
                    .is_full(Rate::per_minute(c.new_channels_per_address))
                || !e.hooked.is_full(c.hook_calls_per_address)
        });
    }

    /// Addresses currently tracked.
    pub fn tracked(&self) -> usize {
        self.table.lock().len()
    }
}

/// Inside a Tokio runtime, sweeps `limits` every few seconds while it lives.
pub fn spawn_sweeper(limits: &Arc<AddressLimits>) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let limits = Arc::downgrade(limits);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            match limits.upgrade() {
                Some(limits) => limits.sweep(),
                None => return,
            }
        }
    });
}

/// One accepted TCP socket, counted against its peer while it lives.
#[derive(Debug)]
pub struct SocketGuard {
    limits: Option<Arc<AddressLimits>>,
    ip: IpAddr,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if let Some(limits) = &self.limits {
            limits.with_entry(self.ip, |e| e.sockets = e.sockets.saturating_sub(1));
        }
    }
}

/// One client connection, counted against its address while it lives.
#[derive(Debug)]
pub struct AddressGuard {
    limits: Arc<AddressLimits>,
    ip: IpAddr,
}

impl AddressGuard {
    /// The client's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

impl Drop for AddressGuard {
    fn drop(&mut self) {
        self.limits
            .with_entry(self.ip, |e| e.connections = e.connections.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(proxies: &[&str]) -> Arc<AddressLimits> {
        let mut c = LimitsConfig::default();
        c.trusted_proxies = proxies.iter().map(|p| p.parse().unwrap()).collect();
        c.connections_per_address = 2;
        c.connection_rate_per_address = 100;
        AddressLimits::new(c)
    }

    fn forwarded(value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", value.parse().unwrap());
        h
    }

    /// A cost charged past what the bucket holds is a debt, paid at the rate before the
    /// bucket has anything again.
    #[test]
    fn a_charge_past_the_tokens_is_a_debt_paid_at_the_rate() {
        let rate = Rate::per_second(1000);
        let mut bucket = Bucket::full(rate);
        bucket.charge(rate, 2000.0);
        assert_eq!(bucket.debt(rate), None, "the burst, exactly");
        bucket.charge(rate, 1000.0);
        let debt = bucket.debt(rate).expect("in debt");
        assert!(
            debt <= Duration::from_secs(1) && debt > Duration::from_millis(900),
            "{debt:?}"
        );
        assert!(!bucket.take(rate), "nothing while in debt");
        let mut free = Bucket::full(0);
        free.charge(0, 1e9);
        assert_eq!(free.debt(0), None, "no limit, no debt");
    }

    #[test]
    fn forwarded_for_counts_only_behind_a_trusted_proxy() {
        let l = limits(&["10.0.0.0/8"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let h = forwarded("6.6.6.6, 1.2.3.4, 10.1.1.1");
        // The nearest untrusted hop is the client; what it claims before it is not trusted.
        assert_eq!(l.client_address(ip("10.0.0.1"), &h), ip("1.2.3.4"));
        // A client that sends its own header is not believed.
        assert_eq!(l.client_address(ip("1.2.3.4"), &h), ip("1.2.3.4"));
        assert_eq!(
            l.client_address(ip("10.0.0.1"), &HeaderMap::new()),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn each_address_has_its_own_connection_allowance() {
        let l = limits(&[]);
        let (a, b) = ("1.1.1.1".parse().unwrap(), "2.2.2.2".parse().unwrap());
        let g1 = l.connection(a).unwrap();
        let _g2 = l.connection(a).unwrap();
        assert_eq!(l.connection(a).unwrap_err().code, ErrorCode::LimitExceeded);
        assert!(l.connection(b).is_ok(), "another address is unaffected");
        drop(g1);
        assert!(
            l.connection(a).is_ok(),
            "a closed connection frees its place"
        );
    }

    #[test]
    fn networks_parse_and_match() {
        let n: Network = "192.168.0.0/16".parse().unwrap();
        assert!(n.contains("192.168.4.5".parse().unwrap()));
        assert!(!n.contains("192.169.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:192.168.1.1".parse().unwrap()));
        let one: Network = "::1".parse().unwrap();
        assert!(one.contains("::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Network>().is_err());
        assert!("localhost".parse::<Network>().is_err());
    }
}

//! Where publications are kept: the `storage` key, the remote engines' sections (`[redis]`,
//! `[nats]`) and what any remote engine's node does when it stops answering (`[broker]`).
//! The server carries the embedded engines; the remote ones are the binary's to build (see
//! [`crate::engine`]), so their settings live here, beside it.

mod nats;
mod redis;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use nats::NatsConfig;
pub use redis::RedisConfig;

use herald_server::{
    config::{bad, ConfigError},
    BrokerLimits, Config, Settings,
};

/// What `herald serve` reads: the server's configuration, and the engine it runs on (read
/// in two parts, so that each refuses keys it does not know: see [`crate::settings`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServeConfig {
    /// `durable` (default): namespaces with `durable = true` keep history in `data_dir`,
    /// surviving restarts; `memory`: everything in memory, nothing written to disk;
    /// `redis` or `nats`: every channel's stream in Redis (`redis.url`) or NATS JetStream
    /// (`nats.url`), shared by every node that uses the same server and prefix.
    pub storage: StorageEngine,
    /// Where Redis is, for `storage = "redis"`.
    pub redis: RedisConfig,
    /// Where NATS is, for `storage = "nats"`.
    pub nats: NatsConfig,
    /// What a node on a remote engine does when the engine stops answering.
    pub broker: BrokerConfig,
    /// Everything else.
    #[serde(flatten)]
    pub server: Config,
}

/// The engine to build, checked.
#[derive(Debug, Clone)]
pub struct EngineChoice {
    /// Which one.
    pub storage: StorageEngine,
    /// Its settings, for Redis.
    pub redis: RedisConfig,
    /// Its settings, for NATS.
    pub nats: NatsConfig,
    /// How soon a node says it lost a remote engine.
    pub unreachable_after: Duration,
}

impl ServeConfig {
    /// Checks everything (the engine's settings here, the server's in
    /// [`Config::validate`]): the server's settings, with what the node does when its broker
    /// stops answering, and the engine to build.
    pub fn validate(self) -> Result<(Settings, EngineChoice), ConfigError> {
        self.check()?;
        let limits = self.broker.limits();
        let mut settings = self.server.validate()?;
        settings.broker = limits;
        let choice = EngineChoice {
            storage: self.storage,
            redis: self.redis,
            nats: self.nats,
            unreachable_after: self.broker.unreachable_after,
        };
        Ok((settings, choice))
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.storage == StorageEngine::Redis {
            self.redis.check()?;
        }
        if self.storage == StorageEngine::Nats {
            self.nats.check()?;
        }
        self.broker.check()
    }
}

/// Where history is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StorageEngine {
    /// In `data_dir`, for namespaces with `durable = true`.
    #[default]
    Durable,
    /// In memory only.
    Memory,
    /// In Redis, shared between nodes.
    Redis,
    /// In NATS JetStream, shared between nodes.
    Nats,
}

/// The `[broker]` section: what a node on a remote engine (Redis, NATS) does when the
/// engine stops answering. The embedded engines always answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// How soon a node that stops reaching its engine says so: `/readyz` answers 503 and
    /// `herald_broker_up` drops to 0. Default 3s.
    #[serde(with = "humantime_serde")]
    pub unreachable_after: Duration,
    /// How long a node that cannot reach its engine keeps its clients before it ends their
    /// connections with 3009 (reconnect elsewhere and resume), counted from when it found
    /// the engine out of reach. The engine back sooner: they stay and catch up. 0: never.
    /// Default 2s.
    #[serde(with = "humantime_serde")]
    pub clients_move_after: Duration,
    /// How long a publication may wait for the engine to confirm it before it is answered
    /// "outcome unknown" (122; HTTP 504 with `Retry-After`). Default 2s.
    #[serde(with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// How long anything else done for a client (a subscription, a history read) may wait
    /// for the engine before it is refused for now (121; HTTP 503), so that a connection
    /// waiting on an engine out of reach still hears the order to move. Default 3s.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            unreachable_after: Duration::from_secs(3),
            clients_move_after: Duration::from_secs(2),
            publish_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(3),
        }
    }
}

impl BrokerConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if self.command_timeout.is_zero() {
            return Err(bad("broker.command_timeout", "must be greater than 0"));
        }
        if self.publish_timeout.is_zero() {
            return Err(bad("broker.publish_timeout", "must be greater than 0"));
        }
        if self.unreachable_after < Duration::from_millis(300) {
            return Err(bad("broker.unreachable_after", "must be at least 300ms"));
        }
        Ok(())
    }

    fn limits(&self) -> BrokerLimits {
        BrokerLimits {
            publish_timeout: self.publish_timeout,
            clients_move_after: self.clients_move_after,
            command_timeout: self.command_timeout,
        }
    }
}

/// Keys that moved from `[redis]` to `[broker]` (they serve NATS too): the hint an old
/// configuration gets.
pub const MOVED_TO_BROKER: &[&str] = &[
    "unreachable_after",
    "clients_move_after",
    "publish_timeout",
    "command_timeout",
];

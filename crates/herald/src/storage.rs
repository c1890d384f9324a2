//! Where publications are kept: the `storage` key and the `[redis]` section of `herald
//! serve`'s configuration. The server carries the embedded engines; the remote ones are
//! the binary's to build (see [`crate::engine`]), so their settings live here, beside it.

use serde::{Deserialize, Serialize};

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
    /// `redis`: every channel's stream in Redis (`redis.url`), shared by every node that
    /// uses the same Redis and prefix.
    pub storage: StorageEngine,
    /// Where Redis is, for `storage = "redis"`.
    pub redis: RedisConfig,
    /// Everything else.
    #[serde(flatten)]
    pub server: Config,
}

impl ServeConfig {
    /// Checks everything (the engine's settings here, the server's in
    /// [`Config::validate`]): the server's settings, with what the node does when its broker
    /// stops answering, and the engine to build.
    pub fn validate(self) -> Result<(Settings, StorageEngine, RedisConfig), ConfigError> {
        self.check()?;
        let limits = self.broker_limits();
        let mut settings = self.server.validate()?;
        settings.broker = limits;
        Ok((settings, self.storage, self.redis))
    }

    fn check(&self) -> Result<(), ConfigError> {
        let redis = &self.redis;
        if self.storage == StorageEngine::Redis && redis.prefix.is_empty() {
            return Err(bad("redis.prefix", "must not be empty"));
        }
        if !redis.sentinels.is_empty() && redis.master_name.is_empty() {
            return Err(bad(
                "redis.master_name",
                "is required with redis.sentinels: the name the Sentinels monitor the primary under",
            ));
        }
        if !redis.cluster.is_empty() && !redis.sentinels.is_empty() {
            return Err(bad(
                "redis.cluster",
                "and redis.sentinels do not go together: a cluster elects its own primaries",
            ));
        }
        if !redis.cluster.is_empty() && redis.prefix.contains(['{', '}']) {
            return Err(bad(
                "redis.prefix",
                "must not hold { or } on a cluster: keys are grouped in slots by the channel between braces",
            ));
        }
        if redis.replicas_ack > 0 && redis.replicas_timeout.is_zero() {
            return Err(bad("redis.replicas_timeout", "must be greater than 0"));
        }
        if redis.command_timeout.is_zero() {
            return Err(bad("redis.command_timeout", "must be greater than 0"));
        }
        if redis.publish_timeout.is_zero() {
            return Err(bad("redis.publish_timeout", "must be greater than 0"));
        }
        if redis.unreachable_after < std::time::Duration::from_millis(300) {
            return Err(bad("redis.unreachable_after", "must be at least 300ms"));
        }
        Ok(())
    }

    /// What the node does when its broker stops answering (the Redis engine's settings;
    /// the embedded engines always answer).
    fn broker_limits(&self) -> BrokerLimits {
        BrokerLimits {
            publish_timeout: self.redis.publish_timeout,
            clients_move_after: self.redis.clients_move_after,
            command_timeout: self.redis.command_timeout,
        }
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
}

/// How a node reaches Redis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`, or `rediss://…` over TLS (verified
    /// against the system's roots unless `ca_file` says otherwise). Default
    /// `redis://127.0.0.1:6379`.
    pub url: String,
    /// Put before every key and pub/sub channel Herald uses, so several Herald clusters
    /// can share one Redis. Default `herald`.
    pub prefix: String,
    /// With `rediss://`: a PEM file of the CA(s) to trust instead of the system's roots
    /// (a managed Redis's private CA). Default none.
    pub ca_file: Option<std::path::PathBuf>,
    /// With `rediss://`, for mutual TLS: a PEM file of this node's client certificate,
    /// with `key_file`. Default none.
    pub cert_file: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM). Default none.
    pub key_file: Option<std::path::PathBuf>,
    /// With `rediss://`: accept any server certificate, for any name. Anyone between the
    /// node and Redis can then read and change everything; for a test server only, and
    /// warned about at start. Default false.
    pub tls_insecure: bool,
    /// `host:port` of Redis Sentinels to ask where the primary is (and to follow its
    /// failovers). With them, `url` gives only the credentials, database and scheme:
    /// its host and port are replaced by the primary's. Default none.
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the primary under. Required with `sentinels`.
    pub master_name: String,
    /// The Sentinels' own password, if they have one. Default none.
    pub sentinel_password: Option<String>,
    /// `host:port` of Redis Cluster nodes (any few: they lead to the rest). With them,
    /// `url` gives only the credentials and scheme. Each channel's stream, publications
    /// (sharded pub/sub) and presence live in its slot. Default none: not a cluster.
    pub cluster: Vec<String>,
    /// Replicas that must have a publication before it is acknowledged (Redis `WAIT`):
    /// with 1 or more, a failover after the acknowledgement loses nothing. 0 (the
    /// default): the primary's word is enough, and a failover can lose what it had not
    /// passed on yet.
    pub replicas_ack: u32,
    /// How long a publish waits for `replicas_ack` replicas before it is refused (it is
    /// then stored on the primary but not acknowledged). Default 1s.
    #[serde(with = "humantime_serde")]
    pub replicas_timeout: std::time::Duration,
    /// How soon a node that stops reaching Redis (its command or its pub/sub connection)
    /// says so: `/readyz` answers 503 and `herald_broker_up` drops to 0. Default 3s.
    #[serde(with = "humantime_serde")]
    pub unreachable_after: std::time::Duration,
    /// How long a node that cannot reach Redis keeps its clients before it ends their
    /// connections with 3009 (reconnect elsewhere and resume), counted from when it found
    /// Redis out of reach. Redis back sooner: they stay and catch up. 0: never. Default 2s.
    #[serde(with = "humantime_serde")]
    pub clients_move_after: std::time::Duration,
    /// How long a publication may wait for Redis to confirm it before it is answered
    /// "outcome unknown" (122; HTTP 504 with `Retry-After`). Default 2s.
    #[serde(with = "humantime_serde")]
    pub publish_timeout: std::time::Duration,
    /// How long anything else done for a client (a subscription, a history read) may wait
    /// for Redis before it is refused for now (121; HTTP 503), so that a connection waiting
    /// on a Redis out of reach still hears the order to move. Default 3s.
    #[serde(with = "humantime_serde")]
    pub command_timeout: std::time::Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            prefix: "herald".into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls_insecure: false,
            sentinels: Vec::new(),
            master_name: String::new(),
            cluster: Vec::new(),
            sentinel_password: None,
            replicas_ack: 0,
            replicas_timeout: std::time::Duration::from_secs(1),
            unreachable_after: std::time::Duration::from_secs(3),
            clients_move_after: std::time::Duration::from_secs(2),
            publish_timeout: std::time::Duration::from_secs(2),
            command_timeout: std::time::Duration::from_secs(3),
        }
    }
}

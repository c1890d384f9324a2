//! The `[redis]` section: how a node reaches Redis.

use herald_server::config::{bad, ConfigError};
use serde::{Deserialize, Serialize};

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
}

impl RedisConfig {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.prefix.is_empty() {
            return Err(bad("redis.prefix", "must not be empty"));
        }
        if !self.sentinels.is_empty() && self.master_name.is_empty() {
            return Err(bad(
                "redis.master_name",
                "is required with redis.sentinels: the name the Sentinels monitor the primary under",
            ));
        }
        if !self.cluster.is_empty() && !self.sentinels.is_empty() {
            return Err(bad(
                "redis.cluster",
                "and redis.sentinels do not go together: a cluster elects its own primaries",
            ));
        }
        if !self.cluster.is_empty() && self.prefix.contains(['{', '}']) {
            return Err(bad(
                "redis.prefix",
                "must not hold { or } on a cluster: keys are grouped in slots by the channel between braces",
            ));
        }
        if self.replicas_ack > 0 && self.replicas_timeout.is_zero() {
            return Err(bad("redis.replicas_timeout", "must be greater than 0"));
        }
        Ok(())
    }
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
        }
    }
}

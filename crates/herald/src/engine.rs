//! The binary chooses the broker: the embedded ones (the server's own, in `data_dir` and in
//! memory), or a remote one from its own crate, connected here and handed to the node. So
//! the server depends on no remote broker, and each engine adds a case here.

use std::sync::Arc;

use herald_broker_nats::NatsBroker;
use herald_broker_redis::{redacted, RedisBroker, RedisOptions, RedisSentinel, RedisTls};
use herald_server::{Config, Embedded, Node, Settings};

use crate::storage::{EngineChoice, StorageEngine};

/// A node on the engine the configuration asks for, connected and checked before this
/// returns: a server whose broker cannot be reached stops at start, with the reason.
pub async fn open_node(settings: Settings, choice: &EngineChoice) -> anyhow::Result<Arc<Node>> {
    let (storage, redis) = (choice.storage, &choice.redis);
    match storage {
        StorageEngine::Durable => Ok(Node::embedded(settings, Embedded::Durable)?),
        StorageEngine::Memory => Ok(Node::embedded(settings, Embedded::Memory)?),
        StorageEngine::Redis => {
            if redis.tls_insecure {
                tracing::warn!(
                    "redis.tls_insecure: Redis's certificate is not verified; anyone on the \
                     path to it can read and change what this node stores"
                );
            }
            let sentinel = (!redis.sentinels.is_empty()).then(|| RedisSentinel {
                addresses: redis.sentinels.clone(),
                master_name: redis.master_name.clone(),
                password: redis.sentinel_password.clone(),
            });
            let connected = RedisBroker::connect(RedisOptions {
                url: redis.url.clone(),
                prefix: redis.prefix.clone(),
                tls: RedisTls {
                    ca_file: redis.ca_file.clone(),
                    cert_file: redis.cert_file.clone(),
                    key_file: redis.key_file.clone(),
                    insecure: redis.tls_insecure,
                },
                sentinel,
                cluster: redis.cluster.clone(),
                replicas_ack: redis.replicas_ack,
                replicas_timeout: redis.replicas_timeout,
                unreachable_after: choice.unreachable_after,
            })
            .await
            .map_err(|e| {
                let at = stored_in(choice, &settings.config);
                anyhow::anyhow!("cannot use redis at {at}: {e}")
            })?;
            Ok(Node::with_engine(settings, |sink| {
                connected.into_engine(sink)
            }))
        }
        StorageEngine::Nats => {
            let options = choice.nats.options(choice.unreachable_after);
            let connected = NatsBroker::connect(options, settings.policies())
                .await
                .map_err(|e| {
                    let at = stored_in(choice, &settings.config);
                    anyhow::anyhow!("cannot use {at}: {e}")
                })?;
            Ok(Node::with_engine(settings, |sink| {
                connected.into_engine(sink)
            }))
        }
    }
}

/// Where publications are kept, for the start-up line (no secret in it).
pub fn stored_in(choice: &EngineChoice, config: &Config) -> String {
    let redis = &choice.redis;
    match choice.storage {
        StorageEngine::Durable => config.data_dir.display().to_string(),
        StorageEngine::Memory => "memory".into(),
        StorageEngine::Redis if !redis.cluster.is_empty() => format!(
            "redis cluster at {} (prefix {})",
            redis.cluster.join(", "),
            redis.prefix
        ),
        StorageEngine::Redis if !redis.sentinels.is_empty() => format!(
            "redis primary {:?} from sentinels {} (prefix {})",
            redis.master_name,
            redis.sentinels.join(", "),
            redis.prefix
        ),
        StorageEngine::Redis => format!("{} (prefix {})", redacted(&redis.url), redis.prefix),
        StorageEngine::Nats => choice.nats.describe(),
    }
}

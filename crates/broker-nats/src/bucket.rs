//! Key-value buckets, found or made. async-nats makes a bucket only after reading the
//! account's limits, whose answer from nats-server 2.9 (Debian's) it cannot parse; so
//! Herald makes the bucket's stream itself, as a bucket's stream is made, and opens it as
//! a bucket.

use std::time::Duration;

use async_nats::jetstream::{
    self, kv,
    stream::{Config, DiscardPolicy, StorageType},
};
use herald_broker::BrokerError;

/// The bucket `bucket`, keeping one value per key, each for `max_age` (`None`: forever),
/// on `replicas` servers.
pub(crate) async fn open(
    js: &jetstream::Context,
    bucket: &str,
    max_age: Option<Duration>,
    replicas: usize,
) -> Result<kv::Store, BrokerError> {
    let failed =
        |e: &dyn std::fmt::Display| BrokerError::Unavailable(format!("nats: bucket {bucket}: {e}"));
    js.get_or_create_stream(Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age: max_age.unwrap_or_default(),
        storage: StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        // A follower's direct get could be behind; the leader answers on a replicated one.
        allow_direct: replicas == 1,
        discard: DiscardPolicy::New,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| failed(&e))?;
    js.get_key_value(bucket).await.map_err(|e| failed(&e))
}

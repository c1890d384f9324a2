//! Presence on a Redis Cluster, where a script keeps to one slot. A node's batch of joins
//! and leaves is three steps: at the nodes' slot, the node is marked alive and the
//! channels it is about to hold members in are noted (its tag comes back); in each
//! channel's slot, that channel's changes, in order; at the nodes' slot again, channels
//! where it holds no member any more are forgotten. Noted before and forgotten after, the
//! set of a node's channels always covers where it holds members, so the sweep of a dead
//! node finds them all; the batches of one node run one after another, so a join and a
//! leave of the same channel cannot cross.

use futures_util::StreamExt;
use herald_broker::BrokerError;
use herald_protocol::ChannelName;
use redis::Script;

use super::{key, scripts, Change, NODE_TTL};
use crate::{store::CLUSTER_PARALLEL, Store};

/// The scripts of a node's batches and beats.
pub(super) struct Cluster {
    nodes: Script,
    changes: Script,
    sweep: Script,
}

/// The key that puts a script in the nodes' slot.
fn nodes_key(prefix: &str) -> String {
    format!("{prefix}:{{presence}}:palive")
}

/// The key that puts a script in `channel`'s slot.
fn channel_key(prefix: &str, channel: &ChannelName) -> String {
    format!("{prefix}:pc:{{{channel}}}")
}

impl Cluster {
    pub(super) fn new() -> Self {
        Self {
            nodes: scripts::cluster_nodes(),
            changes: scripts::cluster_changes(),
            sweep: scripts::cluster_sweep(),
        }
    }

    /// Sends `batch` (in order per channel) and answers each change.
    pub(super) async fn send(&self, store: &Store, node: &str, batch: &mut Vec<Change>) {
        let prefix = store.names.prefix();
        let mut joined: Vec<&str> = batch
            .iter()
            .filter(|c| c.kind == "j")
            .map(|c| c.channel.as_str())
            .collect();
        joined.sort_unstable();
        joined.dedup();
        let mut tag = self.nodes.key(nodes_key(prefix));
        tag.arg(prefix).arg("tag").arg(node).arg(&joined);
        let tag: Result<String, BrokerError> = store
            .call(|mut c| async move { tag.invoke_async(&mut c).await })
            .await;
        let tag = match tag {
            Ok(tag) => tag,
            Err(e) => {
                for c in batch.drain(..) {
                    let _ = c.done.send(Err(e.clone()));
                }
                return;
            }
        };
        // Each channel's changes, in the order they came.
        let mut channels: Vec<(ChannelName, Vec<usize>)> = Vec::new();
        for (i, c) in batch.iter().enumerate() {
            match channels.iter_mut().find(|(name, _)| *name == c.channel) {
                Some((_, changes)) => changes.push(i),
                None => channels.push((c.channel.clone(), vec![i])),
            }
        }
        let calls: Vec<_> = channels
            .iter()
            .map(|(channel, changes)| {
                let mut call = self.changes.key(channel_key(prefix, channel));
                call.arg(prefix).arg(&tag).arg(channel.as_str());
                for &i in changes {
                    let c = &batch[i];
                    call.arg(c.kind)
                        .arg(&key(c.id)[..])
                        .arg(c.info.as_ref())
                        .arg(&c.user[..]);
                }
                store.call(|mut c| async move { call.invoke_async::<Vec<i64>>(&mut c).await })
            })
            .collect();
        let results: Vec<Result<Vec<i64>, BrokerError>> = futures_util::stream::iter(calls)
            .buffered(CLUSTER_PARALLEL)
            .collect()
            .await;
        let mut answers: Vec<Option<Result<bool, BrokerError>>> = vec![None; batch.len()];
        let mut left = Vec::new();
        for ((channel, changes), result) in channels.iter().zip(results) {
            for (n, &i) in changes.iter().enumerate() {
                answers[i] = Some(match &result {
                    Ok(flags) => Ok(flags.get(n) == Some(&1)),
                    Err(e) => Err(e.clone()),
                });
            }
            if matches!(&result, Ok(flags) if flags.last() == Some(&0)) {
                left.push(channel.as_str());
            }
        }
        if !left.is_empty() {
            let mut drop = self.nodes.key(nodes_key(prefix));
            drop.arg(prefix).arg("drop").arg(node).arg(&left);
            let dropped: Result<(), BrokerError> = store
                .call(|mut c| async move { drop.invoke_async(&mut c).await })
                .await;
            if let Err(e) = dropped {
                // Harmless: a dead node's sweep then visits a channel with nothing of it.
                tracing::debug!(error = %e, "could not forget channels this node left");
            }
        }
        for (c, answer) in batch.drain(..).zip(answers) {
            let answer =
                answer.unwrap_or_else(|| Err(BrokerError::Unavailable("redis: no answer".into())));
            let _ = c.done.send(answer);
        }
    }

    /// Marks `node` alive and removes the members of nodes that are not: found at the nodes'
    /// slot, released channel by channel, then forgotten (a sweep cut short is done again by
    /// the next beat). Returns `{channel, id ++ info, …}` of members that
    /// left.
    pub(super) async fn beat(
        &self,
        store: &Store,
        node: &str,
    ) -> Result<Vec<Vec<u8>>, BrokerError> {
        let nodes = &self.nodes;
        let prefix = store.names.prefix();
        let ttl = NODE_TTL.as_millis() as u64;
        let mut beat = nodes.key(nodes_key(prefix));
        beat.arg(prefix).arg("beat").arg(node).arg(ttl);
        let dead: Vec<redis::Value> = store
            .call(|mut c| async move { beat.invoke_async(&mut c).await })
            .await?;
        let mut gone = Vec::new();
        let mut swept = Vec::new();
        let sweep = &self.sweep;
        for found in dead.chunks(3) {
            let [node, tag, channels] = found else {
                continue;
            };
            let (Ok(node), Ok(tag), Ok(channels)) = (
                redis::from_redis_value_ref::<String>(node),
                redis::from_redis_value_ref::<String>(tag),
                redis::from_redis_value_ref::<Vec<String>>(channels),
            ) else {
                continue;
            };
            let mut whole = true;
            for channel in channels.iter().filter_map(|c| ChannelName::stored(c).ok()) {
                let mut call = sweep.key(channel_key(prefix, &channel));
                call.arg(prefix).arg(channel.as_str()).arg(&tag);
                let left: Result<Vec<Vec<u8>>, BrokerError> = store
                    .call(|mut c| async move { call.invoke_async(&mut c).await })
                    .await;
                match left {
                    Ok(left) => gone.extend(left),
                    Err(e) => {
                        tracing::warn!(%channel, error = %e, "could not sweep a dead node's members");
                        whole = false;
                    }
                }
            }
            if whole {
                swept.push(node);
            }
        }
        if !swept.is_empty() {
            let mut forget = nodes.key(nodes_key(prefix));
            forget
                .arg(prefix)
                .arg("forget")
                .arg("")
                .arg(ttl)
                .arg(&swept);
            store
                .call(|mut c| async move { forget.invoke_async::<()>(&mut c).await })
                .await?;
        }
        Ok(gone)
    }
}

//! Which node delivers a shared log. Nodes on one Redis or NATS share the events hook's and
//! the Pusher webhooks' logs; if each delivered them, the backend would get every post once
//! per node. So only the live node whose id sorts first delivers: each node tells the others
//! it is alive every [`crate::node::REPORT_EVERY`], and a node that stops reporting drops
//! out of the list after the engine's time to live, when the next one takes over from the
//! shared position. While the nodes' views of each other differ (a node starting, one
//! stopping) two may deliver for a moment: a post may then come twice, with the same ids,
//! never be skipped.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use herald_broker::SharedLink;
use parking_lot::Mutex;

/// How long an answer about who delivers is kept before the live nodes are asked again.
const ASK_EVERY: Duration = Duration::from_secs(1);

/// Whether this node delivers the shared logs.
#[derive(Clone)]
pub struct Lead {
    link: SharedLink,
    id: Arc<str>,
    /// The last answer, and when it was found.
    known: Arc<Mutex<Option<(Instant, bool)>>>,
}

impl std::fmt::Debug for Lead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lead").field("id", &self.id).finish()
    }
}

impl Lead {
    /// The lead of the node `id` among the nodes `link` joins.
    pub fn new(link: SharedLink, id: Arc<str>) -> Self {
        Self {
            link,
            id,
            known: Arc::default(),
        }
    }

    /// Whether this node is the live one whose id sorts first. Asked of the engine at most
    /// every [`ASK_EVERY`]; when the engine cannot answer, the last answer stands (a node
    /// that cannot reach it cannot deliver from it either).
    pub async fn held(&self) -> bool {
        let last = *self.known.lock();
        if let Some((at, held)) = last {
            if at.elapsed() < ASK_EVERY {
                return held;
            }
        }
        let held = match self.link.nodes().await {
            Ok(reports) => first(&self.id, &reports),
            Err(_) => last.is_none_or(|(_, held)| held),
        };
        *self.known.lock() = Some((Instant::now(), held));
        held
    }
}

/// Whether `id` sorts first among itself and the nodes in `reports` (each a node's figures,
/// JSON with its id under `node`; a report that is not is ignored).
fn first(id: &str, reports: &[bytes::Bytes]) -> bool {
    reports
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(r).ok())
        .filter_map(|r| r["node"].as_str().map(str::to_owned))
        .all(|other| *other >= *id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_id_leads_and_unreadable_reports_are_ignored() {
        let reports = |ids: &[&str]| -> Vec<bytes::Bytes> {
            let mut r: Vec<bytes::Bytes> = ids
                .iter()
                .map(|id| format!(r#"{{"node":"{id}","connections":3}}"#).into())
                .collect();
            r.push(bytes::Bytes::from_static(b"not json"));
            r
        };
        assert!(first("b", &reports(&["b", "c"])));
        assert!(!first("c", &reports(&["b", "c"])));
        assert!(first("a", &reports(&["b", "c"])), "not listed yet: itself");
        assert!(first("a", &[]));
    }
}

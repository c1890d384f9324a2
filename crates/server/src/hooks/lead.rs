//! Which node delivers a shared log. Nodes on one Redis or NATS share the events hook's and
//! the Pusher webhooks' logs; if each delivered them, the backend would get every post once
//! per node. So only the live node whose id sorts first among those that have the log
//! delivers it: each node tells the others it is alive, and which logs it has, every
//! [`crate::node::REPORT_EVERY`]; a node that stops reporting drops out of the list after
//! the engine's time to live, when the next one takes over from the shared position. While the nodes' views of each other differ (a node starting, one
//! stopping) two may deliver for a moment: a post may then come twice, with the same ids,
//! never be skipped.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use herald_broker::SharedLink;
use parking_lot::Mutex;

/// How long the nodes' reports are kept before they are asked for again.
const ASK_EVERY: Duration = Duration::from_secs(1);

/// What a node's report says about who may post: its id, and the logs it has (`None`: a
/// node of a version that did not say, which posts every log it has).
#[derive(Debug, Clone)]
struct Report {
    id: String,
    logs: Option<Vec<String>>,
}

/// The nodes' reports as last read, and when.
type Known = Option<(Instant, Arc<[Report]>)>;

/// Whether this node posts one shared log (see [`Lead::of`]).
#[derive(Clone)]
pub struct Lead {
    link: SharedLink,
    id: Arc<str>,
    log: Arc<str>,
    /// The last reports, and when they were read; shared by the leads of every log.
    known: Arc<Mutex<Known>>,
}

impl std::fmt::Debug for Lead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lead")
            .field("id", &self.id)
            .field("log", &self.log)
            .finish()
    }
}

impl Lead {
    /// The leads of the node `id` among the nodes `link` joins.
    pub fn new(link: SharedLink, id: Arc<str>) -> Self {
        Self {
            link,
            id,
            log: "".into(),
            known: Arc::default(),
        }
    }

    /// The lead of the log named `log` (`events`, `pusher-APP`): held by the node whose id
    /// sorts first among the live ones that have that log, so a node without it (a rolling
    /// change of the configuration) never holds its posting up.
    pub fn of(&self, log: &str) -> Self {
        Self {
            log: log.into(),
            ..self.clone()
        }
    }

    /// Whether this node posts the log. The nodes' reports are read from the engine at most
    /// every [`ASK_EVERY`]; when the engine cannot answer, the last ones stand (a node that
    /// cannot reach it cannot post from it either).
    pub async fn held(&self) -> bool {
        let last = self.known.lock().clone();
        let reports = match last {
            Some((at, reports)) if at.elapsed() < ASK_EVERY => reports,
            last => {
                let reports = match self.link.nodes().await {
                    Ok(reports) => reports.iter().filter_map(|r| read(r)).collect(),
                    Err(_) => last.map(|(_, r)| r).unwrap_or_default(),
                };
                *self.known.lock() = Some((Instant::now(), reports.clone()));
                reports
            }
        };
        first(&self.id, &self.log, &reports)
    }
}

/// A node's report (its figures, JSON with its id under `node` and its logs under
/// `hook_logs`); `None` if it is not one.
fn read(report: &[u8]) -> Option<Report> {
    let value: serde_json::Value = serde_json::from_slice(report).ok()?;
    let logs = value["hook_logs"].as_array().map(|logs| {
        logs.iter()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect()
    });
    Some(Report {
        id: value["node"].as_str()?.to_owned(),
        logs,
    })
}

/// Whether `id` sorts first among itself and the reported nodes that have `log`.
fn first(id: &str, log: &str, reports: &[Report]) -> bool {
    reports
        .iter()
        .filter(|r| {
            r.logs
                .as_ref()
                .is_none_or(|logs| logs.iter().any(|l| l == log))
        })
        .all(|r| *r.id >= *id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_id_among_the_nodes_with_the_log_leads() {
        let reports: Vec<Report> = [
            r#"{"node":"b","hook_logs":["events"]}"#,
            r#"{"node":"c","hook_logs":["events","pusher-1"]}"#,
            r#"{"node":"a","hook_logs":[]}"#,
            r#"not json"#,
            r#"{"connections":3}"#,
        ]
        .iter()
        .filter_map(|r| read(r.as_bytes()))
        .collect();
        assert_eq!(reports.len(), 3);
        assert!(first("b", "events", &reports));
        assert!(!first("c", "events", &reports));
        assert!(first("c", "pusher-1", &reports), "b and a lack it");
        assert!(first("a0", "events", &reports), "not listed yet: itself");
        assert!(first("z", "events", &[]));
        let old = read(br#"{"node":"a"}"#).unwrap();
        assert!(
            !first("b", "events", &[old]),
            "a node that does not say posts all"
        );
    }
}

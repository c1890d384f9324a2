//! Operators' actions on live connections, across every node: disconnect a user or a
//! client with a code, unsubscribe them from a channel, look up a user's connections, list
//! channels with their subscribers. The HTTP API (`/api/disconnect`, …) and the dashboard
//! call [`everywhere`]; it acts on this node and asks every other live node (through the
//! broker's node link) to do the same, then adds the answers up.
//!
//! An order reaches a connection through its queue ([`crate::queue::Queue::order`]), so it
//! takes effect in order with the publications before it, on every transport, and never
//! waits for a slow client. Polls are requests, not connections: a disconnect reaches a
//! polling client only through its token or hook.

use std::collections::BTreeMap;

use herald_protocol::{ChannelName, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{
    error::{Disconnect, Failure},
    node::Node,
    registry::Who,
};

/// What node requests for an action start with (session ids never contain `!`).
pub const NODE_REQUEST: &[u8] = b"!admin\n";

/// The most connections one lookup lists.
pub const MAX_LISTED: usize = 1000;

/// One operator's action.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Close the connections with `code` (3000–4999) and `reason`.
    Disconnect { who: Who, code: u16, reason: String },
    /// End their subscription to `channel` (an `unsubscribe` push with code 120).
    Unsubscribe { who: Who, channel: String },
    /// List the connections, with their channels.
    Connections { who: Who },
    /// A page of channels with subscribers, by name after `after`.
    Channels {
        after: String,
        prefix: String,
        limit: usize,
    },
}

impl Action {
    /// The client the action names, if it names one (then only its node can hold it).
    fn client(&self) -> Option<&str> {
        match self {
            Action::Disconnect { who, .. }
            | Action::Unsubscribe { who, .. }
            | Action::Connections { who } => match who {
                Who::Client(id) => Some(id),
                Who::User(_) => None,
            },
            Action::Channels { .. } => None,
        }
    }
}

/// Checks what the API was given before anything is done.
pub fn checked(action: Action) -> Result<Action, Failure> {
    let bad = |m: String| Err(Failure::new(ErrorCode::BadRequest, m));
    match &action {
        Action::Disconnect { code, reason, .. } => {
            if !(3000..=4999).contains(code) {
                return bad(format!(
                    "code {code} is not a disconnect code: use 3000–3499 (reconnect), 3500–3999 (do not), \
                     or your application's 4000–4499 (reconnect) and 4500–4999 (do not)"
                ));
            }
            if reason.len() > 123 {
                return bad("reason is longer than 123 bytes (a WebSocket close frame)".into());
            }
        }
        Action::Unsubscribe { channel, .. } => {
            ChannelName::new(channel)
                .map_err(|e| Failure::new(ErrorCode::InvalidChannel, e.to_string()))?;
        }
        Action::Connections { .. } => {}
        Action::Channels { limit, .. } => {
            if !(1..=MAX_LISTED).contains(limit) {
                return bad(format!("limit must be 1 to {MAX_LISTED}"));
            }
        }
    }
    Ok(action)
}

/// Carries out `action` on this node only.
pub fn here(node: &Node, action: &Action) -> Value {
    match action {
        Action::Disconnect { who, code, reason } => {
            let found = node.sessions.find(who);
            for (_, e) in &found {
                e.queue
                    .order(|o| o.end = Some(Disconnect::chosen(*code, reason.clone())));
            }
            json!({ "disconnected": found.len() })
        }
        Action::Unsubscribe { who, channel } => {
            let Ok(channel) = ChannelName::new(channel) else {
                return json!({ "unsubscribed": 0 });
            };
            let mut unsubscribed = 0;
            for (_, e) in node.sessions.find(who) {
                if node.hub.is_member(&channel, e.session) {
                    e.queue.order(|o| o.unsubscribe.push(channel.clone()));
                    unsubscribed += 1;
                }
            }
            json!({ "unsubscribed": unsubscribed })
        }
        Action::Connections { who } => {
            let mut found = node.sessions.find(who);
            found.sort_by_key(|(_, e)| e.since);
            found.truncate(MAX_LISTED);
            let ids: Vec<u64> = found.iter().map(|(_, e)| e.session).collect();
            let mut channels = node.hub.channels_of(&ids);
            let connections: Vec<Value> = found
                .into_iter()
                .map(|(client, e)| {
                    json!({
                        "client": &*client,
                        "user": e.user.as_deref().unwrap_or(""),
                        "transport": e.transport.name(),
                        "node": &*node.id,
                        "since": e.since,
                        "channels": channels.remove(&e.session).unwrap_or_default(),
                    })
                })
                .collect();
            json!({ "connections": connections })
        }
        Action::Channels {
            after,
            prefix,
            limit,
        } => {
            let page: Vec<Value> = node
                .hub
                .channels_page(after, prefix, *limit)
                .into_iter()
                .map(|(channel, n)| json!({ "channel": channel, "subscribers": n }))
                .collect();
            json!({ "channels": page })
        }
    }
}

/// Another node's request for an action (the bytes after [`NODE_REQUEST`]).
pub fn answer(node: &Node, request: &[u8]) -> Value {
    match serde_json::from_slice::<Action>(request) {
        Ok(action) => here(node, &action),
        Err(e) => json!({ "error": { "code": 107, "message": format!("bad admin request: {e}") } }),
    }
}

/// Carries out `action` on every live node and adds up their answers. Nodes that did not
/// answer are listed under `unreachable` (the answer is then partial).
pub async fn everywhere(node: &Node, action: Action) -> Result<Value, Failure> {
    let mut answers = Vec::new();
    let mut unreachable = Vec::new();
    // A client id names its node: only that one is asked (none, for an id no node has).
    let owner = action.client().map(crate::session::node_of);
    if owner.is_none_or(|o| o == Some(&*node.id)) {
        answers.push(here(node, &action));
    }
    let others: Vec<String> = match (&node.link, owner) {
        (None, _) => Vec::new(),
        (Some(_), Some(Some(owner))) if owner != &*node.id => vec![owner.to_string()],
        (Some(_), Some(_)) => Vec::new(),
        (Some(link), None) => link
            .nodes()
            .await?
            .iter()
            .filter_map(|f| serde_json::from_slice::<Value>(f).ok())
            .filter_map(|f| f["node"].as_str().map(str::to_string))
            .filter(|id| id != &*node.id)
            .collect(),
    };
    if let Some(link) = node.link.as_ref().filter(|_| !others.is_empty()) {
        let mut request = NODE_REQUEST.to_vec();
        request.extend(serde_json::to_vec(&action).expect("actions serialise"));
        let request = bytes::Bytes::from(request);
        let asked = futures_util::future::join_all(
            others.iter().map(|id| link.ask_node(id, request.clone())),
        )
        .await;
        for (id, answer) in others.into_iter().zip(asked) {
            match answer.ok().and_then(|a| serde_json::from_slice(&a).ok()) {
                Some(value) => answers.push(value),
                None => unreachable.push(id),
            }
        }
    }
    let mut merged = merge(&action, answers);
    if !unreachable.is_empty() {
        merged["unreachable"] = json!(unreachable);
    }
    Ok(merged)
}

/// The nodes' answers as one.
fn merge(action: &Action, answers: Vec<Value>) -> Value {
    let sum = |key: &str| -> u64 { answers.iter().filter_map(|a| a[key].as_u64()).sum() };
    match action {
        Action::Disconnect { .. } => json!({ "disconnected": sum("disconnected") }),
        Action::Unsubscribe { .. } => json!({ "unsubscribed": sum("unsubscribed") }),
        Action::Connections { .. } => {
            let mut all: Vec<Value> = answers
                .iter()
                .filter_map(|a| a["connections"].as_array())
                .flatten()
                .cloned()
                .collect();
            all.sort_by_key(|c| c["since"].as_u64());
            all.truncate(MAX_LISTED);
            json!({ "connections": all })
        }
        Action::Channels { limit, .. } => {
            // Each node gave its first `limit` names after the cursor; every name of the
            // merged first `limit` is in each of its nodes' pages, so its sum is whole.
            let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
            for c in answers
                .iter()
                .filter_map(|a| a["channels"].as_array())
                .flatten()
            {
                if let (Some(name), Some(n)) = (c["channel"].as_str(), c["subscribers"].as_u64()) {
                    *by_name.entry(name.to_string()).or_default() += n;
                }
            }
            let page: Vec<Value> = by_name
                .into_iter()
                .take(*limit)
                .map(|(channel, subscribers)| json!({ "channel": channel, "subscribers": subscribers }))
                .collect();
            let mut answer = json!({ "channels": page });
            if page_full(&answer, *limit) {
                answer["cursor"] = answer["channels"][limit - 1]["channel"].clone();
            }
            answer
        }
    }
}

fn page_full(answer: &Value, limit: usize) -> bool {
    answer["channels"]
        .as_array()
        .is_some_and(|c| c.len() == limit)
}

//! The node's open connections by client id, with their user: what an operator's actions
//! (`/api/disconnect`, `/api/unsubscribe`, `/api/connections`) find them by. A connection
//! is registered when its transport is known and leaves when its session is dropped;
//! polls and sends are requests, not connections, and are not registered.

use std::{collections::HashMap, sync::Arc};

use parking_lot::Mutex;

use crate::queue::Queue;

/// One open connection, as an operator sees it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The session's process-unique id (the hub's name for its subscriptions).
    pub session: u64,
    /// Where orders are handed to it.
    pub queue: Arc<Queue>,
    pub transport: crate::hooks::Transport,
    /// Its user, once identified (anonymous: none).
    pub user: Option<Box<str>>,
    /// When it opened, in Unix seconds.
    pub since: u64,
}

/// Which connections an action is for.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Who {
    /// The connection with this client id.
    Client(String),
    /// Every connection of this user.
    User(String),
}

/// Open connections by client id. One lock: taken when a connection opens, is
/// identified and closes, and by operators' actions (rare), never per message.
#[derive(Debug, Default)]
pub struct Registry {
    by_client: Mutex<HashMap<Arc<str>, Entry>>,
}

impl Registry {
    pub fn insert(&self, client: Arc<str>, entry: Entry) {
        self.by_client.lock().insert(client, entry);
    }

    /// The connection `client` is `user`'s.
    pub fn identified(&self, client: &str, user: &str) {
        if let Some(e) = self.by_client.lock().get_mut(client) {
            e.user = Some(user.into());
        }
    }

    pub fn remove(&self, client: &str) {
        self.by_client.lock().remove(client);
    }

    /// The connections `who` names, with their client ids (a user's: a scan, as operators'
    /// lookups are rare next to connections opening).
    pub fn find(&self, who: &Who) -> Vec<(Arc<str>, Entry)> {
        let all = self.by_client.lock();
        match who {
            Who::Client(id) => all
                .get_key_value(id.as_str())
                .map(|(k, e)| (k.clone(), e.clone()))
                .into_iter()
                .collect(),
            Who::User(user) => all
                .iter()
                .filter(|(_, e)| e.user.as_deref() == Some(user.as_str()))
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect(),
        }
    }

    /// The queue of the stream (SSE, NDJSON, forever frame) with this client id: where its
    /// client's `POST /connection/send` commands go. Other transports read their own.
    pub fn stream_queue(&self, client: &str) -> Option<Arc<Queue>> {
        let all = self.by_client.lock();
        let entry = all.get(client)?;
        use crate::hooks::Transport;
        matches!(
            entry.transport,
            Transport::Sse | Transport::Stream | Transport::Iframe
        )
        .then(|| entry.queue.clone())
    }

    /// Every open connection's queue.
    pub fn queues(&self) -> Vec<Arc<Queue>> {
        let all = self.by_client.lock();
        all.values().map(|e| e.queue.clone()).collect()
    }

    pub fn len(&self) -> usize {
        self.by_client.lock().len()
    }

    /// How many distinct users the identified connections belong to.
    pub fn user_count(&self) -> usize {
        let all = self.by_client.lock();
        let users: std::collections::HashSet<&str> =
            all.values().filter_map(|e| e.user.as_deref()).collect();
        users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

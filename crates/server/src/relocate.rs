//! A node that cannot reach its broker moves its clients: once Redis has been out of reach
//! for `broker.clients_move_after`, every connection it holds, and every long-poll it holds
//! or keeps, ends with 3009 (reconnect and resume), and no kept-alive HTTP connection
//! carries another request (`Node::is_moving_clients`), so its clients go, through a load
//! balancer that checks `/readyz`, to a node that can serve them, instead of waiting in
//! silence for as long as the cut lasts. Redis back sooner: they stay, and catch up from
//! history as after any lost connection.

use std::{
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use herald_protocol::DisconnectCode;

use crate::{error::Disconnect, node::Node};

/// How often the watcher looks at the broker's reach.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Starts the watcher, for a node whose broker is remote and a non-zero grace.
pub fn spawn(node: &Arc<Node>) {
    let grace = node.settings.broker.clients_move_after;
    if grace.is_zero() || node.broker.reach().is_none() {
        return;
    }
    tokio::spawn(watch(Arc::downgrade(node), grace));
}

async fn watch(node: Weak<Node>, grace: Duration) {
    let mut tick = tokio::time::interval(LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lost_since: Option<Instant> = None;
    let mut told = false;
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if node.shutdown.is_cancelled() {
            return;
        }
        let Some(why) = node.broker.reach().and_then(|r| r.lost) else {
            (lost_since, told) = (None, false);
            node.set_moving_clients(false);
            continue;
        };
        let since = *lost_since.get_or_insert_with(Instant::now);
        if since.elapsed() < grace {
            continue;
        }
        node.set_moving_clients(true);
        // Every look past the grace: a client that connected meanwhile moves too. The
        // registry holds the connections; the hub also knows held and parked long-polls,
        // whose answer then carries the 3009 (an order twice over is the same order).
        let mut queues = node.sessions.queues();
        queues.extend(node.hub.subscribed_queues());
        for queue in &queues {
            queue.order(|o| {
                o.end = Some(Disconnect::because(
                    DisconnectCode::BrokerUnreachable,
                    "this node cannot reach its broker; reconnect and resume",
                ))
            });
        }
        if !told {
            told = true;
            tracing::warn!(
                sessions = queues.len(),
                reason = %why,
                "the broker is out of reach past broker.clients_move_after: ending this node's connections with 3009 so that their clients reconnect to a node that reaches it"
            );
        }
    }
}

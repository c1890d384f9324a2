//! Whether this node reaches Redis: its command connection (a PING with a deadline, every
//! third of `unreachable_after`) and its pub/sub connection (pinged by the listener) must
//! both answer; after a loss, both must answer again. One WARN line when the way is lost,
//! one INFO line when it is back.

use std::{
    sync::Weak,
    time::{Duration, Instant},
};

use herald_broker::Reach;
use parking_lot::Mutex;

use crate::Store;

/// The two connections a node needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Commands,
    PubSub,
}

/// What each connection last showed, and the losses and recoveries so far.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    commands: Option<String>,
    pubsub: Option<String>,
    losses: u64,
    recoveries: u64,
    /// When the way was last lost: only what was sent after it shows it back.
    lost_at: Option<Instant>,
    /// Whether the command connection itself failed (not only unconfirmed since the
    /// pub/sub connection was lost): publications then cannot be sent at all.
    commands_failed: bool,
}

impl State {
    fn lost(&self) -> Option<String> {
        match (&self.commands, &self.pubsub) {
            (None, None) => None,
            (Some(c), None) => Some(format!("redis commands: {c}")),
            (None, Some(p)) => Some(format!("redis pub/sub: {p}")),
            (Some(c), Some(p)) => Some(format!("redis commands: {c}; pub/sub: {p}")),
        }
    }

    fn part(&mut self, part: Part) -> &mut Option<String> {
        match part {
            Part::Commands => &mut self.commands,
            Part::PubSub => &mut self.pubsub,
        }
    }
}

impl Tracker {
    /// `part` does not answer, for `why`.
    pub(crate) fn lost(&self, part: Part, why: impl Into<String>) {
        let mut state = self.state.lock();
        let was_reached = state.lost().is_none();
        *state.part(part) = Some(why.into());
        if part == Part::Commands {
            state.commands_failed = true;
        }
        if was_reached {
            // What cut one connection may have cut the other, which may not have noticed
            // yet: both must answer again before the node says it is ready.
            for other in [Part::Commands, Part::PubSub] {
                state
                    .part(other)
                    .get_or_insert_with(|| "not heard from since the other was lost".into());
            }
            state.losses += 1;
            state.lost_at = Some(Instant::now());
            let why = state.lost().unwrap_or_default();
            tracing::warn!(reason = %why, "redis is unreachable; this node is not ready (/readyz answers 503)");
        }
    }

    /// `part` answered what was sent at `sent` (a ping, a connection attempt); an answer to
    /// something sent before the way was lost shows nothing.
    pub(crate) fn back(&self, part: Part, sent: Instant) {
        let mut state = self.state.lock();
        if state.lost_at.is_some_and(|lost| sent < lost) {
            return;
        }
        if part == Part::Commands {
            state.commands_failed = false;
        }
        if state.part(part).take().is_some() && state.lost().is_none() {
            state.recoveries += 1;
            tracing::info!("redis is reachable again; this node is ready");
        }
    }

    /// As the broker reports it.
    pub(crate) fn reach(&self) -> Reach {
        let state = self.state.lock();
        Reach {
            lost: state.lost(),
            writes_lost: state
                .commands
                .clone()
                .filter(|_| state.commands_failed)
                .map(|why| format!("redis commands: {why}")),
            losses: state.losses,
            recoveries: state.recoveries,
            ..Reach::default()
        }
    }
}

/// Pings Redis on the command connection every third of `unreachable_after`, each PING
/// allowed the other two thirds: a connection that stops answering is found within
/// `unreachable_after`, and replaced (a silent cut is never noticed otherwise). After each
/// answer, Redis's replication is checked for a failover or restart that lost what this
/// node acknowledged (see `rollback`).
pub(crate) async fn probe(store: Weak<Store>, unreachable_after: Duration) {
    let every = unreachable_after / 3;
    let wait = unreachable_after - every;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(store) = store.upgrade() else { return };
        let (sent, ping) = (Instant::now(), store.ping());
        match tokio::time::timeout(wait, ping).await {
            Ok(Ok(())) => {
                store.reach.back(Part::Commands, sent);
                crate::rollback::check_soon(&store);
            }
            Ok(Err(e)) => store.reach.lost(Part::Commands, e.to_string()),
            Err(_) => {
                store
                    .reach
                    .lost(Part::Commands, format!("no answer to PING within {wait:?}"));
                store.abandon_connection("redis does not answer PING");
            }
        }
    }
}

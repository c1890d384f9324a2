//! The pub/sub connection's life: connect, subscribe to every tracked channel, read until
//! the connection drops or stops answering pings, catch up what was missed; again and again
//! while the broker lives.

use super::*;
use crate::reach::Part;

/// Connects, subscribes to every tracked channel, then reads until the connection drops
/// or stops answering pings, catching up what was missed meanwhile; again and again while
/// the broker lives.
/// The primary is asked for anew each time (see [`crate::Endpoint`]): after a failover the
/// connection moves with it.
pub(super) async fn run(listener: std::sync::Weak<Listener>, endpoint: Arc<crate::Endpoint>) {
    let mut backoff = Duration::from_millis(50);
    let mut first = true;
    let mut keep_empty = tokio::time::interval(KEEP_EMPTY_EVERY);
    keep_empty.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let attempt = std::time::Instant::now();
        let connecting = pubsub::connect(&endpoint);
        // Given up after `unreachable_after`, as a ping would be: an attempt swallowed by a
        // partition must not keep the node from trying again once the way is back.
        let wait = endpoint_wait(&listener).unwrap_or(COMMAND_WAIT);
        let (control, mut messages) = match tokio::time::timeout(wait, connecting).await {
            Ok(Ok(p)) => p,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e,
                    _ => "timed out".into(),
                };
                if let Some(me) = listener.upgrade() {
                    me.store
                        .reach
                        .lost(Part::PubSub, format!("cannot connect: {error}"));
                }
                tracing::warn!(%error, "redis pub/sub connection failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let Some(me) = listener.upgrade() else { return };
        let connection = Connection {
            sink: control,
            dead: Arc::new(Notify::new()),
        };
        let subscribed = {
            let _membership = me.membership.write().await;
            let names: Vec<String> = me.channels.lock().keys().map(|k| k.to_string()).collect();
            let control = [me.node_channel.clone(), me.presence_channel.clone()];
            let mut sink = connection.sink.clone();
            let subscribed = connection.timed(sink.subscribe(&names, &control)).await;
            if subscribed.is_ok() {
                me.control.send_replace(Some(connection.clone()));
            }
            subscribed
        };
        if let Err(e) = subscribed {
            me.store
                .reach
                .lost(Part::PubSub, format!("cannot subscribe: {e}"));
            tracing::warn!(error = %e, "redis resubscribe failed; retrying");
            drop(me);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        }
        let mut waiting: Vec<CatchUp> = Vec::new();
        if !first {
            tracing::info!("redis pub/sub connection is back");
            waiting = me.start_catch_up();
            me.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        // After the count: whoever sees the node reach Redis again sees the resubscription.
        me.store.reach.back(Part::PubSub, attempt);
        first = false;
        backoff = Duration::from_millis(50);
        let store = me.store.clone();
        drop(me);

        let mut reading = FuturesUnordered::new();
        // As the command connection's probe: a ping every third of `unreachable_after`,
        // answered within the other two thirds (see `crate::reach`).
        let ping_every = store.unreachable_after / 3;
        let ping_wait = store.unreachable_after - ping_every;
        let mut ping = tokio::time::interval(ping_every);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pinging: Option<Pin<Box<dyn Future<Output = Option<std::time::Instant>> + Send>>> =
            None;
        let mut keeping: Option<Pin<Box<dyn Future<Output = ()> + Send>>> = None;
        loop {
            while reading.len() < CATCH_UP_PARALLEL {
                let Some(next) = waiting.pop() else { break };
                reading.push(read_back(&store, next, Duration::ZERO));
            }
            tokio::select! {
                heard = messages.next() => {
                    let Some(me) = listener.upgrade() else { return };
                    let message = match heard {
                        Some(Heard::Message(message)) => message,
                        Some(Heard::Unsubscribed(name)) => {
                            if !me.channels.lock().contains_key(name.as_str()) {
                                continue; // asked for
                            }
                            tracing::warn!(channel = %name, "redis unsubscribed a channel this node listens to (its slot moved)");
                            me.moved.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Some(Heard::Dropped) => {
                            tracing::warn!("a redis cluster node's pub/sub connection dropped");
                            me.moved.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        None => break,
                    };
                    if message.get_channel_name() == me.node_channel {
                        me.on_node_message(message.get_payload_bytes());
                        continue;
                    }
                    if message.get_channel_name() == me.presence_channel {
                        let presence = me.presence.lock().as_ref().and_then(|w| w.upgrade());
                        if let Some(presence) = presence {
                            presence.heard(message.get_payload_bytes());
                        }
                        continue;
                    }
                    match decode_message(message.get_payload_bytes()) {
                        Some((epoch, publication)) => {
                            me.on_live(message.get_channel_name(), epoch, publication);
                        }
                        None => tracing::warn!(
                            channel = message.get_channel_name(),
                            "invalid message on a Herald pub/sub channel; dropped"
                        ),
                    }
                }
                Some((catch_up, read)) = reading.next(), if !reading.is_empty() => {
                    if let Err(BrokerError::Unavailable(e)) = &read {
                        tracing::warn!(channel = %catch_up.channel, error = %e, "catch-up read failed; retrying");
                        reading.push(read_back(&store, catch_up, CATCH_UP_RETRY));
                        continue;
                    }
                    let Some(me) = listener.upgrade() else { return };
                    if let Some(back) = me.finish_catch_up(&catch_up.name, read) {
                        let store = store.clone();
                        tokio::spawn(async move { back.renew(&store).await });
                    }
                }
                _ = ping.tick(), if pinging.is_none() => {
                    if let Some(me) = listener.upgrade() {
                        me.send_probe();
                    }
                    let mut sink = connection.sink.clone();
                    let sent = std::time::Instant::now();
                    pinging = Some(Box::pin(async move {
                        let answered = matches!(
                            tokio::time::timeout(ping_wait, sink.ping()).await,
                            Ok(Ok(()))
                        );
                        answered.then_some(sent)
                    }));
                }
                answered = async { pinging.as_mut().expect("guarded").await }, if pinging.is_some() => {
                    pinging = None;
                    let Some(sent) = answered else {
                        tracing::warn!("redis pub/sub connection does not answer pings");
                        break;
                    };
                    if let Some(me) = listener.upgrade() {
                        me.store.reach.back(Part::PubSub, sent);
                    }
                }
                _ = keep_empty.tick(), if keeping.is_none() => {
                    let Some(me) = listener.upgrade() else { return };
                    let empty = me.empty_channels();
                    if !empty.is_empty() {
                        let store = store.clone();
                        keeping = Some(Box::pin(async move {
                            if let Err(e) = store.keep_empty(&empty).await {
                                tracing::warn!(error = %e, "could not keep empty streams alive");
                            }
                        }));
                    }
                }
                () = async { keeping.as_mut().expect("guarded").await }, if keeping.is_some() => {
                    keeping = None;
                }
                () = connection.dead.notified() => {
                    tracing::warn!("a redis pub/sub call timed out");
                    break;
                }
            }
        }
        // Dropping the stream closes the connection; channels still catching up are read
        // again, from where they stand, after the next reconnect.
        let Some(me) = listener.upgrade() else { return };
        me.store.reach.lost(Part::PubSub, "the connection was lost");
        me.control.send_replace(None);
        for (_, t) in me.channels.lock().iter_mut() {
            let held = t.held.take();
            me.release(held.as_ref());
        }
        tracing::warn!("redis pub/sub connection lost; reconnecting");
    }
}

/// How long a (re)connection may take: the node's `unreachable_after`, at most the
/// command limit.
fn endpoint_wait(listener: &std::sync::Weak<Listener>) -> Option<Duration> {
    let me = listener.upgrade()?;
    Some(me.store.unreachable_after.min(COMMAND_WAIT))
}

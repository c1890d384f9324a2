//! One semantics across transports: whatever carries them, clients that drop and resume
//! at random moments end with every offset exactly once, in order.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::{
    http::{urlencode, Lines},
    support::*,
};

const TOTAL: u64 = 1000;
const CHANNEL: &str = "chat:cross";

#[derive(Debug, Clone, Copy)]
enum Kind {
    WebSocket,
    Sse,
    Stream,
    Iframe,
    LongPoll,
    Poll,
}

const KINDS: [Kind; 6] = [
    Kind::WebSocket,
    Kind::Sse,
    Kind::Stream,
    Kind::Iframe,
    Kind::LongPoll,
    Kind::Poll,
];

/// Follows the channel, reconnecting after a random number of publications, over one
/// transport (`Some`) or a randomly chosen one each time (`None`), each time to a randomly
/// chosen node of `nodes`; returns every offset received, in arrival order.
async fn follow(
    nodes: Arc<Vec<TestServer>>,
    fixed: Option<Kind>,
    epoch: String,
    seed: u64,
) -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut seen: Vec<u64> = Vec::new();
    let last = |seen: &Vec<u64>| seen.last().copied().unwrap_or(0);
    let cursor = |seen: &Vec<u64>| {
        urlencode(&format!(
            "{CHANNEL};{epoch};{}",
            seen.last().copied().unwrap_or(0)
        ))
    };
    let http = reqwest::Client::new();
    // A publication push's offset; anything else must not be a failed resume.
    let offset_of = |push: &Value| -> Option<u64> {
        if let Some(s) = push.get("subscribe") {
            assert_ne!(s["recovered"], false, "{fixed:?} lost its place: {push}");
        }
        push["pub"]["offset"].as_u64()
    };
    while last(&seen) < TOTAL {
        let server = &nodes[rng.usize(..nodes.len())];
        let kind = fixed.unwrap_or_else(|| KINDS[rng.usize(..KINDS.len())]);
        let budget = rng.usize(1..80);
        match kind {
            Kind::WebSocket => {
                let mut c = server.client().await;
                let r = c.subscribe(CHANNEL, Some((last(&seen), &epoch))).await;
                assert_eq!(r["recovered"], true, "{r}");
                seen.extend(offsets(&r));
                for _ in 0..budget {
                    if last(&seen) == TOTAL {
                        break;
                    }
                    seen.push(c.next_pub().await.1);
                }
            }
            Kind::Sse | Kind::Stream | Kind::Iframe => {
                let path = match kind {
                    Kind::Sse => "sse?",
                    Kind::Stream => "stream?",
                    _ => "iframe?callback=cb&",
                };
                let url = server.url(&format!("/connection/{path}cursor={}", cursor(&seen)));
                let mut lines = Lines::new(http.get(url).send().await.unwrap());
                let mut taken = 0;
                while taken < budget && last(&seen) < TOTAL {
                    let line = lines.next().await.expect("stream stays open");
                    let json = match kind {
                        Kind::Sse => line.strip_prefix("data: ").map(str::to_string),
                        Kind::Stream => Some(line),
                        _ => line
                            .strip_prefix("<script>parent.cb(")
                            .and_then(|l| l.strip_suffix(");</script>"))
                            .map(str::to_string),
                    };
                    let Some(json) = json.filter(|j| !j.is_empty()) else {
                        continue;
                    };
                    if let Some(o) = offset_of(&serde_json::from_str(&json).unwrap()) {
                        seen.push(o);
                        taken += 1;
                    }
                }
            }
            Kind::LongPoll | Kind::Poll => {
                let path = if let Kind::LongPoll = kind {
                    "longpoll"
                } else {
                    "poll"
                };
                let url = server.url(&format!(
                    "/connection/{path}?cursor={}&_={}",
                    cursor(&seen),
                    rng.u32(..)
                ));
                let (status, answer) = response(http.get(url).send().await.unwrap()).await;
                assert_eq!(status, 200, "{answer}");
                let before = seen.len();
                seen.extend(
                    answer["messages"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(offset_of),
                );
                if seen.len() == before && matches!(kind, Kind::Poll) {
                    // A polling client's interval; nothing to wait for but the clock.
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_receives_every_offset_once_in_order_despite_random_reconnects() {
    every_offset_once_in_order(vec![start(config()).await]).await;
}

/// Two nodes share the channel through Redis: the publisher alternates between them, and
/// every follower reconnects to either, so each resume crosses nodes half the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_on_another_node_loses_and_repeats_nothing() {
    let redis = RedisServer::start();
    let nodes = vec![
        start_on_redis(config(), &redis).await,
        start_on_redis(config(), &redis).await,
    ];
    every_offset_once_in_order(nodes).await;
}

async fn every_offset_once_in_order(nodes: Vec<TestServer>) {
    let nodes = Arc::new(nodes);
    let (_, position) = nodes[0]
        .api_get(&format!("/api/history?channel={CHANNEL}&limit=0"))
        .await;
    let epoch = position["epoch"].as_str().unwrap().to_string();
    let seed = fastrand::u64(..);
    println!("seed {seed}");

    // One follower per transport, and one that switches transport on every reconnect.
    let followers: Vec<_> = KINDS
        .iter()
        .copied()
        .map(Some)
        .chain([None])
        .enumerate()
        .map(|(i, kind)| {
            (
                kind,
                tokio::spawn(follow(nodes.clone(), kind, epoch.clone(), seed + i as u64)),
            )
        })
        .collect();
    let publisher = {
        let nodes = nodes.clone();
        tokio::spawn(async move {
            for i in 1..=TOTAL {
                let node = &nodes[i as usize % nodes.len()];
                let (offset, e) = node.publish(CHANNEL, json!({ "n": i })).await;
                assert_eq!((offset, e.as_str()), (i, epoch.as_str()));
            }
        })
    };
    publisher.await.unwrap();
    for (kind, follower) in followers {
        let seen = follower.await.unwrap();
        assert_eq!(
            seen,
            (1..=TOTAL).collect::<Vec<_>>(),
            "{} (seed {seed})",
            kind.map_or("the transport-switching client".to_string(), |k| format!(
                "{k:?}"
            ))
        );
    }
    for node in Arc::into_inner(nodes).unwrap() {
        node.stop().await.unwrap();
    }
}

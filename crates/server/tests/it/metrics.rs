//! `GET /metrics` (issue #16): behind the API key, in the Prometheus text format, counting
//! what clients of every kind did.

use serde_json::json;

use crate::support::{config, eventually, start};

/// The value of the sample `name{labels}` in a scrape (0 when absent).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn metrics_count_connections_disconnects_publications_and_commands() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let scrape = || server.metrics();
    // Without the key: refused, like the rest of the API.
    let r = http.get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 401);

    let mut a = server.client().await;
    a.subscribe("open:m", None).await;
    let mut b = server.client().await;
    b.subscribe("open:m", None).await;
    a.call("publish", json!({"channel": "open:m", "data": 1}))
        .await;
    server.publish("chat:m", json!(2)).await;
    server.publish("elsewhere:m", json!(3)).await;
    b.next_pub().await;
    let before_close = scrape().await;
    assert_eq!(
        sample(&before_close, "herald_connections{transport=\"websocket\"}"),
        2.0
    );
    assert_eq!(
        sample(
            &before_close,
            "herald_connections_accepted_total{transport=\"websocket\"}"
        ),
        2.0
    );
    // Namespaces the configuration names, and `_other` for the rest: never channel names.
    assert_eq!(
        sample(
            &before_close,
            "herald_publications_total{namespace=\"open\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &before_close,
            "herald_publications_total{namespace=\"chat\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &before_close,
            "herald_publications_total{namespace=\"_other\"}"
        ),
        1.0
    );
    assert!(
        !before_close.contains("open:m"),
        "no channel names:\n{before_close}"
    );
    assert_eq!(
        sample(
            &before_close,
            "herald_publish_duration_seconds_count{storage=\"memory\"}"
        ),
        3.0
    );
    assert!(
        sample(
            &before_close,
            "herald_command_duration_seconds_count{method=\"subscribe\"}"
        ) >= 2.0
    );
    assert!(
        sample(&before_close, "herald_deliveries_total") >= 2.0,
        "{before_close}"
    );
    assert_eq!(sample(&before_close, "herald_subscribed_channels"), 1.0);
    assert_eq!(sample(&before_close, "herald_subscriptions"), 2.0);
    assert!(sample(&before_close, "herald_process_resident_memory_bytes") > 0.0);

    // A client that leaves is a 1000; one cut off for a bad frame, its code.
    drop(a);
    b.send_text("{not json").await;
    b.closed().await;
    eventually("both ends counted", || async {
        let text = scrape().await;
        sample(&text, "herald_connections{transport=\"websocket\"}") == 0.0
            && sample(&text, "herald_disconnects_total{code=\"1000\"}") == 1.0
            && sample(&text, "herald_disconnects_total{code=\"3501\"}") == 1.0
    })
    .await;
}

#[tokio::test]
async fn the_http_transports_are_counted_under_their_own_names() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let mut sse = http
        .get(server.url("/connection/sse?channel=open:h"))
        .send()
        .await
        .unwrap();
    // The stream is open once its first event arrives.
    sse.chunk().await.unwrap();
    let poll = http
        .get(server.url("/connection/poll?channel=open:h"))
        .send()
        .await
        .unwrap();
    assert_eq!(poll.status(), 200);
    let text = server.metrics().await;
    assert_eq!(
        sample(&text, "herald_connections{transport=\"sse\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "herald_connections_accepted_total{transport=\"poll\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(&text, "herald_connections{transport=\"poll\"}"),
        0.0,
        "the poll ended"
    );
}

/// Pushes, their bytes and queued bytes by transport, and the sampled delivery latency.
#[tokio::test]
async fn pushes_and_their_latency_are_counted_by_transport() {
    let server = start(config()).await;
    let mut ws = server.client().await;
    ws.subscribe("open:w", None).await;
    let http = reqwest::Client::new();
    let mut sse = http
        .get(server.url("/connection/sse?channel=open:w"))
        .send()
        .await
        .unwrap();
    sse.chunk().await.unwrap();
    // One write in 64 per thread is timed; 300 writes over a few threads time some.
    const N: u64 = 300;
    for i in 1..=N {
        server.publish("open:w", json!(i)).await;
    }
    while ws.next_pub().await.1 < N {}
    let mut seen = String::new();
    while !seen.contains(&format!("\"offset\":{N}")) {
        seen.push_str(&String::from_utf8_lossy(
            &sse.chunk().await.unwrap().unwrap(),
        ));
    }
    eventually("every push counted and nothing left queued", || async {
        let text = server.metrics().await;
        ["websocket", "sse"].iter().all(|t| {
            sample(&text, &format!("herald_pushes_total{{transport=\"{t}\"}}")) == N as f64
                && sample(&text, &format!("herald_queued_bytes{{transport=\"{t}\"}}")) == 0.0
        })
    })
    .await;
    let text = server.metrics().await;
    for t in ["websocket", "sse"] {
        let bytes = sample(
            &text,
            &format!("herald_pushed_bytes_total{{transport=\"{t}\"}}"),
        );
        // Each push is a JSON line of at least `{"pub":…}` with channel and offset.
        assert!(bytes > 30.0 * N as f64, "{t}: {bytes} bytes");
    }
    let timed: f64 = ["websocket", "sse"]
        .iter()
        .map(|t| {
            sample(
                &text,
                &format!("herald_delivery_latency_seconds_count{{transport=\"{t}\"}}"),
            )
        })
        .sum();
    assert!(timed >= 1.0, "{text}");
    assert_eq!(
        sample(&text, "herald_pushes_total{transport=\"poll\"}"),
        0.0
    );
}

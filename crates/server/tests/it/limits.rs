//! Sockets that never finish a request, and clients that open or send too much, are bounded
//! per address and in total; other clients are unaffected.

use std::{net::IpAddr, time::Duration};

use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::support::*;

/// Reads until the server closes the socket; what it said, or a failure after `PATIENCE`.
async fn until_closed(socket: &mut TcpStream) -> String {
    let mut said = Vec::new();
    tokio::time::timeout(PATIENCE, socket.read_to_end(&mut said))
        .await
        .expect("the server closes the socket")
        .ok();
    String::from_utf8_lossy(&said).into_owned()
}

#[tokio::test]
async fn half_sent_requests_and_idle_keep_alives_are_closed_after_the_header_timeout() {
    let mut cfg = config();
    cfg.http.header_timeout = Duration::from_secs(1);
    let server = start(cfg).await;
    let mut slow = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nX-a: ")
            .await
            .unwrap();
        slow.push(s);
    }
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    for s in &mut slow {
        until_closed(s).await;
    }
    assert!(until_closed(&mut idle).await.contains("200 OK"));
    eventually("no socket left", || async {
        server
            .node
            .sockets
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    })
    .await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn raw_sockets_count_against_max_connections() {
    let mut cfg = config();
    cfg.max_connections = 3;
    let server = start(cfg).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    let mut refused = TcpStream::connect(server.addr).await.unwrap();
    refused
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let said = until_closed(&mut refused).await;
    assert!(said.starts_with("HTTP/1.1 503"), "{said}");
    assert!(said.contains("\"code\":106"), "{said}");
    drop(held);
    eventually("the held sockets are released", || async {
        reqwest::get(server.url("/healthz"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    server.stop().await.unwrap();
}

fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn stateless_sends_are_limited_per_address_not_per_request() {
    let mut cfg = config();
    cfg.limits.commands_per_address = 10;
    let server = start(cfg).await;
    let pings = |n: usize| {
        (0..n)
            .map(|i| format!("{{\"id\":{i},\"ping\":{{}}}}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let flooder = client_from("127.0.0.1");
    let mut refused = 0;
    // Several requests, each with a fresh session: the address's allowance (a burst of 20)
    // is what runs out.
    for _ in 0..3 {
        for code in server.send_codes(&flooder, pings(15)).await {
            match code {
                None => {}
                Some(111) => refused += 1,
                Some(other) => panic!("unexpected error {other}"),
            }
        }
    }
    assert!(
        refused >= 20,
        "45 commands against a burst of 20: {refused} refused"
    );
    let other = client_from("127.0.0.2");
    let answered = server.send_codes(&other, pings(5)).await;
    assert!(
        answered.iter().all(Option::is_none),
        "another address is unaffected"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn connections_per_address_are_bounded_and_forwarded_addresses_count_behind_trusted_proxies()
{
    let mut cfg = config();
    cfg.limits.connections_per_address = 2;
    cfg.limits.trusted_proxies = vec!["127.0.0.3".parse().unwrap()];
    let server = start(cfg).await;
    let open = |client: &reqwest::Client, forwarded: Option<&'static str>| {
        let mut r = client.get(server.url("/connection/sse?channel=news"));
        if let Some(f) = forwarded {
            r = r.header("x-forwarded-for", f);
        }
        r.send()
    };
    let direct = client_from("127.0.0.1");
    let held = [
        open(&direct, None).await.unwrap(),
        open(&direct, None).await.unwrap(),
    ];
    assert!(held.iter().all(|r| r.status() == 200));
    let (status, body) = match open(&direct, None).await {
        Ok(r) => response(r).await,
        // Refused at accept: the canned 503 may race with the request being written.
        Err(_) => (503, json!({ "error": { "code": 106 } })),
    };
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &json!(106)),
        "{body}"
    );
    // A client of another address, and a forged X-Forwarded-For from an untrusted peer.
    let other = client_from("127.0.0.2");
    assert_eq!(open(&other, Some("1.1.1.1")).await.unwrap().status(), 200);
    // Behind the trusted proxy, each forwarded client has its own allowance.
    let proxy = client_from("127.0.0.3");
    let a = [
        open(&proxy, Some("5.5.5.5")).await.unwrap(),
        open(&proxy, Some("5.5.5.5")).await.unwrap(),
    ];
    assert!(a.iter().all(|r| r.status() == 200));
    let third = open(&proxy, Some("5.5.5.5")).await.unwrap();
    let (status, body) = response(third).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &json!(106)),
        "{body}"
    );
    assert_eq!(open(&proxy, Some("6.6.6.6")).await.unwrap().status(), 200);
    server.stop().await.unwrap();
}

/// Review item 4: publishing to fresh names makes channel state that outlives the client
/// (a durable namespace keeps it on disk for days). Each address may make
/// `new_channels_per_address` a minute (bursts of twice that) on every transport; past it
/// a publication to a channel that does not exist gets 111, one to a channel that exists
/// still goes through, and other addresses are unaffected.
#[tokio::test]
async fn the_channels_an_address_can_make_exist_are_bounded() {
    let mut cfg = config();
    cfg.limits.new_channels_per_address = 5;
    let server = start(cfg).await;
    let publishes = |names: &[String]| {
        names
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{{\"id\":{i},\"publish\":{{\"channel\":\"{c}\",\"data\":1}}}}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let fresh: Vec<String> = (0..30).map(|i| format!("open:fresh{i}")).collect();
    let creator = client_from("127.0.0.1");
    let answered = server.send_codes(&creator, publishes(&fresh)).await;
    let made = answered.iter().filter(|c| c.is_none()).count();
    assert_eq!(made, 10, "a burst of twice 5 per minute: {answered:?}");
    assert!(
        answered[10..].iter().all(|c| *c == Some(111)),
        "{answered:?}"
    );
    // A channel that exists takes publications from the same address.
    assert_eq!(
        server.send_codes(&creator, publishes(&fresh[..1])).await,
        [None]
    );
    // The limit is the address's, on every transport: its WebSocket is refused too.
    let mut ws = server.client().await;
    let reply = ws
        .call("publish", json!({"channel": "open:fresh-ws", "data": 1}))
        .await;
    assert_eq!(reply["error"]["code"], 111, "{reply}");
    // Another address is unaffected.
    let other = client_from("127.0.0.2");
    assert_eq!(
        server
            .send_codes(&other, publishes(&["open:other".to_string()]))
            .await,
        [None]
    );
    server.stop().await.unwrap();
}

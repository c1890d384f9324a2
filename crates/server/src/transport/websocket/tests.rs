//! The WebSocket connection alone: one compression per publication, and the room an idle
//! connection takes.

use std::sync::Arc;

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch};

use super::*;
use crate::queue::{DirectSocket, Form, Lane};

/// A compressed WebSocket and the client end of its socket.
async fn compressed(node: &Arc<Node>, session: &Session) -> (WebSocket<HeraldFrames>, TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let ws = WebSocket::open(server, Vec::new(), true, session, node, HeraldFrames);
    (ws, client)
}

#[tokio::test]
async fn a_publication_is_compressed_once_whichever_path_writes_it() {
    let node = Node::with_memory_broker(crate::config::Config::default().validate().unwrap());
    let json = format!(
        r#"{{"pub":{{"channel":"c","offset":1,"data":"{}"}}}}"#,
        "ab".repeat(200)
    );
    let d = Delivery::new(
        ChannelName::new("c").unwrap(),
        Epoch::new("e"),
        1,
        Bytes::from(json),
    );
    let (a, b) = (Session::new(&node), Session::new(&node));
    let (mut first, _c1) = compressed(&node, &a).await;
    let (mut second, _c2) = compressed(&node, &b).await;
    // The task's path of one connection, then another's, then the hub's direct lane.
    let (mut out1, mut out2) = (Vec::new(), Vec::new());
    first.push(d.json(), Some(&d), a.positions(), &mut out1);
    second.push(d.json(), Some(&d), b.positions(), &mut out2);
    first.seal_pending(&mut out1);
    second.seal_pending(&mut out2);
    let shared = first.io.shared_frame(&d, d.json()).unwrap().clone();
    let direct = first
        .io
        .wire()
        .frame(&d, crate::queue::Form::Plain)
        .unwrap();
    assert_eq!(out1, shared[..]);
    assert_eq!(out2, shared[..]);
    // The same allocation: made once, by the first.
    assert_eq!(direct.as_ptr(), shared.as_ptr());
    assert_eq!(shared[0], 0xC1, "final, compressed, text");
    assert!(shared.len() < d.json().len() / 4);
}

#[tokio::test]
async fn replies_around_a_publication_keep_their_order_and_are_compressed_apart() {
    let node = Node::with_memory_broker(crate::config::Config::default().validate().unwrap());
    let session = Session::new(&node);
    let (mut ws, _client) = compressed(&node, &session).await;
    let d = Delivery::new(
        ChannelName::new("c").unwrap(),
        Epoch::new("e"),
        1,
        Bytes::from("x".repeat(300)),
    );
    let mut out = Vec::new();
    ws.push(b"{\"id\":1}", None, session.positions(), &mut out);
    ws.push(b"{\"id\":2}", None, session.positions(), &mut out);
    ws.push(d.json(), Some(&d), session.positions(), &mut out);
    ws.push(b"{\"id\":3}", None, session.positions(), &mut out);
    // The two replies joined as one small (plain) message, then the shared frame;
    // the third reply waits for `send`.
    let mut expected = Vec::new();
    frames::write_frame(
        &mut expected,
        true,
        false,
        opcode::TEXT,
        b"{\"id\":1}\n{\"id\":2}",
    );
    expected.extend_from_slice(ws.io.shared_frame(&d, d.json()).unwrap());
    assert_eq!(out, expected);
    assert_eq!(ws.pending, b"{\"id\":3}");
}

#[tokio::test]
async fn publications_queued_together_go_as_one_message_of_their_shared_pieces() {
    let node = Node::with_memory_broker(crate::config::Config::default().validate().unwrap());
    let session = Session::new(&node);
    let (mut ws, _client) = compressed(&node, &session).await;
    let c = ChannelName::new("c").unwrap();
    let ds: Vec<Delivery> = (1..=3)
        .map(|i| {
            let json = format!(
                r#"{{"pub":{{"channel":"c","offset":{i},"data":"{}"}}}}"#,
                "yz".repeat(100)
            );
            Delivery::new(c.clone(), Epoch::new("e"), i, Bytes::from(json))
        })
        .collect();
    let mut out = Vec::new();
    for d in &ds {
        ws.push(d.json(), Some(d), session.positions(), &mut out);
    }
    ws.seal_pending(&mut out);
    // One compressed message, inflating to the three lines.
    assert_eq!(out[0], 0xC1, "final, compressed, text");
    let inflated = deflate::inflate(frames::payload(&out), 1 << 20).unwrap();
    let lines: Vec<&[u8]> = ds.iter().map(|d| &d.json()[..]).collect();
    assert_eq!(inflated, lines.join(&b'\n'));
    // Made of the shared frames' bytes: nothing compressed on the connection.
    for d in &ds {
        let piece = frames::payload(ws.io.shared_frame(d, d.json()).unwrap());
        assert!(out.windows(piece.len()).any(|w| w == piece));
    }
}

/// A fan-out thread that was behind writes a connection the publications that waited for
/// it itself (`Queue::offer_run`): they go as the connection's task would send them, one
/// message of their pushes joined by its codec (a line each in JSON, each with its length
/// in Protobuf), made once for every connection of the lane.
#[tokio::test]
async fn a_run_the_hub_writes_is_the_message_the_task_would_send() {
    a_run_is_the_tasks_message(HeraldFrames, Encoding::Json, Lane::WEBSOCKET).await;
    a_run_is_the_tasks_message(
        HeraldProtobufFrames,
        Encoding::Protobuf,
        Lane::WEBSOCKET_PROTOBUF,
    )
    .await;
}

async fn a_run_is_the_tasks_message<F: Framing>(framing: F, encoding: Encoding, lane: Lane) {
    let node = Node::with_memory_broker(crate::config::Config::default().validate().unwrap());
    let session = Session::new(&node).speaking(encoding);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let mut ws = WebSocket::open(server, Vec::new(), false, &session, &node, framing);
    let c = ChannelName::new("c").unwrap();
    let run: Vec<Arc<Delivery>> = (1..=3)
        .map(|i| {
            let json = format!(r#"{{"pub":{{"channel":"c","offset":{i},"data":{i}}}}}"#);
            Arc::new(Delivery::new(
                c.clone(),
                Epoch::new("e"),
                i,
                Bytes::from(json),
            ))
        })
        .collect();
    let mut by_task = Vec::new();
    for d in &run {
        let push = d.push(encoding, Form::Plain);
        ws.push(push, Some(d), session.positions(), &mut by_task);
    }
    ws.seal_pending(&mut by_task);
    // The task's text is framed as it is sent.
    let mut sent = Vec::new();
    let binary = encoding.codec().binary();
    frames::write_message(&mut sent, &by_task, false, binary);
    let mut by_hub = Vec::new();
    assert_eq!(ws.io.wire().frame_run(&run, &mut by_hub), 3);
    assert_eq!(by_hub, sent, "{encoding:?}");
    assert_eq!(
        by_hub[0],
        if binary { 0x82 } else { 0x81 },
        "one final frame"
    );
    let kind = crate::queue::RunKind {
        lane,
        compress_from: None,
    };
    assert_eq!(
        ws.io.wire().run_kind(&run),
        Some(kind),
        "made once for every such connection"
    );
}

/// Every idle connection is one task holding this future, and the task's allocation is
/// rounded up to a size class: the 1,280-byte class now, the 1,536-byte one before (see
/// docs/benchmarks.md, "Idle memory under 2.5 KiB"). The task adds 152 bytes to the
/// future (tokio's header, scheduler and trailer, the spawn's wrappers), so the class
/// holds a future of at most 1,128. A tripwire: it is measured on the test build, whose
/// size matched the release one (`-Zprint-type-sizes` on nightly) when this was written.
#[tokio::test]
async fn an_idle_connections_future_stays_within_its_budget() {
    let node = Node::with_memory_broker(crate::config::Config::default().validate().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut sockets = Vec::new();
    for _ in 0..2 {
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        sockets.push((client.unwrap(), accepted.unwrap().0));
    }
    let up = |stream| super::upgrade::Upgraded {
        stream,
        early: Vec::new(),
        node: node.clone(),
        address: None,
        facts: None,
        deflate: false,
    };
    let [(_a, json_side), (_b, protobuf_side)] = <[_; 2]>::try_from(sockets).unwrap();
    let json = std::mem::size_of_val(&run(up(json_side)));
    let protobuf = std::mem::size_of_val(&run_protobuf(up(protobuf_side)));
    eprintln!("connection future: JSON {json} bytes, Protobuf {protobuf}");
    assert!(json <= BUDGET, "JSON: {json} bytes");
    assert!(protobuf <= BUDGET, "Protobuf: {protobuf} bytes");
}

/// The largest future of a connection whose task stays in the 1,280-byte class.
const BUDGET: usize = 1128;

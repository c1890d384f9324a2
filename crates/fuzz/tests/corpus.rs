//! The corpora of the access targets start past the checks they fuzz: a mutated input is
//! one edit away from something Herald accepts, not stopped at the door.

use herald_fuzz::access;
use herald_protocol::ChannelName;
use herald_server::{
    hooks::{parse_answer, ConnectResult},
    token::jwks_key_count,
};

#[tokio::test]
async fn the_token_corpus_has_valid_tokens_of_every_key() {
    let verifier = access::verifier();
    let mut accepted = 0;
    for token in access::tokens() {
        let token = String::from_utf8(token).unwrap();
        let channel = ChannelName::new("room:a").unwrap();
        if verifier.connection(&token).await.is_ok()
            || verifier.channel(&token, "7", &channel).await.is_ok()
            || verifier.channel_named_by(&token, "").await.is_ok()
        {
            accepted += 1;
        }
    }
    // HS256 and HS512 (current secret), the previous secret, RS256 (x2), the anonymous
    // subscription token; not the expired one, alg none, nor EdDSA.
    assert_eq!(accepted, 6);
}

#[test]
fn the_jwks_corpus_gives_keys_and_skips_symmetric_ones() {
    let counts: Vec<_> = access::jwks_documents()
        .iter()
        .map(|d| jwks_key_count(d))
        .collect();
    assert_eq!(counts, vec![Ok(1), Ok(1), Ok(1), Ok(0), Ok(0)]);
}

#[test]
fn the_hook_corpus_has_answers_each_hook_takes() {
    let answers = access::hook_answers();
    let identity = parse_answer::<ConnectResult>(&answers[0])
        .unwrap()
        .identity()
        .unwrap();
    assert_eq!(&*identity.unwrap().user, "7");
}

#[test]
fn the_config_corpus_is_valid() {
    for file in access::config_files() {
        assert!(
            access::read_config(&file).is_ok_and(|c| c.validate().is_ok()),
            "{}",
            String::from_utf8_lossy(&file)
        );
    }
}

/// The server fuzz's signed-in session is answered without an error: its mutations start
/// past the token checks, in the presence and refresh commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_fuzz_signs_in_and_reaches_presence_and_refresh() {
    use futures_util::{SinkExt, StreamExt};
    use herald_fuzz::server;
    use tokio_tungstenite::tungstenite::Message;

    let fuzzed = server::start().await.unwrap();
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/connection/websocket", fuzzed.addr))
            .await
            .unwrap();
    let mut replies = Vec::new();
    for (commands, last) in [
        (server::signed_in_commands(), 4),
        (server::refresh_commands(), 6),
    ] {
        ws.send(Message::text(commands)).await.unwrap();
        while !replies.iter().any(|r: &serde_json::Value| r["id"] == last) {
            let Some(Ok(Message::Text(text))) = ws.next().await else {
                panic!("the connection ended; replies so far: {replies:?}");
            };
            replies.extend(text.lines().filter_map(|l| serde_json::from_str(l).ok()));
        }
    }
    for id in 1..=6 {
        let reply = replies.iter().find(|r| r["id"] == id).unwrap();
        assert!(reply.get("error").is_none(), "{reply}");
    }
    fuzzed.stop().await;
}

/// A panic in a server's task (which Tokio catches) is counted, so a server fuzz that
/// made one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_on_a_server_thread_is_counted() {
    herald_fuzz::quiet_panics();
    let before = herald_fuzz::server_panics().0;
    let task = tokio::spawn(async { panic!("a connection's task failed") });
    assert!(task.await.is_err());
    let (after, last) = herald_fuzz::server_panics();
    assert_eq!(after, before + 1);
    assert!(last.unwrap().contains("a connection's task failed"));
}

#[test]
fn the_node_corpus_has_requests_a_node_answers() {
    use herald_broker_redis::{decode_node_message, NodeMessage};
    let corpus = herald_fuzz::node::corpus();
    let asked = corpus
        .iter()
        .filter(|m| matches!(decode_node_message(m), Some(NodeMessage::Request { .. })))
        .count();
    assert_eq!(asked, 2, "two requests another node sends");
    assert!(corpus
        .iter()
        .any(|m| matches!(decode_node_message(m), Some(NodeMessage::Probe(Some(17))))));
}

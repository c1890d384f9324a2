//! The session alone: panics contained, one encoding shared, batches, gaps.

use bytes::Bytes;
use herald_protocol::ChannelName;

use super::*;
use crate::{config::Config, queue::Delivery};

fn node() -> Arc<Node> {
    Node::with_memory_broker(Config::default().validate().unwrap())
}

/// A broker whose every call panics: a stand-in for any defect below a command.
struct Panicking;

#[async_trait::async_trait]
impl herald_broker::Broker for Panicking {
    async fn publish(
        &self,
        _: &ChannelName,
        _: Bytes,
        _: herald_broker::StreamPolicy,
    ) -> Result<herald_protocol::StreamPosition, herald_broker::BrokerError> {
        panic!("defect under publish")
    }
    async fn publish_once(
        &self,
        _: &ChannelName,
        _: Bytes,
        _: herald_broker::StreamPolicy,
        _: &str,
        _: std::time::Duration,
    ) -> Result<(herald_protocol::StreamPosition, bool), herald_broker::BrokerError> {
        panic!("defect under publish")
    }
    async fn history(
        &self,
        _: &ChannelName,
        _: herald_broker::HistoryQuery,
    ) -> Result<herald_broker::History, herald_broker::BrokerError> {
        panic!("defect under history")
    }
    async fn remove_history(&self, _: &ChannelName) -> Result<(), herald_broker::BrokerError> {
        panic!("defect")
    }
    async fn subscribe(&self, _: &ChannelName) -> Result<(), herald_broker::BrokerError> {
        Ok(())
    }
    async fn unsubscribe(&self, _: &ChannelName) -> Result<(), herald_broker::BrokerError> {
        Ok(())
    }
    fn channel_count(&self) -> usize {
        0
    }
}

#[tokio::test]
async fn a_panic_under_a_command_ends_the_connection_with_3006_and_releases_it() {
    let node = Node::new(Config::default().validate().unwrap(), |_| {
        Arc::new(Panicking)
    });
    let mut s = Session::new(&node);
    assert_eq!(node.connection_count(), 1);
    let mut out = Vec::new();
    let err = s
        .handle_frame(br#"{"id":1,"history":{"channel":"chat:x"}}"#, &mut out)
        .await
        .unwrap_err();
    assert_eq!(err.code, DisconnectCode::ServerError);
    drop(s);
    assert_eq!(node.connection_count(), 0);
}

#[tokio::test]
async fn one_encoding_is_shared_by_every_subscriber() {
    let node = node();
    let (mut a, mut b) = (Session::new(&node), Session::new(&node));
    let mut out = Vec::new();
    a.handle_frame(br#"{"id":1,"subscribe":{"channel":"c"}}"#, &mut out)
        .await
        .unwrap();
    b.handle_frame(br#"{"id":1,"subscribe":{"channel":"c"}}"#, &mut out)
        .await
        .unwrap();
    let channel = ChannelName::new("c").unwrap();
    publish::publish(&node, &channel, Bytes::from("1"), None)
        .await
        .unwrap();
    let (mut da, mut db) = (Vec::new(), Vec::new());
    a.queue().take(usize::MAX, &mut da).unwrap();
    b.queue().take(usize::MAX, &mut db).unwrap();
    assert!(
        Arc::ptr_eq(&da[0], &db[0]),
        "both queues hold the same encoded publication"
    );
}

#[tokio::test]
async fn queued_publications_leave_as_one_batch() {
    let node = node();
    let mut s = Session::new(&node);
    let mut out = Vec::new();
    s.handle_frame(br#"{"id":1,"subscribe":{"channel":"c"}}"#, &mut out)
        .await
        .unwrap();
    let channel = ChannelName::new("c").unwrap();
    for i in 0..10 {
        publish::publish(&node, &channel, Bytes::from(i.to_string()), None)
            .await
            .unwrap();
    }
    let mut frame = Vec::new();
    s.write_deliveries(&mut frame, usize::MAX).unwrap();
    let lines: Vec<serde_json::Value> = frame
        .split(|b| *b == b'\n')
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10);
    assert_eq!(lines[9]["pub"]["offset"], 10);
}

#[tokio::test]
async fn a_missing_offset_ends_the_session_instead_of_skipping() {
    let node = node();
    let mut s = Session::new(&node);
    let mut out = Vec::new();
    s.handle_frame(br#"{"id":1,"subscribe":{"channel":"c"}}"#, &mut out)
        .await
        .unwrap();
    let channel = ChannelName::new("c").unwrap();
    let epoch = node
        .broker
        .history(&channel, Default::default())
        .await
        .unwrap()
        .position
        .epoch;
    let skipped = Arc::new(Delivery::new(channel.clone(), epoch, 2, Bytes::from("{}")));
    s.queue()
        .offer(&skipped, &crate::queue::Position::default());
    let err = s.write_deliveries(&mut Vec::new(), usize::MAX).unwrap_err();
    assert_eq!(err.code, DisconnectCode::InsufficientState);
}

//! What every decoder target is, and the runtime the async ones block on.

/// A decoder: takes one input, must not panic.
pub type Decoder = Box<dyn FnMut(&[u8])>;

/// A runtime on the caller's thread, for decoders that are async.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Reads every channel's history from its start, as a resuming client would: what a
/// damaged store serves (or refuses) is decided there.
pub(crate) async fn read_every(
    broker: &herald_broker::DurableBroker,
    channels: &[herald_protocol::ChannelName],
) {
    for channel in channels {
        let query = herald_broker::HistoryQuery {
            since: Some(herald_protocol::Since {
                offset: 0,
                epoch: None,
            }),
            limit: 100,
            max_bytes: None,
        };
        let _ = herald_broker::Broker::history(broker, channel, query).await;
    }
}

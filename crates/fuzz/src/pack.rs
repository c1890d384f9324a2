//! A packed file of the durable store (`herald.pack.N`), read without its index: the
//! store rebuilds the index from it at open (issue #57), which must open whatever the
//! bytes, and serve only what passes its checks.

use std::sync::Arc;

use herald_broker::{wal, DurableBroker, SyncPolicy};
use herald_protocol::ChannelName;

use crate::decoder::{runtime, Decoder};

/// The packed file's magic and frame (length and CRC-32 of each entry), as
/// `durable/pack.rs` writes them.
const MAGIC: &[u8; 8] = b"HRLDPCK2";
const CHANNELS: [&str; 2] = ["chat:lobby", "news"];

fn framed(entries: &[&[u8]]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    for e in entries {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(e).to_le_bytes());
        out.extend_from_slice(e);
    }
    out
}

/// A packed file of a few publications of two channels.
pub fn corpus() -> Vec<Vec<u8>> {
    let mut entries = Vec::new();
    for channel in CHANNELS {
        for offset in 1..=3u64 {
            let mut e = Vec::new();
            let data = format!("{{\"n\":{offset}}}");
            wal::encode_publish(
                &mut e,
                channel,
                "8f3a2c1d",
                offset,
                1_790_000_000_000,
                data.as_bytes(),
            );
            entries.push(e);
        }
    }
    let refs: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
    vec![framed(&refs)]
}

/// Writes each input as the only packed file of a store without an index, opens it (the
/// index is rebuilt: an open that fails is a finding) and reads every channel; then the
/// same with the input's pieces framed under valid CRCs, so they reach the entry decoder.
pub fn decoder() -> Decoder {
    let rt = runtime();
    let channels: Vec<ChannelName> = CHANNELS
        .iter()
        .map(|c| ChannelName::new(c).expect("valid"))
        .collect();
    let open = move |pack: &[u8]| {
        let Ok(dir) = tempfile::tempdir() else {
            return;
        };
        if std::fs::write(dir.path().join("herald.pack.0000000000"), pack).is_err() {
            return;
        }
        rt.block_on(async {
            let sink = Arc::new(herald_broker::conformance::Recorder::default());
            let broker = DurableBroker::open(dir.path(), SyncPolicy::None, sink)
                .expect("a store whose index is missing opens: it is rebuilt");
            crate::decoder::read_every(&broker, &channels).await;
        });
    };
    Box::new(move |input| {
        open(input);
        let pieces: Vec<&[u8]> = input.split(|b| *b == 0xfe).collect();
        open(&framed(&pieces));
    })
}

//! What a client reads of each publication: its offset (repeats and gaps), its stamp
//! (latency), and on a subscription with deltas the data the next delta applies to.

use std::collections::HashMap;

use serde::Deserialize;

use super::now_ns;
use crate::record::Recorder;

/// The `"t"` (publish time, ns) and `"seq"` of a publication's data, wherever it sits in
/// the text: works for any server's framing.
pub fn stamp(text: &str) -> Option<(u64, Option<u64>)> {
    // The data may come inside a JSON string (Pusher's events): `\"t\":` then.
    let number_after = |key: &str, escaped: &str| -> Option<u64> {
        let at = match text.find(key) {
            Some(at) => at + key.len(),
            None => text.find(escaped)? + escaped.len(),
        };
        let digits = text[at..].trim_start_matches(' ');
        let end = digits
            .bytes()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(digits.len());
        digits[..end].parse().ok()
    };
    Some((
        number_after(r#""t":"#, r#"\"t\":"#)?,
        number_after(r#""seq":"#, r#"\"seq\":"#),
    ))
}

/// The stamps of every publication in one message, a line each: a server may join
/// several pushes in one WebSocket message (Centrifugo streams them a line each), and
/// each is a delivery.
pub fn stamps(message: &str) -> impl Iterator<Item = (u64, Option<u64>)> + '_ {
    message.split('\n').filter_map(stamp)
}

/// What one client knows of its channel: the last offset, to count repeats and gaps; and
/// on a subscription with deltas, the last publication's data as text.
#[derive(Default)]
pub(super) struct Positions {
    pub(super) last: HashMap<String, u64>,
    base: HashMap<String, Vec<u8>>,
}

#[derive(Deserialize)]
struct PushLine {
    #[serde(rename = "pub")]
    publication: Option<PubBody>,
}

#[derive(Deserialize)]
struct PubBody {
    channel: String,
    offset: u64,
    #[serde(default)]
    full: Option<String>,
    #[serde(default)]
    delta: Option<String>,
}

impl Positions {
    /// Records a Herald push line; returns true when it was a publication.
    pub(super) fn push(&mut self, line: &str, rec: &Recorder) -> bool {
        let Ok(PushLine {
            publication: Some(p),
        }) = serde_json::from_str::<PushLine>(line)
        else {
            return false;
        };
        // A delta subscription's data: whole as text, or a delta from the last one.
        let data = match (p.full, p.delta) {
            (Some(full), _) => Some(full.into_bytes()),
            (None, Some(delta)) => {
                let base = self.base.get(&p.channel).map_or(&[][..], Vec::as_slice);
                Some(fossil_delta::apply(base, delta.as_bytes()).unwrap_or_default())
            }
            (None, None) => None,
        };
        let stamped = match &data {
            Some(text) => stamp(&String::from_utf8_lossy(text)),
            None => stamp(line),
        };
        if let Some(text) = data {
            self.base.insert(p.channel.clone(), text);
        }
        let last = self.last.entry(p.channel).or_insert(0);
        if *last != 0 && p.offset <= *last {
            rec.duplicate();
            return true;
        }
        if *last != 0 && p.offset > *last + 1 {
            rec.gap(p.offset - *last - 1);
        }
        *last = p.offset;
        if let Some((t, seq)) = stamped {
            rec.received(now_ns().saturating_sub(t), seq);
        } else {
            rec.received_unstamped();
        }
        true
    }

    pub(super) fn cursor(&self, epochs: &HashMap<String, String>) -> String {
        self.last
            .iter()
            .filter_map(|(c, o)| epochs.get(c).map(|e| format!("{c};{e};{o}")))
            .collect::<Vec<_>>()
            .join("|")
    }
}

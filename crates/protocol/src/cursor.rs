//! The cursor: every channel's position in one string, for transports where the client
//! holds no per-channel state of its own (SSE's `Last-Event-ID`, poll and long-poll
//! requests). Any transport accepts any transport's cursor.
//!
//! Grammar: entries separated by `|`, each `CHANNEL;EPOCH;OFFSET`, e.g.
//! `chat:lobby;k3x9ab2c;42|news;zz81;7`. Neither `|` nor `;` can occur in a channel
//! name or an epoch, and every character is safe in an SSE `id:` line. The epoch `*`
//! accepts whatever epoch the channel has (for clients that only know an offset).

use std::fmt::Write;

use crate::{ChannelName, Epoch, Since};

/// Longest cursor accepted, in bytes.
pub const MAX_CURSOR_LEN: usize = 16 * 1024;

/// A decoded cursor: a position per channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Channels and their positions, in the order given.
    pub entries: Vec<(ChannelName, Since)>,
}

/// Why a string is not a cursor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cursor: {0}")]
pub struct CursorError(String);

impl Cursor {
    /// Parses a cursor; the empty string is the empty cursor.
    pub fn parse(text: &str) -> Result<Self, CursorError> {
        if text.len() > MAX_CURSOR_LEN {
            return Err(CursorError(format!("longer than {MAX_CURSOR_LEN} bytes")));
        }
        let mut entries = Vec::new();
        for entry in text.split('|').filter(|e| !e.is_empty()) {
            let mut parts = entry.split(';');
            let (Some(channel), Some(epoch), Some(offset), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(CursorError(format!(
                    "entry {entry:?} is not CHANNEL;EPOCH;OFFSET"
                )));
            };
            let channel = ChannelName::new(channel).map_err(|e| CursorError(e.to_string()))?;
            let offset = offset
                .parse()
                .map_err(|_| CursorError(format!("offset {offset:?} is not a number")))?;
            if epoch.is_empty()
                || !epoch
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'|' && b != b';')
            {
                return Err(CursorError(format!("epoch {epoch:?} is not valid")));
            }
            let epoch = (epoch != "*").then(|| Epoch::new(epoch));
            entries.push((channel, Since { offset, epoch }));
        }
        Ok(Self { entries })
    }

    /// The position of one channel, if the cursor has it.
    pub fn get(&self, channel: &ChannelName) -> Option<&Since> {
        self.entries
            .iter()
            .find(|(c, _)| c == channel)
            .map(|(_, s)| s)
    }
}

/// Writes one cursor entry (callers join entries with `|`).
pub fn write_entry(out: &mut String, channel: &ChannelName, epoch: &Epoch, offset: u64) {
    // Written piece by piece: a long-poll answer's cursor is made once per answer, where
    // the formatting machinery cost more than the rest of the cursor together.
    if !out.is_empty() {
        out.push('|');
    }
    out.push_str(channel.as_str());
    out.push(';');
    out.push_str(epoch.as_str());
    out.push(';');
    out.push_str(itoa::Buffer::new().format(offset));
}

/// Writes one cursor entry for a position that may not know its epoch (`*`).
pub fn write_since(out: &mut String, channel: &ChannelName, since: &Since) {
    if !out.is_empty() {
        out.push('|');
    }
    let epoch = since.epoch.as_ref().map_or("*", |e| e.as_str());
    let _ = write!(out, "{channel};{epoch};{}", since.offset);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut text = String::new();
        write_entry(
            &mut text,
            &ChannelName::new("chat:a,b").unwrap(),
            &Epoch::new("e1"),
            4,
        );
        write_entry(
            &mut text,
            &ChannelName::new("n").unwrap(),
            &Epoch::new("e2"),
            0,
        );
        assert_eq!(text, "chat:a,b;e1;4|n;e2;0");
        let c = Cursor::parse(&text).unwrap();
        assert_eq!(c.entries.len(), 2);
        assert_eq!(c.get(&ChannelName::new("n").unwrap()).unwrap().offset, 0);
        assert_eq!(Cursor::parse("").unwrap(), Cursor::default());
        assert_eq!(
            Cursor::parse("x;*;3").unwrap().entries[0].1,
            Since {
                offset: 3,
                epoch: None
            }
        );
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["a;b", "a;b;c", "a b;e;1", "a;;1", "a;e;1;2", "a;e\n;1"] {
            assert!(Cursor::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Cursor::parse(&"a;e;1|".repeat(5000)).is_err());
    }
}

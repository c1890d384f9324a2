//! How a stream's pushes are wrapped on the wire: SSE events, NDJSON lines, `<script>`
//! chunks of a forever frame, or Protobuf messages as they are (each carries its length);
//! and what keeps those scripts from escaping their element.

use std::time::Duration;

use crate::session::Positions;

/// How pushes are wrapped on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`: `id: CURSOR` and `data: PUSH` per event.
    Sse,
    /// `application/x-ndjson`: one push per line.
    Ndjson,
    /// `text/html`: `<script>parent.CALLBACK(PUSH);</script>` per push.
    Iframe {
        /// The page's function, a plain JavaScript identifier.
        callback: String,
    },
    /// `application/x-protobuf`: Herald's Protobuf messages, length-delimited, one after
    /// another.
    Protobuf,
}

/// Bytes before the first push of a forever frame: old browsers render nothing (and run no
/// script) until they have seen this much of a document.
pub const IFRAME_PADDING: usize = 2048;

impl Framing {
    pub(super) fn content_type(&self) -> &'static str {
        match self {
            Framing::Sse => "text/event-stream",
            Framing::Ndjson => "application/x-ndjson",
            Framing::Iframe { .. } => "text/html; charset=utf-8",
            Framing::Protobuf => "application/x-protobuf",
        }
    }

    /// The codec of its pushes: Herald's JSON, but for Protobuf's framing.
    pub fn encoding(&self) -> herald_protocol::Encoding {
        match self {
            Framing::Protobuf => herald_protocol::Encoding::Protobuf,
            _ => herald_protocol::Encoding::Json,
        }
    }

    /// What a response starts with.
    pub fn prelude(&self, sse_retry: Duration, out: &mut Vec<u8>) {
        match self {
            Framing::Sse => {
                out.extend_from_slice(format!("retry: {}\n\n", sse_retry.as_millis()).as_bytes())
            }
            Framing::Ndjson | Framing::Protobuf => {}
            Framing::Iframe { .. } => {
                out.extend_from_slice(b"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>herald</title></head><body>\n<!--");
                out.resize(out.len() + IFRAME_PADDING, b' ');
                out.extend_from_slice(b"-->\n");
            }
        }
    }

    /// One push (a JSON object without line breaks, or a length-delimited Protobuf
    /// message); `cursor` becomes the SSE event id.
    pub fn push(&self, json: &[u8], cursor: Option<&str>, out: &mut Vec<u8>) {
        match self {
            Framing::Sse => {
                if let Some(cursor) = cursor {
                    out.extend_from_slice(b"id: ");
                    out.extend_from_slice(cursor.as_bytes());
                    out.push(b'\n');
                }
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(json);
                out.extend_from_slice(b"\n\n");
            }
            Framing::Ndjson => {
                out.extend_from_slice(json);
                out.push(b'\n');
            }
            Framing::Protobuf => out.extend_from_slice(json),
            Framing::Iframe { callback } => {
                out.extend_from_slice(b"<script>parent.");
                out.extend_from_slice(callback.as_bytes());
                out.push(b'(');
                script_safe(json, out);
                out.extend_from_slice(b");</script>\n");
            }
        }
    }

    /// One push with the session's positions right after it. Only SSE carries them (as the
    /// event id), so the cursor string is built only there: this runs once per delivery.
    pub fn push_at(&self, json: &[u8], at: Positions<'_>, out: &mut Vec<u8>) {
        match self {
            Framing::Sse => self.push(json, Some(&at.cursor()), out),
            _ => self.push(json, None, out),
        }
    }

    /// Keeps proxies and the client's liveness check from giving up on a quiet stream: a
    /// `ping` push on every framing, which the page sees (an SSE comment would reach no
    /// `EventSource` handler) and without an SSE `id`, so the resume position stays.
    pub fn keepalive(&self, out: &mut Vec<u8>) {
        let ping = self.encoding().codec().push(&herald_protocol::Push::Ping);
        self.push(&ping, None, out);
    }

    /// What a response ends with.
    pub fn epilogue(&self, out: &mut Vec<u8>) {
        if let Framing::Iframe { .. } = self {
            out.extend_from_slice(b"</body></html>\n");
        }
    }
}

/// Copies JSON so that it can stand inside a `<script>` element: `<`, `>` and `&` only
/// occur inside JSON strings, where `\u003c`-style escapes mean the same characters, so no
/// payload can close the script (`</script>`) or open a comment (`<!--`). U+2028 and U+2029
/// are escaped too, for engines older than ES2019.
pub fn script_safe(json: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'<' => out.extend_from_slice(b"\\u003c"),
            b'>' => out.extend_from_slice(b"\\u003e"),
            b'&' => out.extend_from_slice(b"\\u0026"),
            0xE2 if json.get(i + 1) == Some(&0x80)
                && matches!(json.get(i + 2), Some(0xA8 | 0xA9)) =>
            {
                out.extend_from_slice(if json[i + 2] == 0xA8 {
                    b"\\u2028"
                } else {
                    b"\\u2029"
                });
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
}

/// A JavaScript identifier (no dots, no brackets): the only thing a callback may be.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        && name.len() <= 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_carry_the_cursor_as_id() {
        let mut out = Vec::new();
        Framing::Sse.push(b"{\"pub\":{}}", Some("a;e;1"), &mut out);
        assert_eq!(out, b"id: a;e;1\ndata: {\"pub\":{}}\n\n");
        out.clear();
        Framing::Sse.keepalive(&mut out);
        assert_eq!(out, b"data: {\"ping\":{}}\n\n");
    }

    #[test]
    fn script_safe_output_cannot_leave_the_script_element() {
        let hostile = "{\"t\":\"</script><script>alert(1)</script><!-- & \u{2028}\"}";
        let mut out = Vec::new();
        script_safe(hostile.as_bytes(), &mut out);
        let text = String::from_utf8(out).unwrap();
        for bad in ["</script", "<!--", "<", ">", "&", "\u{2028}"] {
            assert!(!text.contains(bad), "{bad:?} in {text}");
        }
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back["t"],
            "</script><script>alert(1)</script><!-- & \u{2028}"
        );
    }

    #[test]
    fn callbacks_are_plain_identifiers() {
        for ok in ["cb", "_x", "$h1", "onHerald"] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in ["", "1x", "a.b", "alert(1)", "x;y", "a-b", "é"] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn the_forever_frame_starts_with_padding() {
        let mut out = Vec::new();
        Framing::Iframe {
            callback: "cb".into(),
        }
        .prelude(Duration::ZERO, &mut out);
        assert!(out.len() > IFRAME_PADDING);
        assert!(out.starts_with(b"<!DOCTYPE html>"));
    }
}

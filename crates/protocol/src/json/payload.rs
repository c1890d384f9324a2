//! What a stored payload may be: validated JSON on one line, read back from storage.

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::Publication;

/// Deepest nesting of arrays and objects a payload may have: the depth serde_json (and so
/// Herald's own clients) can read back, far beyond what any message needs.
pub const MAX_PAYLOAD_DEPTH: usize = 128;

/// A validated JSON value as a stored payload. Raw line breaks (legal JSON whitespace) are
/// removed, because every framing puts one push per line. Inside a valid JSON string a
/// line break is always escaped, so every raw CR or LF byte is whitespace between tokens
/// and dropping it changes nothing else: keys keep their order and numbers their digits.
/// Refuses values nested deeper than [`MAX_PAYLOAD_DEPTH`].
pub fn payload(data: &RawValue) -> Result<Bytes, String> {
    let text = data.get().as_bytes();
    // One pass that only stops at bytes that matter (a table says which): between them it
    // is a tight loop, and inside strings only quotes and backslashes matter. Stepping
    // through every byte with a state machine made this check a quarter of the server's
    // CPU for 130 KB answers from a backend.
    let mut depth = 0usize;
    let mut at = 0;
    while let Some(i) = text[at..].iter().position(|b| STRUCTURAL[*b as usize]) {
        at += i;
        match text[at] {
            b'"' => {
                at += 1;
                while let Some(i) = text[at..].iter().position(|b| *b == b'"' || *b == b'\\') {
                    at += i + 1;
                    if text[at - 1] == b'"' {
                        break;
                    }
                    // Skip the escaped byte.
                    at += 1;
                    if at >= text.len() {
                        break;
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_PAYLOAD_DEPTH {
                    return Err(format!(
                        "data is nested deeper than {MAX_PAYLOAD_DEPTH} levels"
                    ));
                }
                at += 1;
            }
            _ => {
                depth = depth.saturating_sub(1);
                at += 1;
            }
        }
        if at >= text.len() {
            break;
        }
    }
    // A raw line break cannot be inside a valid string, so any is whitespace.
    if memchr::memchr2(b'\n', b'\r', text).is_some() {
        let kept: Vec<u8> = text
            .iter()
            .copied()
            .filter(|b| *b != b'\n' && *b != b'\r')
            .collect();
        return Ok(Bytes::from(kept));
    }
    Ok(Bytes::copy_from_slice(text))
}

/// The bytes [`payload`] stops at outside strings.
static STRUCTURAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'"' as usize] = true;
    t[b'[' as usize] = true;
    t[b'{' as usize] = true;
    t[b']' as usize] = true;
    t[b'}' as usize] = true;
    t
};

/// Publication data read back from a store others can write (a shared Redis), checked as
/// a client's would be: valid UTF-8 JSON, nested at most [`MAX_PAYLOAD_DEPTH`] deep,
/// without raw line breaks. Whatever passes is safe in every framing (a line per push, an
/// SSE `data:` line, a forever frame's `<script>`).
pub fn stored_payload(data: &[u8]) -> Result<Bytes, String> {
    let raw: &RawValue =
        serde_json::from_slice(data).map_err(|e| format!("data is not JSON: {e}"))?;
    payload(raw)
}

/// A publication record (see [`Publication::record`]) read back from a store others can
/// write, checked as [`stored_payload`] checks data; its sender must be a JSON object.
pub fn stored_record(record: &[u8]) -> Result<Bytes, String> {
    let key = match crate::position::conflation_key(record) {
        Some(key) => match std::str::from_utf8(key) {
            Ok(key) if crate::position::valid_conflation_key(key) => Some(key),
            _ => return Err("a publication's conflation key is not one".into()),
        },
        None => None,
    };
    let checked = stored_parts(record)?;
    Ok(match key {
        None => checked,
        Some(key) => {
            let p = Publication {
                offset: 0,
                record: checked,
            };
            let from = p.from();
            Publication::keyed_record(Bytes::copy_from_slice(p.data()), from, Some(key))
        }
    })
}

/// [`stored_record`] past the conflation key: the sender and the payload.
fn stored_parts(record: &[u8]) -> Result<Bytes, String> {
    match crate::position::split_record(record) {
        (None, data) => stored_payload(data),
        (Some(from), data) => {
            let from = stored_payload(from)?;
            if from.first() != Some(&b'{') {
                return Err("a publication's sender is not a JSON object".into());
            }
            Ok(Publication::record(stored_payload(data)?, Some(&from)))
        }
    }
}

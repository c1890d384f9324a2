//! phoenix.js's `authToken` option: a token kept out of URLs. On the WebSocket it comes
//! as a second `Sec-WebSocket-Protocol` entry, `base64url.bearer.phx.` followed by the
//! token in base64 without padding (beside `phoenix`, which the server must choose, or
//! the browser drops the connection: "Server sent no subprotocol"); on the long-poll as
//! the `X-Phoenix-AuthToken` header. It is the connection token, as the socket's `token`
//! param is, and is preferred to it when both come.

use axum::http::{header, HeaderMap};
use base64::{
    alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
    Engine,
};

/// The subprotocol phoenix.js offers beside its token, and the one the server chooses.
pub const SUBPROTOCOL: &str = "phoenix";

const PREFIX: &str = "base64url.bearer.phx.";

/// The long-poll's header.
const HEADER: &str = "x-phoenix-authtoken";

/// The token a WebSocket upgrade carries in its subprotocols: `Some(Err)` when the entry
/// is there but is not a token (not base64, not text).
pub fn from_subprotocols(headers: &HeaderMap) -> Option<Result<String, &'static str>> {
    let entry = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| p.strip_prefix(PREFIX))?;
    Some(decode(entry))
}

/// The token a long-poll request carries in its header.
pub fn from_header(headers: &HeaderMap) -> Option<&str> {
    headers.get(HEADER).and_then(|v| v.to_str().ok())
}

/// phoenix.js writes the token with `btoa` (the standard alphabet) and strips the
/// padding; the name says base64url, so both alphabets are read, padded or not.
fn decode(entry: &str) -> Result<String, &'static str> {
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let bytes = if entry.contains(['-', '_']) {
        GeneralPurpose::new(&alphabet::URL_SAFE, config).decode(entry)
    } else {
        GeneralPurpose::new(&alphabet::STANDARD, config).decode(entry)
    };
    let bytes = bytes.map_err(|_| "the authToken subprotocol entry is not base64")?;
    String::from_utf8(bytes).map_err(|_| "the authToken is not text")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, value.parse().unwrap());
        h
    }

    #[test]
    fn reads_the_token_as_phoenix_js_writes_it() {
        // btoa("eyJ.a?b>") without its padding: the standard alphabet's `+` and `/`.
        let token = "eyJhbGciOi.eyJzdWIi.sig??>>";
        let b64 = base64::engine::general_purpose::STANDARD.encode(token);
        assert!(b64.contains('/') || b64.contains('+'), "{b64}");
        let entry = format!("phoenix, {PREFIX}{}", b64.trim_end_matches('='));
        assert_eq!(from_subprotocols(&offered(&entry)), Some(Ok(token.into())));
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
        let entry = format!("phoenix, {PREFIX}{url}");
        assert_eq!(from_subprotocols(&offered(&entry)), Some(Ok(token.into())));
        assert_eq!(from_subprotocols(&offered("phoenix")), None);
        assert!(matches!(
            from_subprotocols(&offered(&format!("{PREFIX}!!"))),
            Some(Err(_))
        ));
    }
}

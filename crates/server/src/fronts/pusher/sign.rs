//! Pusher's signatures: HMAC-SHA256 with the app's secret, written in lowercase hex.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The signature of `text` with `secret`, in lowercase hex.
#[cfg(test)]
pub fn sign(secret: &str, text: &str) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(text.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Whether `signature` (hex) signs `text` with `secret`, compared in constant time.
pub fn verify(secret: &str, text: &str, signature: &str) -> bool {
    let Some(bytes) = unhex(signature) else {
        return false;
    };
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(text.as_bytes());
    mac.verify_slice(&bytes).is_ok()
}

/// The MD5 of `body`, in lowercase hex (the API's `body_md5`).
pub fn md5(body: &[u8]) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(body))
}

/// The bytes of a signature in hex, if it is one (at most 64 bytes: SHA-256's are 32).
fn unhex(text: &str) -> Option<Vec<u8>> {
    (text.len() <= 128)
        .then(|| hex::decode(text).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_as_pushers_documentation_shows() {
        // From Pusher's "authorizing connections" documentation.
        let signature = sign("7ad3773142a6692b25b8", "1234.1234:private-foobar");
        assert_eq!(
            signature,
            "58df8b0c36d6982b82c3ecf6b4662e34fe8c25bba48f5369f135bf843651c3a4"
        );
        assert!(verify(
            "7ad3773142a6692b25b8",
            "1234.1234:private-foobar",
            &signature
        ));
        assert!(!verify(
            "7ad3773142a6692b25b8",
            "1234.1234:private-foobaz",
            &signature
        ));
        assert!(!verify(
            "7ad3773142a6692b25b8",
            "1234.1234:private-foobar",
            "zz"
        ));
        assert_eq!(md5(b""), "d41d8cd98f00b204e9800998ecf8427e");
    }
}

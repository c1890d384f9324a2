use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;

use super::*;
use crate::config::PreviousKey;

/// The sender shown with publications: the user escaped, `info` on one line, bounded.
#[test]
fn info_is_checked_once_and_shown_on_one_line() {
    let identity = |info: &str| {
        let raw = serde_json::from_str::<Box<RawValue>>(info).unwrap();
        Identity::new("a\"b".into(), Some(raw), &[], vec![], vec![], None)
    };
    let id = identity("{\"name\":\n  \"Ann\"\r\n}").unwrap();
    // Line breaks go (as from publication data); other whitespace stays.
    assert_eq!(&id.from[..], br#"{"user":"a\"b","info":{"name":  "Ann"}}"#);
    assert_eq!(&id.info.unwrap()[..], br#"{"name":  "Ann"}"#);
    let big = format!("\"{}\"", "x".repeat(MAX_INFO_BYTES));
    assert!(identity(&big).unwrap_err().contains("larger than"));
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert!(identity(&deep).unwrap_err().starts_with("info:"));
    assert_eq!(
        &sender("7", None, Some(b"[1]"))[..],
        br#"{"user":"7","channel_info":[1]}"#
    );
    let plain = Identity::new("7".into(), None, &[], vec![], vec![], None).unwrap();
    assert_eq!(&plain.from[..], br#"{"user":"7"}"#);
}

const NEW: &str = "the-new-secret-the-new-secret-the-new";
const OLD: &str = "the-old-secret-the-old-secret-the-old";

fn hs(secret: &str) -> String {
    let claims = json!({ "sub": "42", "exp": unix_now() + 60 });
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

fn rotating(until: &str) -> Verifier {
    let mut auth = AuthConfig::default();
    auth.hmac_secret = Some(NEW.into());
    auth.previous = Some(PreviousKey {
        hmac_secret: Some(OLD.into()),
        public_key: None,
        until: until.into(),
    });
    auth.check().unwrap();
    Verifier::new(&auth).unwrap()
}

/// A subscription token's `info` is checked as a connection token's: kept on one line,
/// refused when too large.
#[tokio::test]
async fn a_subscription_tokens_info_is_checked() {
    let verifier = rotating("2999-01-01T00:00:00Z");
    let sub = |info: serde_json::Value| {
        let claims = json!({ "sub": "42", "channel": "doc:1", "info": info });
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(NEW.as_bytes()),
        )
        .unwrap()
    };
    let grant = verifier
        .channel_named_by(&sub(json!({ "role": "host" })), "42")
        .await
        .unwrap();
    assert_eq!(grant.info.as_deref(), Some(&br#"{"role":"host"}"#[..]));
    let big = json!("x".repeat(MAX_INFO_BYTES));
    match verifier.channel_named_by(&sub(big), "42").await {
        Err(TokenError::Invalid(why)) => assert!(why.contains("larger than"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_previous_key_is_accepted_until_its_time() {
    let during = rotating("2999-01-01T00:00:00Z");
    assert_eq!(&*during.connection(&hs(OLD)).await.unwrap().user, "42");
    assert_eq!(&*during.connection(&hs(NEW)).await.unwrap().user, "42");
    let after = rotating("2020-01-01T00:00:00Z");
    assert!(matches!(
        after.connection(&hs(OLD)).await,
        Err(TokenError::Invalid(_))
    ));
    assert!(after.connection(&hs(NEW)).await.is_ok());
}

#[tokio::test]
async fn ed25519_keys_verify_eddsa_tokens_only() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut auth = AuthConfig::default();
    auth.public_key = Some(dir.join("ed.pub.pem"));
    let verifier = Verifier::new(&auth).unwrap();
    let private = std::fs::read(dir.join("ed.key.pem")).unwrap();
    let claims = json!({ "sub": "7", "info": { "name": "Ada" } });
    let token = jsonwebtoken::encode(
        &Header::new(Algorithm::EdDSA),
        &claims,
        &EncodingKey::from_ed_pem(&private).unwrap(),
    )
    .unwrap();
    let identity = verifier.connection(&token).await.unwrap();
    assert_eq!(&identity.info.unwrap()[..], br#"{"name":"Ada"}"#);
    assert!(verifier.connection(&hs(NEW)).await.is_err());
    let long = "x".repeat(MAX_TOKEN_BYTES + 1);
    assert!(verifier.connection(&long).await.is_err());
}

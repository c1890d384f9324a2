//! The targets of what guards access: tokens (every key kind `[auth]` takes, connection
//! and subscription tokens), JWKS documents, backend hooks' answers, and configuration
//! files. Their corpora are valid examples made here (tokens signed with the test keys of
//! `crates/server/tests/fixtures`), so mutations start past the signature check.

use std::time::{SystemTime, UNIX_EPOCH};

use herald_server::{
    config::{AuthConfig, PreviousKey},
    hooks::{self, ConnectResult, DataResult, RefreshResult, SubscribeResult},
    token::Verifier,
    Config,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

use crate::decoder::{runtime, Decoder};

/// The current HMAC secret of the fuzzed `[auth]` (the server fuzz's too).
pub const SECRET: &str = "fuzz-secret-that-is-long-enough-0123456789";
/// The previous one, still accepted.
const PREVIOUS: &str = "fuzz-previous-secret-long-enough-0123456789";

const RSA_PRIVATE: &[u8] = include_bytes!("../../server/tests/fixtures/rsa1.key.pem");
const RSA_PUBLIC: &[u8] = include_bytes!("../../server/tests/fixtures/rsa1.pub.pem");
const ED_PRIVATE: &[u8] = include_bytes!("../../server/tests/fixtures/ed.key.pem");

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn sign(alg: Algorithm, key: &EncodingKey, claims: &serde_json::Value) -> Vec<u8> {
    jsonwebtoken::encode(&Header::new(alg), claims, key)
        .expect("the fixtures sign")
        .into_bytes()
}

/// A connection token for user `7` (HS256, an hour), granted `room:*` and `chat:*`.
pub fn connection_token() -> String {
    let claims = json!({
        "sub": "7", "exp": now() + 3600, "info": {"name": "Ada"},
        "subscribe": ["room:*", "chat:*"], "publish": ["room:*", "chat:*"],
    });
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    String::from_utf8(sign(Algorithm::HS256, &key, &claims)).expect("a token is text")
}

/// A subscription token of user `7` for `channel` (HS256, an hour).
pub fn subscription_token(channel: &str) -> String {
    let claims =
        json!({ "sub": "7", "exp": now() + 3600, "channel": channel, "info": {"seat": 1} });
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    String::from_utf8(sign(Algorithm::HS256, &key, &claims)).expect("a token is text")
}

/// Valid tokens of every kind the verifier takes.
pub fn tokens() -> Vec<Vec<u8>> {
    let hs = EncodingKey::from_secret(SECRET.as_bytes());
    let previous = EncodingKey::from_secret(PREVIOUS.as_bytes());
    let rsa = EncodingKey::from_rsa_pem(RSA_PRIVATE).expect("the RSA fixture");
    let later = now() + 3600;
    let connection = json!({
        "sub": "7", "exp": later, "info": {"name": "Ada", "tags": [1, 2.5, null]},
        "channels": ["chat:lobby", "news"], "subscribe": ["chat:*"], "publish": ["chat:lobby"],
    });
    let channel = json!({
        "sub": "7", "exp": later, "channel": "room:a", "info": {"seat": 3},
        "channel_info": {"role": "host"},
    });
    let anonymous_channel = json!({ "channel": "members:x", "exp": later });
    let mut out = vec![
        sign(Algorithm::HS256, &hs, &connection),
        sign(Algorithm::HS512, &hs, &channel),
        sign(Algorithm::HS256, &hs, &anonymous_channel),
        sign(Algorithm::HS256, &previous, &connection),
        sign(Algorithm::RS256, &rsa, &connection),
        sign(Algorithm::RS256, &rsa, &channel),
        sign(
            Algorithm::HS256,
            &hs,
            &json!({ "sub": "7", "exp": now() - 3600 }),
        ),
        // alg none, and an EdDSA token no configured key takes.
        b"eyJhbGciOiJub25lIn0.eyJzdWIiOiI3In0.".to_vec(),
    ];
    if let Ok(ed) = EncodingKey::from_ed_pem(ED_PRIVATE) {
        out.push(sign(Algorithm::EdDSA, &ed, &connection));
    }
    out
}

/// A verifier with an HMAC secret, an RSA public key and a previous HMAC secret.
pub fn verifier() -> Verifier {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let public = dir.path().join("rsa.pub.pem");
    std::fs::write(&public, RSA_PUBLIC).expect("writes the key");
    let auth = AuthConfig {
        hmac_secret: Some(SECRET.into()),
        public_key: Some(public),
        previous: Some(PreviousKey {
            hmac_secret: Some(PREVIOUS.into()),
            public_key: None,
            until: "2999-01-01T00:00:00Z".into(),
        }),
        audience: None,
        ..AuthConfig::default()
    };
    // The key is read now; the file may go.
    Verifier::new(&auth).expect("the fixtures load")
}

/// Each input checked as a connection token and as a subscription token (with and
/// without a user, for the channel it names and for another).
pub fn token() -> Decoder {
    let verifier = verifier();
    let rt = runtime();
    let channel = herald_protocol::ChannelName::new("room:a").expect("valid");
    Box::new(move |input| {
        let token = String::from_utf8_lossy(input);
        rt.block_on(async {
            if let Err(e) = verifier.connection(&token).await {
                let _ = (e.failure(), e.disconnect());
            }
            for user in ["7", ""] {
                let _ = verifier.channel(&token, user, &channel).await;
                let _ = verifier.channel_named_by(&token, user).await;
            }
        });
    })
}

/// Valid JWKS documents (RSA, EC, OKP keys, with and without `kid` and `alg`), and one
/// with a symmetric key, which must be skipped.
pub fn jwks_documents() -> Vec<Vec<u8>> {
    [
        r#"{"keys":[{"kty":"RSA","kid":"k1","alg":"RS256","use":"sig","n":"u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0_IzW7yWR7QkrmBL7jTKEn5u-qKhbwKfBstIs-bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW_VDL5AaWTg0nLVkjRo9z-40RQzuVaE8AkAFmxZzow3x-VJYKdjykkJ0iT9wCS0DRTXu269V264Vf_3jvredZiKRkgwlL9xNAwxXFg0x_XFw005UWVRIkdgcKWTjpBP2dPwVZ4WWC-9aGVd-Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbcmw","e":"AQAB"}]}"#,
        r#"{"keys":[{"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#,
        r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"ed","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#,
        r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"},{"kty":"RSA","alg":"HS256","n":"AQAB","e":"AQAB"}]}"#,
        r#"{"keys":[]}"#,
    ]
    .iter()
    .map(|d| d.as_bytes().to_vec())
    .collect()
}

/// A JWKS document, as the verifier reads one it fetched.
pub fn jwks() -> Decoder {
    Box::new(|input| {
        let _ = herald_server::token::jwks_key_count(input);
    })
}

/// Backends' answers: results of each hook, refusals with codes of every range, and
/// the shapes a broken backend sends.
pub fn hook_answers() -> Vec<Vec<u8>> {
    [
        r#"{"result":{"user":"7","info":{"name":"Ada"},"channels":["chat:lobby"],"subscribe":["chat:*"],"publish":["chat:lobby"],"expires":4102444800}}"#,
        r#"{"result":{}}"#,
        r#"{"result":{"data":{"state":[1,2,{"a":"\u2028"}]},"expires":1}}"#,
        r#"{"result":{"data":"line\nbreak"}}"#,
        r#"{"result":{"expires":null}}"#,
        r#"{"error":{"code":103,"message":"no"}}"#,
        r#"{"error":{"code":1001,"message":"application says no"}}"#,
        r#"{"error":{"code":4294967295,"message":""}}"#,
        r#"{"result":{"user":"a"},"error":{"code":1,"message":"both"}}"#,
    ]
    .iter()
    .map(|d| d.as_bytes().to_vec())
    .collect()
}

/// An answer read as each hook reads its own, then turned into what the client gets.
pub fn hook_answer() -> Decoder {
    fn refused(e: hooks::HookError) {
        let _ = e.clone().failure("fuzz");
        let _ = e.disconnect("fuzz");
    }
    Box::new(|input| {
        match hooks::parse_answer::<ConnectResult>(input) {
            Ok(r) => {
                if let Err(e) = r.identity() {
                    refused(e);
                }
            }
            Err(e) => refused(e),
        }
        match hooks::parse_answer::<SubscribeResult>(input) {
            Ok(r) => {
                if let Some(data) = r.data {
                    let _ = hooks::checked_data(&data, "subscribe");
                }
            }
            Err(e) => refused(e),
        }
        match hooks::parse_answer::<DataResult>(input) {
            Ok(r) => {
                if let Some(data) = r.data {
                    let _ = hooks::checked_data(&data, "rpc");
                }
            }
            Err(e) => refused(e),
        }
        if let Err(e) = hooks::parse_answer::<RefreshResult>(input) {
            refused(e);
        }
    })
}

/// Configuration files: the README's and docs' examples, with every section.
pub fn config_files() -> Vec<Vec<u8>> {
    [
        r#"listen = "127.0.0.1:8080"
api_keys = [{ key = "0123456789abcdef0123", scope = "publish" }]
allowed_origins = ["https://app.example"]

[auth]
hmac_secret = "a-secret-of-at-least-thirty-two-bytes!!"
leeway = "5s"
[auth.previous]
hmac_secret = "an-older-secret-of-at-least-32-bytes!!"
until = "2030-01-01T00:00:00Z"

[client]
ping_interval = "20s"
idle_timeout = "45s"

[channels]
subscribe = "anyone"
history_size = 100
history_ttl = "10m"

[namespaces.room]
presence = true
join_leave = true
publish = "granted"

[hooks]
connect_url = "http://127.0.0.1:9000/connect"
timeout = "2s"

[[pusher.apps]]
id = "1001"
key = "app-key"
secret = "app-secret-0123456789"
client_events = true
webhook_url = "http://127.0.0.1:9000/pusher"
webhook_events = ["member_added", "client_event"]

[phoenix.events]
speak = "publish"
"#,
        "[limits]\nconnections_per_address = 0\n[presence]\ngrace = \"2s\"\n",
        "",
    ]
    .iter()
    .map(|d| d.as_bytes().to_vec())
    .collect()
}

/// A configuration file read as `herald serve --config` reads it (defaults, then the
/// file), then checked.
pub fn config() -> Decoder {
    Box::new(|input| {
        if let Ok(config) = read_config(input) {
            let _ = config.validate();
        }
    })
}

/// A configuration file read as `herald serve --config` reads it: defaults, then the file.
pub fn read_config(input: &[u8]) -> Result<Config, Box<figment::Error>> {
    use figment::{
        providers::{Format, Serialized, Toml},
        Figment,
    };
    let text = String::from_utf8_lossy(input);
    Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(&text))
        .extract()
        .map_err(Box::new)
}

/// `Origin` and `Host` pairs (one line each): allowed, same-origin, foreign, odd hosts.
pub fn origins() -> Vec<Vec<u8>> {
    [
        "https://app.example\napp.example",
        "http://herald.example:8080\nherald.example:8080",
        "https://evil.example\nherald.example",
        "null\n[::1]:8080",
        "https://APP.EXAMPLE\n127.0.0.1",
        "\n",
    ]
    .iter()
    .map(|t| t.as_bytes().to_vec())
    .collect()
}

/// An `Origin` and a `Host` (the input's first line and the rest, as hyper would accept
/// them), checked by the origin and host checks and given CORS answer headers, under an
/// operator's lists and under the defaults, listening on loopback and on every address.
pub fn origin() -> Decoder {
    use axum::http::{header, HeaderMap, HeaderValue};
    use herald_server::policy::origin;
    let settings: Vec<herald_server::Settings> =
        [("127.0.0.1:8080", false), ("0.0.0.0:8080", true)]
            .iter()
            .map(|(listen, lists)| {
                let mut config = Config::default();
                config.listen = listen.parse().expect("an address");
                if *lists {
                    config.allowed_origins = vec!["https://app.example".into()];
                    config.allowed_hosts = vec!["app.example".into(), "herald.example".into()];
                }
                config.validate().expect("valid")
            })
            .collect();
    Box::new(move |input| {
        let (origin_value, host) = match input.iter().position(|b| *b == b'\n') {
            Some(i) => (&input[..i], &input[i + 1..]),
            None => (input, &b""[..]),
        };
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_bytes(origin_value) {
            headers.insert(header::ORIGIN, v);
        }
        if let Ok(v) = HeaderValue::from_bytes(host) {
            headers.insert(header::HOST, v);
        }
        for s in &settings {
            let _ = origin::check(s, &headers);
            let _ = origin::check_host(s, &headers);
            let _ = origin::CorsAnswer::new(s, headers.get(header::ORIGIN))
                .headers()
                .count();
        }
    })
}

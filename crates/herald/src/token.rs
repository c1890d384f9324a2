//! `herald token`: mints a token for tests and scripts, with the configured key.
//!
//! Backends should mint their own (any JWT library will do; docs/auth.md shows how); this
//! is for trying things out, as `centrifugo gentoken` is.

use std::process::ExitCode;

use anyhow::{bail, Context};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Map, Value};

use crate::{
    cli::{ServeArgs, TokenArgs},
    settings,
};

pub fn mint(a: TokenArgs) -> anyhow::Result<ExitCode> {
    let config = settings::load(&ServeArgs {
        config: a.config.clone(),
        ..ServeArgs::default()
    })?;
    let auth = &config.server.auth;
    // The same rules as `serve`: a token signed with a key it refuses would be useless.
    auth.check()?;
    let (key, default_alg) = match (&a.private_key, &auth.hmac_secret) {
        (Some(path), _) => {
            let pem = std::fs::read(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let alg = a.alg.as_deref().unwrap_or("RS256");
            let key = match alg {
                "ES256" | "ES384" => EncodingKey::from_ec_pem(&pem),
                "EdDSA" => EncodingKey::from_ed_pem(&pem),
                _ => EncodingKey::from_rsa_pem(&pem),
            }
            .with_context(|| format!("{} is not a {alg} private key in PEM form", path.display()))?;
            (key, alg)
        }
        (None, Some(secret)) => (EncodingKey::from_secret(secret.as_bytes()), "HS256"),
        (None, None) => bail!(
            "no key to sign with: set auth.hmac_secret (in --config or HERALD_AUTH__HMAC_SECRET), or pass --private-key"
        ),
    };
    let alg: Algorithm = a
        .alg
        .as_deref()
        .unwrap_or(default_alg)
        .parse()
        .map_err(|_| anyhow::anyhow!("unknown --alg {:?}", a.alg))?;

    let mut claims = Map::new();
    claims.insert(auth.user_claim.clone(), json!(a.user));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    claims.insert("iat".into(), json!(now));
    if !a.ttl.is_zero() {
        claims.insert("exp".into(), json!(now + a.ttl.as_secs()));
    }
    if let Some(aud) = &auth.audience {
        claims.insert("aud".into(), json!(aud));
    }
    if let Some(iss) = &auth.issuer {
        claims.insert("iss".into(), json!(iss));
    }
    if let Some(info) = &a.info {
        let info: Value = serde_json::from_str(info).context("--info must be JSON")?;
        claims.insert("info".into(), info);
    }
    if let Some(channel) = &a.subscription {
        claims.insert("channel".into(), json!(channel));
    }
    for (claim, values) in [
        ("subscribe", &a.grants),
        ("publish", &a.publish),
        ("channels", &a.channels),
    ] {
        if !values.is_empty() {
            claims.insert(claim.into(), json!(values));
        }
    }
    let mut header = Header::new(alg);
    header.kid = a.kid;
    let token = jsonwebtoken::encode(&header, &Value::Object(claims), &key)
        .context("cannot sign the token (does --alg match the key?)")?;
    println!("{token}");
    Ok(ExitCode::SUCCESS)
}

//! `herald token`: mints a token for tests and scripts, with the configured key.
//!
//! Backends should mint their own (any JWT library will do; docs/auth.md shows how); this
//! is for trying things out, as `centrifugo gentoken` is.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{bail, Context};
use clap::Args;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Map, Value};

use crate::{cli::ServeArgs, settings};

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The user the token names (its `sub`, or the claim `auth.user_claim` names).
    #[arg(long)]
    pub user: String,
    /// How long the token is valid: `30s`, `10m`, `1h`, `7d`; `0` for no expiry.
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Channel pattern the user may subscribe to (and read history and presence of);
    /// `*` matches any characters, as in `chat:*`. Repeatable.
    #[arg(long = "grant", value_name = "PATTERN")]
    pub grants: Vec<String>,
    /// Channel pattern the user may publish to. Repeatable.
    #[arg(long = "publish", value_name = "PATTERN")]
    pub publish: Vec<String>,
    /// Channel the connection is subscribed to as it connects. Repeatable.
    #[arg(long = "channel", value_name = "NAME")]
    pub channels: Vec<String>,
    /// Public data about the user (JSON), shown to others.
    #[arg(long)]
    pub info: Option<String>,
    /// Mint a subscription token for this channel instead of a connection token.
    #[arg(long, value_name = "CHANNEL", conflicts_with_all = ["grants", "publish", "channels"])]
    pub subscription: Option<String>,
    /// Sign with this private key (PEM) instead of `auth.hmac_secret`.
    #[arg(long)]
    pub private_key: Option<PathBuf>,
    /// Algorithm for --private-key: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or
    /// EdDSA; with the HMAC secret: HS256, HS384 or HS512.
    #[arg(long)]
    pub alg: Option<String>,
    /// Key id (`kid`) to put in the header, for JWKS keys.
    #[arg(long)]
    pub kid: Option<String>,
    /// The configuration whose `[auth]` the token is for (HERALD_AUTH__* variables count
    /// too, as for `herald serve`).
    #[arg(long, short, env = "HERALD_CONFIG")]
    pub config: Option<PathBuf>,
}

fn parse_ttl(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

pub fn mint(a: TokenArgs) -> anyhow::Result<ExitCode> {
    let config = settings::load(&ServeArgs {
        config: a.config.clone(),
        ..ServeArgs::default()
    })?;
    let auth = &config.auth;
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

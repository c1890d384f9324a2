//! The dashboard's tickets: what lets a browser that was given an API key read Herald's
//! own channels (the `herald` namespace, where the node publishes its figures) over an
//! ordinary Herald connection.
//!
//! `GET /api/dashboard/ticket` (any API key) answers a short-lived HS256 token whose key is
//! derived from the configured API keys, so every node that shares the keys accepts it and
//! nothing new is configured. Connecting with it gives an identity that may subscribe to
//! `herald:*` and nothing else; no application token, grant or hook can give that, as
//! [`super::check`] asks for this identity by its flag.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::settings::Settings;
use crate::token::{Identity, TokenError};

/// The namespace of Herald's own channels; a configuration may not name it.
pub use crate::config::OPERATOR_NAMESPACE as NAMESPACE;

/// What tickets start with, so that application tokens are never tried as one.
const PREFIX: &str = "herald-operator-";
const AUDIENCE: &str = "herald-operator";

/// How long a ticket opens connections (a dashboard left open asks for a new one).
pub const TICKET_TTL: Duration = Duration::from_secs(12 * 3600);

#[derive(Serialize, Deserialize)]
struct Claims {
    aud: String,
    exp: u64,
}

/// The key tickets are signed with: a hash of every API key, so that no ticket survives a
/// change of keys. `None` without API keys (then there is no API to ask for one).
fn key(settings: &Settings) -> Option<Vec<u8>> {
    let mut keys: Vec<&str> = settings.api_keys().map(|(k, _)| k).collect();
    if keys.is_empty() {
        return None;
    }
    keys.sort_unstable();
    let mut hash = Sha256::new();
    hash.update(b"herald operator ticket v1\n");
    for k in keys {
        hash.update(k.as_bytes());
        hash.update(b"\n");
    }
    Some(hash.finalize().to_vec())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A new ticket and when it expires (Unix seconds).
pub fn ticket(settings: &Settings) -> Option<(String, u64)> {
    let exp = unix_now() + TICKET_TTL.as_secs();
    let claims = Claims {
        aud: AUDIENCE.into(),
        exp,
    };
    let jwt = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(&key(settings)?),
    )
    .expect("HS256 tokens encode");
    Some((format!("{PREFIX}{jwt}"), exp))
}

/// Whether `token` is meant as a ticket (then it is checked only as one).
pub fn is_ticket(token: &str) -> bool {
    token.starts_with(PREFIX)
}

/// The operator's identity if `token` is a valid ticket of these settings.
pub fn verify(settings: &Settings, token: &str) -> Result<Identity, TokenError> {
    let invalid = |why: &str| TokenError::Invalid(why.to_string());
    let jwt = token
        .strip_prefix(PREFIX)
        .ok_or_else(|| invalid("not a dashboard ticket"))?;
    let key = key(settings)
        .ok_or_else(|| invalid("no API key is configured, so no dashboard ticket is valid"))?;
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_audience(&[AUDIENCE]);
    validation.leeway = 0;
    let claims = jsonwebtoken::decode::<Claims>(jwt, &DecodingKey::from_secret(&key), &validation)
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => TokenError::Expired,
            _ => invalid(&format!(
                "dashboard ticket refused ({e}); ask /api/dashboard/ticket for a new one"
            )),
        })?
        .claims;
    let mut identity = Identity::new(
        "herald-operator".into(),
        None,
        &[],
        vec![format!("{NAMESPACE}:*")],
        Vec::new(),
        Some(claims.exp),
    )
    .map_err(|e| invalid(&e))?;
    identity.operator = true;
    Ok(identity)
}

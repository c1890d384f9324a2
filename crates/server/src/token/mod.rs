//! Client tokens: JWTs signed by the application's backend, checked with `jsonwebtoken`.
//!
//! A **connection token** says who the client is (`sub`, or the claim `auth.user_claim`
//! names), what others may see of it (`info`), which channels it is subscribed to from the
//! start (`channels`) and which channels it is granted (`subscribe`, `publish`: names or
//! `*` patterns). A **subscription token** grants one connection's user one channel
//! (`sub`, `channel`). Both may carry `exp`, `nbf`, `iat`, `aud` and `iss`.
//!
//! Which key checks a token is decided by the configuration, never by the token: a key
//! only verifies the algorithms of its own family, so an HMAC token is never checked
//! against a public key (algorithm confusion) and `alg: none` names no key at all.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use herald_protocol::{ChannelName, DisconnectCode, ErrorCode};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::value::RawValue;

pub mod grants;
mod jwks;

pub use jwks::jwks_key_count;

use crate::{
    config::{bad, AuthConfig, ConfigError},
    error::{Disconnect, Failure},
};
use grants::Grants;
use jwks::Jwks;

/// Longest token accepted, in bytes: a token is read before anything else is known about
/// its sender.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Past its `exp`: the client should get a new token and try again.
    #[error("token expired")]
    Expired,
    /// Anything else: a new try with the same token fails the same way.
    #[error("invalid token: {0}")]
    Invalid(String),
}

impl TokenError {
    /// As a command's or request's failure (101 invalid, 109 expired).
    pub fn failure(&self) -> Failure {
        match self {
            TokenError::Expired => Failure::new(ErrorCode::TokenExpired, self.to_string()),
            TokenError::Invalid(_) => Failure::new(ErrorCode::Unauthorized, self.to_string()),
        }
    }

    /// As the end of a connection (3500 invalid, 3504 expired).
    pub fn disconnect(&self) -> Disconnect {
        match self {
            TokenError::Expired => Disconnect::new(DisconnectCode::Expired),
            TokenError::Invalid(_) => {
                Disconnect::because(DisconnectCode::InvalidToken, self.to_string())
            }
        }
    }
}

fn invalid(why: impl Into<String>) -> TokenError {
    TokenError::Invalid(why.into())
}

/// Who a connection is, from its token.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The user.
    pub user: Box<str>,
    /// Public data about the user (JSON text, checked as publication data), shown to others.
    pub info: Option<Bytes>,
    /// Channels the connection is subscribed to from the start.
    pub channels: Vec<ChannelName>,
    /// Channels the user may subscribe to (and read the history and presence of).
    pub subscribe: Grants,
    /// Channels the user may publish to.
    pub publish: Grants,
    /// When the token stops being accepted (Unix seconds).
    pub expires: Option<u64>,
    /// `{"user":…,"info":…}`, encoded once: the sender shown with the connection's
    /// publications.
    pub from: Bytes,
    /// A dashboard's connection ([`crate::policy::operator`]): the only identity that may read
    /// Herald's own channels.
    pub operator: bool,
}

/// The largest `info` a token or connect hook may give: it goes out with every publication
/// the connection makes.
pub const MAX_INFO_BYTES: usize = 4096;

impl Identity {
    /// An identity from a token's claims or a connect hook's answer; the error says which
    /// field is wrong.
    pub fn new(
        user: Box<str>,
        info: Option<Box<RawValue>>,
        channels: &[String],
        subscribe: Vec<String>,
        publish: Vec<String>,
        expires: Option<u64>,
    ) -> Result<Self, String> {
        if channels.len() > grants::MAX_PATTERNS {
            return Err("too many channels".into());
        }
        let channels = channels
            .iter()
            .map(|c| ChannelName::new(c).map_err(|e| format!("channels: {c:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let info = info.as_deref().map(checked_info).transpose()?;
        let from = sender(&user, info.as_deref(), None);
        Ok(Identity {
            user,
            info,
            from,
            channels,
            subscribe: Grants::new(subscribe).map_err(|e| format!("subscribe: {e}"))?,
            publish: Grants::new(publish).map_err(|e| format!("publish: {e}"))?,
            expires,
            operator: false,
        })
    }
}

/// A token's or connect hook's `info`, checked as publication data is (it goes out beside
/// it) and bounded.
pub(crate) fn checked_info(raw: &RawValue) -> Result<Bytes, String> {
    if raw.get().len() > MAX_INFO_BYTES {
        return Err(format!("info: larger than {MAX_INFO_BYTES} bytes"));
    }
    herald_protocol::json::payload(raw).map_err(|e| format!("info: {e}"))
}

/// `{"user":USER,"info":INFO,"channel_info":INFO}`, without the parts there are none of.
pub fn sender(user: &str, info: Option<&[u8]>, channel_info: Option<&[u8]>) -> Bytes {
    let mut out = br#"{"user":"#.to_vec();
    serde_json::to_writer(&mut out, user).expect("a string serialises");
    for (key, value) in [
        (&br#","info":"#[..], info),
        (br#","channel_info":"#, channel_info),
    ] {
        if let Some(value) = value {
            out.extend_from_slice(key);
            out.extend_from_slice(value);
        }
    }
    out.push(b'}');
    Bytes::from(out)
}

/// A channel granted by a subscription token.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelGrant {
    /// The channel.
    pub channel: ChannelName,
    /// When the token stops being accepted (Unix seconds).
    pub expires: Option<u64>,
    /// The subscription token's `info`: shown as `channel_info` with the connection's
    /// publications in this channel.
    pub info: Option<Bytes>,
    /// The presence member this grant makes the connection in this channel, instead of its
    /// identity's user: a Pusher presence channel's signed `channel_data` (whose
    /// `user_info` is then `info`).
    pub user: Option<Box<str>>,
    /// That user's id as JSON, when its client wrote it as other than a string (a Pusher
    /// `user_id` that is a number): member records carry it as `user_id`, so that a front
    /// gives it back as it came.
    pub user_id: Option<Bytes>,
    /// Whether the connection is pushed the channel's joins and leaves without being a
    /// member of it (a connection that watches who is online; see
    /// [`crate::session::Session::watch_channel`]).
    pub sees_members: bool,
}

#[derive(Deserialize)]
struct ConnectionClaims {
    #[serde(default)]
    info: Option<Box<RawValue>>,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default)]
    channel: Option<serde::de::IgnoredAny>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct ChannelClaims {
    channel: String,
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default)]
    info: Option<Box<RawValue>>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

/// A key configured in `[auth]`.
struct StaticKey {
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
    /// For a key being rotated out: when it stops being accepted.
    until: Option<SystemTime>,
}

/// Checks tokens against the configured keys.
pub struct Verifier {
    keys: Vec<StaticKey>,
    jwks: Option<Jwks>,
    user_claim: String,
    audience: Option<String>,
    issuer: Option<String>,
    leeway: Duration,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.keys.len())
            .field("jwks", &self.jwks.is_some())
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// Loads the keys `[auth]` names (reading PEM files now, so a bad one stops the start).
    pub fn new(auth: &AuthConfig) -> Result<Self, ConfigError> {
        let mut keys = Vec::new();
        if let Some(secret) = &auth.hmac_secret {
            keys.push(hmac(secret, None));
        }
        if let Some(path) = &auth.public_key {
            keys.push(public_key("auth.public_key", path, None)?);
        }
        if let Some(previous) = &auth.previous {
            let until = auth.previous_until();
            if let Some(secret) = &previous.hmac_secret {
                keys.push(hmac(secret, until));
            }
            if let Some(path) = &previous.public_key {
                keys.push(public_key("auth.previous.public_key", path, until)?);
            }
        }
        Ok(Self {
            keys,
            jwks: auth
                .jwks_url
                .as_ref()
                .map(|url| Jwks::new(url, auth.jwks_timeout, auth.jwks_refresh)),
            user_claim: auth.user_claim.clone(),
            audience: auth.audience.clone(),
            issuer: auth.issuer.clone(),
            leeway: auth.leeway,
        })
    }

    /// Whether any key is configured.
    pub fn keyed(&self) -> bool {
        !self.keys.is_empty() || self.jwks.is_some()
    }

    /// How long after `exp` a connection is still left open.
    pub fn leeway(&self) -> Duration {
        self.leeway
    }

    /// Starts fetching the JWKS keys, so the first client does not wait for them.
    pub fn prefetch(self: &Arc<Self>) {
        if self.jwks.is_some() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let this = self.clone();
                rt.spawn(async move {
                    if let Some(jwks) = &this.jwks {
                        jwks.refresh().await;
                    }
                });
            }
        }
    }

    /// Checks a connection token.
    pub async fn connection(&self, token: &str) -> Result<Identity, TokenError> {
        let (claims, user) = self.verify::<ConnectionClaims>(token).await?;
        if claims.channel.is_some() {
            return Err(invalid(
                "a subscription token (it has a `channel` claim) cannot open a connection",
            ));
        }
        let user = user.ok_or_else(|| {
            invalid(format!(
                "the `{}` claim must name the user (a non-empty string)",
                self.user_claim
            ))
        })?;
        Identity::new(
            user,
            claims.info,
            &claims.channels,
            claims.subscribe,
            claims.publish,
            claims.exp,
        )
        .map_err(invalid)
    }

    /// Checks a subscription token for `channel`, presented by a connection of `user`
    /// (the empty string for anonymous connections).
    pub async fn channel(
        &self,
        token: &str,
        user: &str,
        channel: &ChannelName,
    ) -> Result<ChannelGrant, TokenError> {
        let grant = self.channel_named_by(token, user).await?;
        if &grant.channel != channel {
            return Err(invalid(format!(
                "the subscription token is for {}, not {channel}",
                grant.channel
            )));
        }
        Ok(grant)
    }

    /// Checks a subscription token that names its own channel (an HTTP request's
    /// `sub_token=`), presented by a connection of `user`.
    pub async fn channel_named_by(
        &self,
        token: &str,
        user: &str,
    ) -> Result<ChannelGrant, TokenError> {
        let (claims, token_user) = self.verify::<ChannelClaims>(token).await?;
        let channel = ChannelName::new(&claims.channel)
            .map_err(|e| invalid(format!("channel {:?}: {e}", claims.channel)))?;
        if token_user.as_deref().unwrap_or_default() != user {
            return Err(invalid(
                "the subscription token is for another user than this connection's",
            ));
        }
        let info = claims
            .info
            .as_deref()
            .map(checked_info)
            .transpose()
            .map_err(invalid)?;
        Ok(ChannelGrant {
            channel,
            expires: claims.exp,
            info,
            user: None,
            user_id: None,
            sees_members: false,
        })
    }

    /// Verifies the signature and the registered claims, and reads the user.
    async fn verify<C: Claims>(&self, token: &str) -> Result<(C, Option<Box<str>>), TokenError> {
        if !self.keyed() {
            return Err(invalid(
                "this server has no token keys (auth.hmac_secret, auth.public_key or auth.jwks_url)",
            ));
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(invalid(format!("longer than {MAX_TOKEN_BYTES} bytes")));
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| invalid(format!("not a signed JWT: {e}")))?;
        let alg = header.alg;
        let validation = self.validation(alg);
        let now = SystemTime::now();
        let mut tried = false;
        for k in &self.keys {
            if !k.algorithms.contains(&alg) || k.until.is_some_and(|until| now > until) {
                continue;
            }
            tried = true;
            match jsonwebtoken::decode::<C>(token, &k.key, &validation) {
                Ok(data) => return self.accept(data.claims),
                Err(e) if is_signature(&e) => continue,
                Err(e) => return Err(refusal(e)),
            }
        }
        if let Some(jwks) = &self.jwks {
            for key in jwks.keys_for(header.kid.as_deref(), alg).await {
                tried = true;
                match jsonwebtoken::decode::<C>(token, &key, &validation) {
                    Ok(data) => return self.accept(data.claims),
                    Err(e) if is_signature(&e) => continue,
                    Err(e) => return Err(refusal(e)),
                }
            }
        }
        Err(match (tried, &header.kid) {
            (true, _) => invalid("wrong signature"),
            (false, Some(kid)) if self.jwks.is_some() => {
                invalid(format!("no key with id {kid:?} verifies {alg:?} tokens"))
            }
            (false, _) => invalid(format!("no configured key verifies {alg:?} tokens")),
        })
    }

    fn validation(&self, alg: Algorithm) -> Validation {
        let mut v = Validation::new(alg);
        v.leeway = self.leeway.as_secs();
        v.validate_nbf = true;
        v.required_spec_claims.clear();
        match &self.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                v.required_spec_claims.insert("aud".into());
            }
            // As most servers do: without a configured audience, `aud` is not checked.
            None => v.validate_aud = false,
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
            v.required_spec_claims.insert("iss".into());
        }
        v
    }

    fn accept<C: Claims>(&self, claims: C) -> Result<(C, Option<Box<str>>), TokenError> {
        let user = match claims.rest().get(&self.user_claim) {
            None => None,
            Some(serde_json::Value::String(s)) if s.len() <= 256 => {
                (!s.is_empty()).then(|| s.as_str().into())
            }
            Some(_) => {
                return Err(invalid(format!(
                    "the `{}` claim must be a string of at most 256 bytes",
                    self.user_claim
                )))
            }
        };
        Ok((claims, user))
    }
}

trait Claims: serde::de::DeserializeOwned {
    fn rest(&self) -> &serde_json::Map<String, serde_json::Value>;
}

impl Claims for ConnectionClaims {
    fn rest(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.rest
    }
}

impl Claims for ChannelClaims {
    fn rest(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.rest
    }
}

/// Failures that mean "not this key": another key may still verify the token.
fn is_signature(e: &jsonwebtoken::errors::Error) -> bool {
    use jsonwebtoken::errors::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::InvalidSignature
            | ErrorKind::InvalidAlgorithm
            | ErrorKind::InvalidEcdsaKey
            | ErrorKind::InvalidRsaKey(_)
            | ErrorKind::InvalidEddsaKey
    )
}

fn refusal(e: jsonwebtoken::errors::Error) -> TokenError {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::ImmatureSignature => invalid("not valid yet (nbf)"),
        ErrorKind::InvalidAudience => invalid("wrong audience (aud)"),
        ErrorKind::InvalidIssuer => invalid("wrong issuer (iss)"),
        ErrorKind::MissingRequiredClaim(c) => invalid(format!("the `{c}` claim is missing")),
        _ => invalid(e.to_string()),
    }
}

fn hmac(secret: &str, until: Option<SystemTime>) -> StaticKey {
    StaticKey {
        key: DecodingKey::from_secret(secret.as_bytes()),
        algorithms: vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512],
        until,
    }
}

fn public_key(
    key_name: &str,
    path: &std::path::Path,
    until: Option<SystemTime>,
) -> Result<StaticKey, ConfigError> {
    let pem = std::fs::read(path)
        .map_err(|e| bad(key_name, format!("cannot read {}: {e}", path.display())))?;
    let key = DecodingKey::from_rsa_pem(&pem)
        .or_else(|_| DecodingKey::from_ec_pem(&pem))
        .or_else(|_| DecodingKey::from_ed_pem(&pem))
        .map_err(|_| {
            bad(
                key_name,
                format!(
                    "{} holds no RSA, EC or Ed25519 public key in PEM form",
                    path.display()
                ),
            )
        })?;
    let algorithms = key.family().algorithms().to_vec();
    Ok(StaticKey {
        key,
        algorithms,
        until,
    })
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;

//! `[auth]`: how client tokens (JWT) are checked.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::{bad, ConfigError};

/// Keys and rules for connection and subscription tokens. With no key at all, every
/// client is anonymous (and namespaces say what anonymous clients may do).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Secret for HS256, HS384 and HS512 tokens (at least 32 bytes). Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hmac_secret: Option<String>,
    /// PEM file with a public key, for RS256/384/512, PS256/384/512, ES256/384 or EdDSA
    /// tokens (whichever the key's type is). Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key: Option<PathBuf>,
    /// A JWKS address (an OpenID provider's `jwks_uri`): keys are fetched at start, every
    /// `jwks_refresh`, and when a token names a key id not seen yet (at most once a second).
    /// Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// Longest wait for the JWKS address to answer. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub jwks_timeout: Duration,
    /// How often the JWKS keys are fetched again. Default `1h`.
    #[serde(with = "humantime_serde")]
    pub jwks_refresh: Duration,
    /// When set, tokens must carry this `aud`. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// When set, tokens must carry this `iss`. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// The claim that names the user. Default `sub`.
    pub user_claim: String,
    /// Allowance for clocks that differ: a token is accepted until `leeway` after its `exp`
    /// (and from `leeway` before its `nbf`), and a connection whose token expired is closed
    /// `leeway` after its `exp`. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub leeway: Duration,
    /// A key being rotated out: tokens it signed are accepted until `until`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<PreviousKey>,
}

/// The key that signed tokens before the current one, during a rotation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviousKey {
    /// As `auth.hmac_secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmac_secret: Option<String>,
    /// As `auth.public_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<PathBuf>,
    /// When the key stops being accepted: an RFC 3339 time such as `2026-12-01T00:00:00Z`.
    pub until: String,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            hmac_secret: None,
            public_key: None,
            jwks_url: None,
            jwks_timeout: Duration::from_secs(5),
            jwks_refresh: Duration::from_secs(3600),
            audience: None,
            issuer: None,
            user_claim: "sub".into(),
            leeway: Duration::from_secs(5),
            previous: None,
        }
    }
}

/// Shortest HMAC secret accepted: RFC 7518 §3.2 asks for a key at least as long as the hash.
pub const MIN_HMAC_SECRET: usize = 32;

impl AuthConfig {
    /// Whether any key is configured (then tokens are checked, and the default rules close
    /// reading to anonymous clients).
    pub fn keyed(&self) -> bool {
        self.hmac_secret.is_some() || self.public_key.is_some() || self.jwks_url.is_some()
    }

    /// When the previous key stops being accepted.
    pub fn previous_until(&self) -> Option<std::time::SystemTime> {
        let until = &self.previous.as_ref()?.until;
        humantime_serde::re::humantime::parse_rfc3339_weak(until).ok()
    }

    /// Checks the keys as `herald serve` does (`herald token` asks the same, so it never
    /// mints with a key the server refuses).
    pub fn check(&self) -> Result<(), ConfigError> {
        let short = |s: &String| s.len() < MIN_HMAC_SECRET;
        if self.hmac_secret.as_ref().is_some_and(short) {
            return Err(bad(
                "auth.hmac_secret",
                format!("must be at least {MIN_HMAC_SECRET} bytes (RFC 7518 §3.2)"),
            ));
        }
        if let Some(url) = &self.jwks_url {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(bad(
                    "auth.jwks_url",
                    "must be an http:// or https:// address",
                ));
            }
        }
        if self.jwks_timeout.is_zero() || self.jwks_refresh < Duration::from_secs(10) {
            return Err(bad(
                "auth.jwks_timeout",
                "auth.jwks_timeout must be greater than 0 and auth.jwks_refresh at least 10s",
            ));
        }
        if self.user_claim.is_empty() {
            return Err(bad("auth.user_claim", "must name a claim"));
        }
        if let Some(previous) = &self.previous {
            if previous.hmac_secret.is_none() && previous.public_key.is_none() {
                return Err(bad(
                    "auth.previous",
                    "give the previous key's hmac_secret or public_key",
                ));
            }
            if previous.hmac_secret.as_ref().is_some_and(short) {
                return Err(bad(
                    "auth.previous.hmac_secret",
                    format!("must be at least {MIN_HMAC_SECRET} bytes"),
                ));
            }
            if self.previous_until().is_none() {
                return Err(bad(
                    "auth.previous.until",
                    format!(
                        "{:?} is not an RFC 3339 time such as 2026-12-01T00:00:00Z",
                        previous.until
                    ),
                ));
            }
            if !self.keyed() {
                return Err(bad(
                    "auth.previous",
                    "a previous key needs a current one (hmac_secret, public_key or jwks_url)",
                ));
            }
        }
        Ok(())
    }
}

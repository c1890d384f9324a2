//! Keys from a JWKS address (an OpenID provider's `jwks_uri`), cached.
//!
//! Fetched at start, again every `jwks_refresh`, and when a token names a key id the cache
//! does not hold (a provider that rotated its keys). Fetches are at least [`MIN_REFETCH`]
//! apart: a token that needs one sooner waits for it rather than being refused, so tokens
//! with made-up key ids cannot turn Herald into a flood against the provider, and a token
//! signed right after a rotation is still accepted. One fetch at a time; everyone else
//! waits for its result. A failed fetch keeps the keys held before.

use std::{sync::Arc, time::Duration};

use jsonwebtoken::{
    jwk::{AlgorithmParameters, JwkSet},
    Algorithm, DecodingKey,
};
use parking_lot::RwLock;
use tokio::{sync::Mutex, time::Instant};

/// Shortest time between two fetches.
pub const MIN_REFETCH: Duration = Duration::from_secs(1);

/// Largest JWKS document read.
const MAX_DOCUMENT: usize = 1 << 20;

struct Key {
    kid: Option<String>,
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

#[derive(Default)]
struct Cache {
    keys: Arc<Vec<Key>>,
    fetched: Option<Instant>,
}

/// A JWKS address and the keys last read from it.
pub struct Jwks {
    url: String,
    refresh: Duration,
    client: reqwest::Client,
    cache: RwLock<Cache>,
    /// Held while fetching: one fetch at a time.
    fetching: Mutex<()>,
}

impl Jwks {
    /// A cache of `url`'s keys; nothing is fetched yet.
    pub fn new(url: &str, timeout: Duration, refresh: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .expect("a client without custom TLS settings builds");
        Self {
            url: url.to_string(),
            refresh,
            client,
            cache: RwLock::default(),
            fetching: Mutex::new(()),
        }
    }

    /// Keys that may verify a token signed with `alg` under key id `kid`, fetching the
    /// document first when it is stale or does not know `kid`.
    pub async fn keys_for(&self, kid: Option<&str>, alg: Algorithm) -> Vec<DecodingKey> {
        let (held, fetched) = {
            let c = self.cache.read();
            (c.keys.clone(), c.fetched)
        };
        let stale = fetched.is_none_or(|at| at.elapsed() >= self.refresh);
        let unknown = kid.is_some_and(|kid| !held.iter().any(|k| k.kid.as_deref() == Some(kid)));
        let keys = if stale || unknown {
            self.fetch_after(fetched).await
        } else {
            held
        };
        keys.iter()
            .filter(|k| k.algorithms.contains(&alg))
            .filter(|k| match (kid, &k.kid) {
                (Some(wanted), Some(have)) => wanted == have,
                _ => true,
            })
            .map(|k| k.key.clone())
            .collect()
    }

    /// Fetches now, unless done already.
    pub async fn refresh(&self) {
        let fetched = self.cache.read().fetched;
        self.fetch_after(fetched).await;
    }

    /// Fetches the document unless another caller did since `seen` (then its keys serve).
    async fn fetch_after(&self, seen: Option<Instant>) -> Arc<Vec<Key>> {
        let _one = self.fetching.lock().await;
        {
            let c = self.cache.read();
            if c.fetched != seen {
                return c.keys.clone();
            }
        }
        if let Some(at) = seen {
            tokio::time::sleep_until(at + MIN_REFETCH).await;
        }
        let fetched = self.fetch().await;
        let mut c = self.cache.write();
        c.fetched = Some(Instant::now());
        match fetched {
            Ok(keys) => c.keys = Arc::new(keys),
            Err(e) => {
                tracing::warn!(url = %self.url, error = %e, "cannot fetch JWKS keys; keeping the ones held")
            }
        }
        c.keys.clone()
    }

    async fn fetch(&self) -> Result<Vec<Key>, String> {
        let response = self
            .client
            .get(&self.url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| e.to_string())?;
        if response
            .content_length()
            .is_some_and(|n| n > MAX_DOCUMENT as u64)
        {
            return Err(format!("document larger than {MAX_DOCUMENT} bytes"));
        }
        let body = response.bytes().await.map_err(|e| e.to_string())?;
        if body.len() > MAX_DOCUMENT {
            return Err(format!("document larger than {MAX_DOCUMENT} bytes"));
        }
        read_document(&body)
    }
}

/// The verification keys of a JWKS document.
fn read_document(body: &[u8]) -> Result<Vec<Key>, String> {
    let set: JwkSet = serde_json::from_slice(body).map_err(|e| format!("not a JWKS: {e}"))?;
    Ok(set.keys.iter().filter_map(read_key).collect())
}

/// How many verification keys a JWKS document gives (what the fuzzer reaches).
pub fn jwks_key_count(body: &[u8]) -> Result<usize, String> {
    read_document(body).map(|keys| keys.len())
}

/// A JWK as a verification key; symmetric (`oct`) keys and unknown types are skipped: a
/// published key must never be usable as an HMAC secret.
fn read_key(jwk: &jsonwebtoken::jwk::Jwk) -> Option<Key> {
    if matches!(
        jwk.algorithm,
        AlgorithmParameters::OctetKey(_) | AlgorithmParameters::Other(_)
    ) {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    let family = key.family().algorithms().to_vec();
    let declared = jwk
        .common
        .key_algorithm
        .map(|a| a.to_string().parse::<Algorithm>());
    let algorithms = match declared {
        Some(Ok(alg)) if family.contains(&alg) => vec![alg],
        Some(_) => return None,
        None => family,
    };
    Some(Key {
        kid: jwk.common.key_id.clone(),
        algorithms,
        key,
    })
}

//! The HTTP API's key: which key a request carries, and whether its scope covers what the
//! request does. Reads (GET, HEAD) need a read key; acting on other people's connections a
//! key without a scope; anything else that changes channels a publish key.

use axum::http::{header, HeaderMap, Method};
use herald_protocol::ErrorCode;

use crate::{config::ApiScope, error::Failure, settings::Settings};

/// Routes that act on other people's connections: only a key without a scope may.
const ADMIN_ACTIONS: [&str; 2] = ["/api/disconnect", "/api/unsubscribe"];

/// Whether a request (`method` on `path`, with `headers`) may use the API.
pub fn check(
    settings: &Settings,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<(), Failure> {
    // Reads are GETs (and HEADs, which the router answers as GETs without the body, so
    // they read as much); acting on connections needs a full key; everything else changes
    // channels.
    let needed = if matches!(*method, Method::GET | Method::HEAD) {
        ApiScope::Read
    } else if ADMIN_ACTIONS.contains(&path) {
        ApiScope::All
    } else {
        ApiScope::Publish
    };
    check_scope(
        settings,
        needed,
        authorization(headers),
        "`Authorization: apikey KEY`",
    )
}

/// The key of an `Authorization: apikey KEY` header, if the request has one.
pub fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("apikey "))
        .map(str::trim)
}

/// Whether the key `given` (`None`: the request carried none where `expected` says) may do
/// what needs `needed`.
pub fn check_scope(
    settings: &Settings,
    needed: ApiScope,
    given: Option<&str>,
    expected: &str,
) -> Result<(), Failure> {
    let mut keys = settings.api_keys().peekable();
    if keys.peek().is_none() {
        return Err(Failure::new(
            ErrorCode::NotAvailable,
            "the HTTP API is disabled because no API key is configured; set api_key in the config file, \
             HERALD_API_KEY in the environment, or pass --api-key to herald serve",
        ));
    }
    let given = given.ok_or_else(|| {
        Failure::new(
            ErrorCode::Unauthorized,
            format!("missing header {expected}"),
        )
    })?;
    // Every key is compared (in constant time), so timing tells nothing of which key, or
    // whether any, matched.
    let scope = keys.fold(None, |found, (key, scope)| {
        let equal = constant_time_eq(key.as_bytes(), given.as_bytes());
        found.or(equal.then_some(scope))
    });
    match scope {
        Some(ApiScope::All) => Ok(()),
        Some(scope) if scope == needed => Ok(()),
        Some(scope) => Err(Failure::new(
            ErrorCode::PermissionDenied,
            format!(
                "this API key may only {}",
                // Said for both APIs: Herald's (reads are GETs) and Centrifugo's (all POSTs).
                if scope == ApiScope::Read {
                    "read (history, presence, info: Herald's GET routes)"
                } else {
                    "publish (acting on connections, disconnect and unsubscribe, needs a key without a scope)"
                }
            ),
        )),
        None => Err(Failure::new(ErrorCode::Unauthorized, "wrong API key")),
    }
}

/// Compares without stopping at the first difference, so timing does not reveal a key.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

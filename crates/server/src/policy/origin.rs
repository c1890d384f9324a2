//! Which browser origins may open connections, which may read the answers (CORS), and
//! which host names the server answers to.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use herald_protocol::ErrorCode;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::{error::Failure, settings::Settings};

/// Allows requests without `Origin` (not from a browser), same-origin requests, and the
/// origins listed in `allowed_origins` (`*` allows any).
pub fn check(settings: &Settings, headers: &HeaderMap) -> Result<(), Failure> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or_default();
    let allowed = &settings.config.allowed_origins;
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
    {
        return Ok(());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
    if !host.is_empty() && origin_host.eq_ignore_ascii_case(host) {
        return Ok(());
    }
    let why = format!("origin {origin:?} is not allowed; add it to allowed_origins");
    log_refusal(&why);
    Err(Failure::new(ErrorCode::OriginNotAllowed, why))
}

/// Logs a refused origin, at most once per 10 s whatever the number of origins (a hostile
/// page must not fill the log), with how many were refused meanwhile. The first a newcomer
/// sees is often a page served from another port being refused.
fn log_refusal(why: &str) {
    static REFUSALS: crate::throttle::Throttle = crate::throttle::Throttle::new(10);
    if let Some(refused) = REFUSALS.due() {
        tracing::warn!(refused, "refused a browser connection: {why}");
    }
}

/// Whether the request names a host this server answers to (`allowed_hosts`); requests
/// without `Host` (HTTP/1.0) pass. See `Config::allowed_hosts` for the default.
pub fn check_host(settings: &Settings, headers: &HeaderMap) -> Result<(), Failure> {
    let Some(host) = headers.get(header::HOST) else {
        return Ok(());
    };
    let host = host.to_str().unwrap_or_default();
    // `name:port`, `[v6]:port`, `name`: the name alone.
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let config = &settings.config;
    // A loopback name can only be in a page's URL on this machine itself, never in a
    // hostile page's (which names its own host), so a server listening on loopback always
    // answers to them: its proxy, a backend or a probe on the machine may use them.
    let loopback = config.listen.ip().is_loopback()
        && ["localhost", "127.0.0.1", "::1"]
            .iter()
            .any(|a| a.eq_ignore_ascii_case(name));
    let allowed = loopback
        || config
            .allowed_hosts
            .iter()
            .any(|a| a.eq_ignore_ascii_case(name))
        || (config.allowed_hosts.is_empty() && !config.listen.ip().is_loopback());
    if allowed {
        return Ok(());
    }
    Err(Failure::new(
        ErrorCode::PermissionDenied,
        format!("host {name:?} is not served here; add it to allowed_hosts"),
    ))
}

/// Cross-origin browsers may use the HTTP transports from the origins in
/// `allowed_origins` (the same list the origin check enforces): the router's CORS layer.
pub fn cors(allowed: &[String]) -> CorsLayer {
    let origins = if allowed.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(allowed.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::CONTENT_TYPE,
            header::AUTHORIZATION,
            HeaderName::from_static("last-event-id"),
        ])
}

/// What [`cors`]'s layer adds to an answer that is not a preflight's, for a request from
/// some origin: for the lean long-poll path, which answers without the router (see
/// `transport::poll::Resumer`). A test holds the two equal.
#[derive(Debug, Clone)]
pub struct CorsAnswer {
    /// The `Access-Control-Allow-Origin` the layer would give, if any.
    allowed_origin: Option<HeaderValue>,
}

impl CorsAnswer {
    pub fn new(settings: &Settings, origin: Option<&HeaderValue>) -> Self {
        let allowed = &settings.config.allowed_origins;
        let allowed_origin = if allowed.iter().any(|o| o == "*") {
            Some(HeaderValue::from_static("*"))
        } else {
            origin
                .filter(|o| allowed.iter().any(|a| a.as_bytes() == o.as_bytes()))
                .cloned()
        };
        Self { allowed_origin }
    }

    /// The headers, in the layer's order: its `Vary` goes on every answer.
    pub fn headers(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        let vary = HeaderValue::from_static(
            "origin, access-control-request-method, access-control-request-headers",
        );
        std::iter::once((header::VARY, vary)).chain(
            self.allowed_origin
                .iter()
                .map(|o| (header::ACCESS_CONTROL_ALLOW_ORIGIN, o.clone())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn headers(origin: Option<&'static str>, host: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static(host));
        if let Some(o) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_static(o));
        }
        h
    }

    #[test]
    fn same_origin_and_listed_origins_pass() {
        let mut c = Config::default();
        c.allowed_origins = vec!["https://app.example".into()];
        let s = c.validate().unwrap();
        assert!(check(&s, &headers(None, "h:1")).is_ok());
        assert!(check(&s, &headers(Some("http://h:1"), "h:1")).is_ok());
        assert!(check(&s, &headers(Some("https://app.example"), "h:1")).is_ok());
        let err = check(&s, &headers(Some("https://evil.example"), "h:1")).unwrap_err();
        assert_eq!(err.code, ErrorCode::OriginNotAllowed);
        let mut c = Config::default();
        c.allowed_origins = vec!["*".into()];
        assert!(check(&c.validate().unwrap(), &headers(Some("https://x"), "h")).is_ok());
    }

    /// Review item 16: a name rebound to a loopback server is not served.
    #[test]
    fn a_loopback_server_answers_only_to_loopback_names_unless_told() {
        let s = Config::default().validate().unwrap();
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
        ] {
            assert!(check_host(&s, &headers(None, ok)).is_ok(), "{ok}");
        }
        let err = check_host(&s, &headers(None, "evil.example:8080")).unwrap_err();
        assert_eq!(err.code, ErrorCode::PermissionDenied);
        let mut c = Config::default();
        c.allowed_hosts = vec!["chat.example".into()];
        let s = c.validate().unwrap();
        assert!(check_host(&s, &headers(None, "chat.example:443")).is_ok());
        // Still answers to loopback names on a loopback address: only this machine uses them.
        assert!(check_host(&s, &headers(None, "localhost:8080")).is_ok());
        assert!(check_host(&s, &headers(None, "evil.example")).is_err());
        let mut c = Config::default();
        c.listen = "0.0.0.0:8080".parse().unwrap();
        assert!(check_host(&c.validate().unwrap(), &headers(None, "any.example")).is_ok());
    }
}

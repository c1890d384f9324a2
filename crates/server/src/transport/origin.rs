//! Which browser origins may open connections.

use axum::http::{header, HeaderMap};
use herald_protocol::ErrorCode;

use crate::{config::Settings, error::Failure};

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
    Err(Failure::new(
        ErrorCode::PermissionDenied,
        format!("origin {origin:?} is not allowed; add it to allowed_origins"),
    ))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

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
        assert_eq!(err.code, ErrorCode::PermissionDenied);
        let mut c = Config::default();
        c.allowed_origins = vec!["*".into()];
        assert!(check(&c.validate().unwrap(), &headers(Some("https://x"), "h")).is_ok());
    }
}

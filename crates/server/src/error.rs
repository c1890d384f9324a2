//! Failures of commands and API calls, mapped to wire codes and HTTP statuses here only.

use axum::http::StatusCode;
use herald_broker::BrokerError;
use herald_protocol::{DisconnectCode, ErrorCode};

/// A command or request that failed; the connection (if any) stays open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What kind of failure (and, unless `application` says otherwise, the wire code).
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
    /// An application's own code, from its backend's hook answer: sent instead of `code`.
    pub application: Option<u16>,
    /// The channel refused, when a request named several (an HTTP transport's): its error
    /// body says which, so a client can drop that one and keep the others.
    pub channel: Option<herald_protocol::ChannelName>,
}

impl Failure {
    /// A failure with a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            application: None,
            channel: None,
        }
    }

    /// This failure, saying it is about `channel`.
    pub fn about(mut self, channel: &herald_protocol::ChannelName) -> Self {
        self.channel = Some(channel.clone());
        self
    }

    /// A refusal by the application's backend with its own code (see
    /// [`herald_protocol::codes::APPLICATION_ERROR_CODES`]); counted as a permission
    /// refusal (403) where a status is needed.
    pub fn application(code: u16, message: impl Into<String>) -> Self {
        Self {
            application: Some(code),
            ..Self::new(ErrorCode::PermissionDenied, message)
        }
    }

    /// The code sent to the client.
    pub fn wire_code(&self) -> u16 {
        self.application.unwrap_or(self.code.code())
    }

    /// The HTTP status for this failure on the HTTP API.
    pub fn status(&self) -> StatusCode {
        match self.code {
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Unauthorized | ErrorCode::TokenExpired => StatusCode::UNAUTHORIZED,
            ErrorCode::PermissionDenied | ErrorCode::OriginNotAllowed => StatusCode::FORBIDDEN,
            ErrorCode::MethodNotFound => StatusCode::NOT_FOUND,
            ErrorCode::AlreadySubscribed | ErrorCode::BadConnectState | ErrorCode::Unsubscribed => {
                StatusCode::CONFLICT
            }
            ErrorCode::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            // Per-connection limits answer 429; the server-wide connection limit is the
            // only one a transport sees before a session exists, and says 503 there.
            ErrorCode::LimitExceeded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::BadRequest | ErrorCode::InvalidChannel | ErrorCode::NotSubscribed => {
                StatusCode::BAD_REQUEST
            }
            ErrorCode::NotAvailable
            | ErrorCode::ShuttingDown
            | ErrorCode::BackendUnavailable
            | ErrorCode::BrokerUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::OutcomeUnknown => StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::UnrecoverablePosition => StatusCode::CONFLICT,
            ErrorCode::MessageTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

impl Failure {
    /// The end of a connection whose client this failure refused after its stream began
    /// (a channel it could no longer open): the close code that gives the same advice.
    pub fn disconnect(&self) -> Disconnect {
        let code = match self.code {
            ErrorCode::Unauthorized => DisconnectCode::InvalidToken,
            ErrorCode::TokenExpired => DisconnectCode::Expired,
            ErrorCode::PermissionDenied | ErrorCode::OriginNotAllowed => DisconnectCode::Forbidden,
            ErrorCode::BackendUnavailable => DisconnectCode::BackendUnavailable,
            _ => DisconnectCode::ServerError,
        };
        Disconnect::because(code, self.message.clone())
    }
}

impl From<BrokerError> for Failure {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::Unrecoverable { .. } => {
                Self::new(ErrorCode::UnrecoverablePosition, e.to_string())
            }
            // Passing: the client tries again (on another node, if it can).
            BrokerError::Unavailable(_) => Self::new(ErrorCode::BrokerUnavailable, e.to_string()),
            // Stored and delivered, not confirmed on disk: a retry may store it twice (an
            // idempotency key makes it once).
            BrokerError::Unconfirmed(_) => Self::new(ErrorCode::OutcomeUnknown, e.to_string()),
        }
    }
}

/// Why a connection is being closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    /// Close code (for an operator's own code, the server code whose advice it shares).
    pub code: DisconnectCode,
    /// Close reason, for people (WebSocket allows at most 123 bytes; longer ones are cut).
    pub reason: String,
    /// The code an operator chose (`POST /api/disconnect`), sent instead of `code`.
    pub chosen: Option<u16>,
}

impl Disconnect {
    /// A disconnect with the code's own text as reason.
    pub fn new(code: DisconnectCode) -> Self {
        Self::because(code, code.text())
    }

    /// A disconnect with its own reason.
    pub fn because(code: DisconnectCode, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            chosen: None,
        }
    }

    /// A disconnect with a code an operator chose: a server code (3000–3999) or an
    /// application's (4000–4999). Its reconnect advice follows the code's range.
    pub fn chosen(code: u16, reason: impl Into<String>) -> Self {
        let like = if herald_protocol::reconnect_allowed(code) {
            DisconnectCode::ForceReconnect
        } else {
            DisconnectCode::Forbidden
        };
        Self {
            chosen: Some(code),
            ..Self::because(like, reason)
        }
    }

    /// The code sent to the client.
    pub fn wire_code(&self) -> u16 {
        self.chosen.unwrap_or(self.code.code())
    }

    /// The reason cut to fit a WebSocket close frame (123 bytes) on a character boundary.
    pub fn short_reason(&self) -> &str {
        let mut end = self.reason.len().min(123);
        while !self.reason.is_char_boundary(end) {
            end -= 1;
        }
        &self.reason[..end]
    }
}

impl axum::response::IntoResponse for Failure {
    fn into_response(self) -> axum::response::Response {
        use herald_protocol::{json::Json, Codec, Reply};
        // The server API and the HTTP transports answer in JSON.
        let body = Json.reply(&Reply::Refused {
            id: None,
            code: self.wire_code(),
            message: &self.message,
            channel: self.channel.as_ref(),
        });
        let mut response = (
            self.status(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        if matches!(
            self.code,
            ErrorCode::BrokerUnavailable | ErrorCode::OutcomeUnknown
        ) {
            // Worth trying again soon, on this node or another.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        if self.code == ErrorCode::OriginNotAllowed {
            // For the router's `readable_refusal`, which removes it again.
            response
                .headers_mut()
                .insert(REFUSED_ORIGIN, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

/// Marks an answer as an origin refusal, for the router's `readable_refusal` (which makes
/// it readable by the refused page, then removes the mark); never sent.
pub(crate) const REFUSED_ORIGIN: axum::http::HeaderName =
    axum::http::HeaderName::from_static("x-herald-refused-origin");

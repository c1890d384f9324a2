//! Client events (`client-…`): what a Pusher connection may send to the others on a
//! channel, and what it costs.

use herald_protocol::{
    json,
    pusher::{self, codes, Kind},
    ErrorCode,
};
use serde_json::value::RawValue;

use super::Pusher;
use crate::{error::Failure, limits::Rate};

impl Pusher {
    /// A client event: only on a private or presence channel the connection is in, only
    /// when the app allows them, at most `client_events_per_second`; never sent back to
    /// its sender. Refusals are `pusher:error`s; the connection stays.
    pub(super) async fn client_event(
        &mut self,
        event: &str,
        name: &str,
        data: &str,
    ) -> Result<(), Vec<u8>> {
        let app = self.app();
        let (enabled, rate) = (app.client_events, app.client_events_per_second);
        let refuse = |code: Option<u16>, message: &str| pusher::error(code, message);
        if !enabled {
            return Err(refuse(
                None,
                "client events are not enabled for this app (client_events)",
            ));
        }
        let kind = Kind::of(name);
        if !kind.signed() {
            return Err(refuse(
                None,
                "client events are only supported on private and presence channels",
            ));
        }
        if kind == Kind::Encrypted {
            // As Pusher: the publisher encrypts an encrypted channel's events, and a
            // client's would reach its subscribers in plaintext.
            return Err(refuse(
                None,
                "client events are not supported on encrypted channels",
            ));
        }
        let channel = self.channel(name).map_err(|e| refuse(None, &e))?;
        if !self.session.subscribed(&channel) {
            return Err(refuse(None, &format!("not subscribed to {name}")));
        }
        if data.len() > pusher::MAX_CLIENT_EVENT {
            return Err(refuse(
                None,
                &format!(
                    "client event rejected: its data is over {} bytes",
                    pusher::MAX_CLIENT_EVENT
                ),
            ));
        }
        if !self
            .more()
            .client_events
            .take(Rate::strictly_per_second(rate))
        {
            return Err(refuse(
                Some(codes::CLIENT_EVENT_RATE),
                &format!("client event rejected: at most {rate} per second"),
            ));
        }
        if self.app().posts("client_event") {
            // Each posts a webhook: charged to the address's calls to the backend, so
            // that one address's connections together cannot flood it.
            self.session
                .charge_backend()
                .map_err(|f| refuse(Some(codes::CLIENT_EVENT_RATE), &f.message))?;
        }
        let raw: &RawValue =
            serde_json::from_str(data).map_err(|e| refuse(None, &e.to_string()))?;
        let user = self.rosters().iter().find(|r| r.channel == channel);
        let user = user.map(|r| &*r.me);
        let socket_id = self.socket_id.to_string();
        let stored = pusher::stored(event, raw, user, Some(&socket_id));
        let stored: &RawValue = serde_json::from_slice(&stored).expect("stored events are JSON");
        let payload = json::payload(stored).map_err(|e| refuse(None, &e))?;
        match self.session.publish_allowed(&channel, payload).await {
            Ok(_) => {
                // Only a presence channel's client events say who sent them.
                let sender = self.rosters().iter().find(|r| r.channel == channel);
                self.webhook("client_event", || {
                    let mut hook = serde_json::json!({
                        "name": "client_event",
                        "channel": name,
                        "event": event,
                        "data": data,
                        "socket_id": socket_id,
                    });
                    if let Some(r) = sender {
                        hook["user_id"] = r.me.as_ref().into();
                    }
                    hook
                });
                Ok(())
            }
            Err(f) => Err(refuse(client_event_code(&f), &f.message)),
        }
    }
}

/// The `pusher:error` code of a client event the session refused.
fn client_event_code(f: &Failure) -> Option<u16> {
    match f.code {
        ErrorCode::TooManyRequests => Some(codes::CLIENT_EVENT_RATE),
        ErrorCode::PermissionDenied | ErrorCode::Unauthorized => Some(codes::UNAUTHORIZED),
        _ => None,
    }
}

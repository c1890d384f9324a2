//! Pusher webhooks: a Pusher app's events (`client_event`, `cache_miss`, and who occupies
//! its channels: `fronts::pusher::occupancy`), posted to the
//! app's `webhook_url` as Pusher posts them (`{"time_ms": …, "events": […]}`, signed
//! `X-Pusher-Signature: HMAC-SHA256(secret, body)` beside `X-Pusher-Key`), through the
//! same stored, at-least-once, in-order log as the events hook ([`super::events`]).

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::Serialize;
use serde_json::value::RawValue;

use super::events::{now_ms, Delivery, Sink};
use crate::config::PusherApp;

/// How long a webhook post may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One app's webhook.
#[derive(Debug)]
pub struct PusherWebhook {
    url: reqwest::Url,
    key: String,
    secret: String,
    client: reqwest::Client,
}

impl PusherWebhook {
    /// The webhook of `app`, if it has one.
    pub fn of(app: &PusherApp) -> Option<Self> {
        let url = app.webhook_url.as_deref()?;
        Some(Self {
            url: reqwest::Url::parse(url).expect("checked by PusherConfig::check"),
            key: app.key.clone(),
            secret: app.secret.clone(),
            client: reqwest::Client::new(),
        })
    }
}

#[derive(Serialize)]
struct Body<'a> {
    time_ms: u64,
    events: &'a [Box<RawValue>],
}

#[async_trait::async_trait]
impl Sink for PusherWebhook {
    async fn post(&self, delivery: &Delivery) -> Result<(), String> {
        let body = serde_json::to_vec(&Body {
            time_ms: now_ms(),
            events: &delivery.events,
        })
        .expect("webhooks serialise");
        let mut mac =
            Hmac::<sha2::Sha256>::new_from_slice(self.secret.as_bytes()).expect("any key");
        mac.update(&body);
        let signature: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let sent = self
            .client
            .post(self.url.clone())
            .timeout(TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("X-Pusher-Key", &self.key)
            .header("X-Pusher-Signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|e| format!("the webhook request failed: {e}"))?;
        if !sent.status().is_success() {
            return Err(format!("the webhook answered HTTP {}", sent.status()));
        }
        Ok(())
    }
}

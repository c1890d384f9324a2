//! One hook's HTTP caller: a bounded number of requests in flight over kept-alive
//! connections, one timeout for the whole exchange, and a circuit that stops asking a
//! backend that keeps failing.
//!
//! Why each bound: a slow backend must not make Herald hold a growing pile of requests
//! (each one a waiting client), and a dead one must not cost every client the full timeout.
//! The circuit opens after `circuit_failures` failures in a row; while it is open callers
//! fail at once; after `circuit_open` requests go through again, and the first success
//! closes it.

use std::{
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::config::HooksConfig;

/// Why a hook gave no usable answer, or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookError {
    /// The backend answered with an error: its code and message.
    Refused {
        /// Herald's error code, or an application code.
        code: u16,
        /// For people.
        message: String,
    },
    /// The backend failed: no answer in time, a status other than 200, an answer that is
    /// not a hook answer, or the circuit is open.
    Failed(String),
}

/// A hook answer: `{"result": …}` or `{"error": {"code": N, "message": "…"}}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer<R> {
    #[serde(default = "none")]
    result: Option<R>,
    #[serde(default)]
    error: Option<ErrorAnswer>,
}

fn none<R>() -> Option<R> {
    None
}

#[derive(Deserialize)]
struct ErrorAnswer {
    code: u16,
    #[serde(default)]
    message: String,
}

/// Calls one hook address.
#[derive(Debug)]
pub struct Caller {
    name: &'static str,
    url: reqwest::Url,
    client: reqwest::Client,
    timeout: Duration,
    max_response: usize,
    slots: Semaphore,
    circuit_failures: u32,
    circuit_open: Duration,
    /// Failures in a row.
    failures: AtomicU32,
    /// Until when (milliseconds since `epoch`) the circuit stays open.
    open_until: AtomicU64,
    epoch: Instant,
    /// Where its durations and failures are counted, once the node's metrics exist.
    counted: std::sync::OnceLock<crate::metrics::HookCounters>,
    /// Its failures' log lines.
    failure_log: crate::throttle::Throttle,
}

impl Caller {
    /// A caller of `url` for the hook `name`, sharing `client`'s connection pool.
    pub fn new(name: &'static str, url: &str, client: reqwest::Client, c: &HooksConfig) -> Self {
        Self {
            name,
            url: reqwest::Url::parse(url).expect("checked by HooksConfig::check"),
            client,
            timeout: c.timeout,
            max_response: c.max_response_size,
            slots: Semaphore::new(c.max_in_flight),
            circuit_failures: c.circuit_failures,
            circuit_open: c.circuit_open,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            epoch: Instant::now(),
            counted: std::sync::OnceLock::new(),
            failure_log: crate::throttle::Throttle::new(10),
        }
    }

    /// The hook's name (`connect`, `subscribe`, …).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Counts this hook's calls in `counters` from now on.
    pub fn count_into(&self, counters: crate::metrics::HookCounters) {
        let _ = self.counted.set(counters);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Posts `request` as JSON and reads the answer's `result`.
    pub async fn call<R: DeserializeOwned>(
        &self,
        request: &impl Serialize,
    ) -> Result<R, HookError> {
        let now = self.now_ms();
        if now < self.open_until.load(Ordering::Relaxed) {
            return Err(HookError::Failed(format!(
                "the {} hook failed {} times in a row; not asked again for a moment",
                self.name, self.circuit_failures
            )));
        }
        let body = serde_json::to_vec(request).expect("hook requests serialise");
        let started = Instant::now();
        let answered = tokio::time::timeout(self.timeout, self.exchange(body)).await;
        let answer = match answered {
            Ok(Ok(bytes)) => parse_answer::<R>(&bytes),
            Ok(Err(e)) => Err(HookError::Failed(e)),
            Err(_) => Err(HookError::Failed(format!(
                "no answer within {:?}",
                self.timeout
            ))),
        };
        if let Some(counted) = self.counted.get() {
            counted.called(
                started.elapsed(),
                matches!(answer, Err(HookError::Failed(_))),
            );
        }
        match &answer {
            Err(HookError::Failed(why)) => {
                // Clients can make a failing backend fail as often as they ask: one line
                // per 10 s per hook, saying how many failed meanwhile.
                if let Some(failed) = self.failure_log.due() {
                    tracing::warn!(hook = self.name, url = %self.url, failed, "hook failed: {why}");
                }
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= self.circuit_failures {
                    let until = self.now_ms() + self.circuit_open.as_millis() as u64;
                    self.open_until.store(until, Ordering::Relaxed);
                }
            }
            _ => self.failures.store(0, Ordering::Relaxed),
        }
        answer
    }

    /// One request, waiting for a free slot first; the body read is bounded.
    async fn exchange(&self, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let _slot = self.slots.acquire().await.expect("never closed");
        let mut response = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("request failed: {}", cause(&e)))?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(format!(
                "answered HTTP {} (hooks answer 200 with a result or an error)",
                response.status()
            ));
        }
        let mut read = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("answer cut short: {}", cause(&e)))?
        {
            if read.len() + chunk.len() > self.max_response {
                return Err(format!(
                    "answer longer than hooks.max_response_size ({} bytes)",
                    self.max_response
                ));
            }
            read.extend_from_slice(&chunk);
        }
        Ok(read)
    }
}

/// The innermost cause of a request error, which says what actually went wrong
/// ("Connection refused" rather than "error sending request").
fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = e;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

/// A hook's answer: its `result` as `R`, its refusal, or why it is neither.
pub fn parse_answer<R: DeserializeOwned>(bytes: &[u8]) -> Result<R, HookError> {
    let answer: Answer<R> = serde_json::from_slice(bytes).map_err(|e| {
        HookError::Failed(format!(
            "answer is not {{\"result\": …}} or {{\"error\": {{\"code\": N, \"message\": …}}}}: {e}"
        ))
    })?;
    match (answer.result, answer.error) {
        (Some(result), None) => Ok(result),
        (None, Some(e)) => Err(HookError::Refused {
            code: e.code,
            message: e.message,
        }),
        _ => Err(HookError::Failed(
            "answer has both or neither of `result` and `error`".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct R {
        user: String,
    }

    #[test]
    fn answers_are_a_result_or_an_error_never_both() {
        assert_eq!(
            parse_answer::<R>(br#"{"result":{"user":"a"}}"#).unwrap(),
            R { user: "a".into() }
        );
        assert_eq!(
            parse_answer::<R>(br#"{"error":{"code":103,"message":"no"}}"#).unwrap_err(),
            HookError::Refused {
                code: 103,
                message: "no".into()
            }
        );
        for garbage in [
            &b"{}"[..],
            br#"{"result":{"user":"a"},"error":{"code":1}}"#,
            br#"{"result":{"nope":1}}"#,
            b"<html>",
            br#"{"result":{"user":"a"},"extra":1}"#,
        ] {
            assert!(
                matches!(parse_answer::<R>(garbage), Err(HookError::Failed(_))),
                "{}",
                String::from_utf8_lossy(garbage)
            );
        }
    }
}

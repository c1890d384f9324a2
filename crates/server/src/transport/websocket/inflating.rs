//! What inflating a client's compressed messages may cost one connection.
//!
//! A compressed message costs the server the bytes it inflates to, not the bytes sent: 100
//! bytes can inflate to the whole message limit, so a client sending such messages flat
//! out held a core, though each was refused once inflated (its commands over the rate, or
//! no command at all). So a connection has a budget of inflated bytes a second, and a
//! message is read (and inflated) only while the budget is not spent: past it the
//! connection reads nothing more until the budget has refilled, and TCP makes the client
//! wait. Every compressed message costs at least [`LEAST_CHARGE`], so that a flood of tiny
//! ones is paced too.

use std::time::{Duration, Instant};

/// Inflated bytes a second a connection may cost, in messages of the limit: bursts of
/// twice this pass. At the default limit (64 KiB), 512 KiB a second: past what a browser
/// sends (Pusher's client events: 10 a second of at most 10 KB), at a few thousandths of
/// a core in a release build.
pub const LIMITS_PER_SECOND: usize = 8;

/// What every compressed message costs at least, however small it inflates.
pub const LEAST_CHARGE: usize = 1024;

/// A connection's inflate budget: a bucket of bytes, which may go into debt by the one
/// message inflated while it still had some.
#[derive(Debug)]
pub struct Inflating {
    /// Bytes a second.
    rate: f64,
    tokens: f64,
    refilled: Instant,
}

impl Inflating {
    /// A full budget for messages of at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        let rate = (limit * LIMITS_PER_SECOND) as f64;
        Self {
            rate,
            tokens: 2.0 * rate,
            refilled: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.duration_since(self.refilled).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(2.0 * self.rate);
        self.refilled = now;
    }

    /// Charges `messages` inflated to `bytes` in all.
    pub fn charge(&mut self, (messages, bytes): (usize, usize), now: Instant) {
        if messages == 0 {
            return;
        }
        self.refill(now);
        self.tokens -= bytes.max(messages * LEAST_CHARGE) as f64;
    }

    /// How long the connection must wait before it reads again; none while the budget is
    /// not spent.
    pub fn wait(&mut self, now: Instant) -> Option<Duration> {
        self.refill(now);
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / self.rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_inflates_its_rate_after_its_burst() {
        let start = Instant::now();
        let mut budget = Inflating::new(1024);
        // The burst: two seconds' worth (16 KiB) before any wait.
        for _ in 0..16 {
            assert_eq!(budget.wait(start), None);
            budget.charge((1, 1024), start);
        }
        let wait = budget.wait(start);
        assert_eq!(wait, None, "exactly spent, not in debt");
        budget.charge((1, 1024), start);
        let wait = budget.wait(start).expect("in debt");
        assert!((wait.as_secs_f64() - 1.0 / 8.0).abs() < 1e-6, "{wait:?}");
        assert_eq!(budget.wait(start + wait), None, "refilled at its rate");
        // Tiny messages cost at least LEAST_CHARGE each.
        let mut budget = Inflating::new(1024);
        budget.charge((100, 100), start);
        assert!(budget.wait(start).is_some(), "100 messages cost 100 KiB");
        assert!(budget.wait(start).unwrap() > Duration::from_secs(10));
    }
}

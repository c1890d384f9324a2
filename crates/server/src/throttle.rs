//! Log lines that a client can cause, at most one per window: a hostile client must not fill
//! the log (or spend the server's time writing it), and the operator still learns how many
//! happened meanwhile.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counts occurrences and says when one is due for a log line.
#[derive(Debug)]
pub struct Throttle {
    every_seconds: u64,
    /// Occurrences since the last line.
    count: AtomicU64,
    /// When the last line was written (seconds since the Unix epoch).
    at: AtomicU64,
}

impl Throttle {
    /// At most one line per `every_seconds`.
    pub const fn new(every_seconds: u64) -> Self {
        Self {
            every_seconds,
            count: AtomicU64::new(0),
            at: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence; `Some(n)` when a line is due, `n` being the occurrences it
    /// stands for (this one included).
    pub fn due(&self) -> Option<u64> {
        let count = self.count.fetch_add(1, Relaxed) + 1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.at.load(Relaxed);
        if now < last + self.every_seconds
            || self
                .at
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_err()
        {
            return None;
        }
        self.count.fetch_sub(count, Relaxed);
        Some(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_window_counting_the_rest() {
        let t = Throttle::new(3600);
        assert_eq!(t.due(), Some(1));
        for _ in 0..5 {
            assert_eq!(t.due(), None);
        }
        // The window is not over: the next line, when due, will say 6 more.
        assert_eq!(t.count.load(Relaxed), 5);
    }
}

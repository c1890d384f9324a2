//! The `date` header of answers written without hyper (the lean path's, the hub's long-poll
//! answers): an origin server with a clock sends one with every answer (RFC 9110, 6.6.1),
//! as hyper does with the rest.

use std::{cell::Cell, time::SystemTime};

/// Length of an IMF-fixdate (`Sun, 29 Nov 2026 03:23:58 GMT`).
const LENGTH: usize = 29;

thread_local! {
    /// The second last asked for on this thread, and its date, formatted once.
    static NOW: Cell<(u64, [u8; LENGTH])> = const { Cell::new((u64::MAX, [0; LENGTH])) };
}

/// Now, as an HTTP date: formatted once a second per thread.
pub fn now() -> [u8; LENGTH] {
    let now = SystemTime::now();
    let second = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (at, date) = NOW.get();
    if at == second {
        return date;
    }
    let mut date = [0; LENGTH];
    let text = httpdate::fmt_http_date(now);
    // Every date from 1 A.D. to 9999 has this length; a clock past that gets a cut date.
    let n = text.len().min(LENGTH);
    date[..n].copy_from_slice(&text.as_bytes()[..n]);
    NOW.set((second, date));
    date
}

/// `date: …\r\n`, appended to a head being written.
pub fn write_header(head: &mut Vec<u8>) {
    head.extend_from_slice(b"date: ");
    head.extend_from_slice(&now());
    head.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    #[test]
    fn is_an_http_date() {
        let date = super::now();
        let text = std::str::from_utf8(&date).unwrap();
        let first = httpdate::parse_http_date(text).unwrap();
        let again = super::now();
        let again = httpdate::parse_http_date(std::str::from_utf8(&again).unwrap()).unwrap();
        assert!(again >= first);
    }
}

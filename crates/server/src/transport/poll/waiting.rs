//! The one store of sessions that wait between their clients' requests, for every
//! transport made of requests: Herald's long-poll parks its session here between answers
//! ([`super::Parked`]), and the Phoenix front's long-poll keeps its sessions here between
//! `GET`s. Each is found by a [`Key`] its client sends back, and lives until a time its
//! transport sets (and may move on); one sweeper drops those whose time has passed, and
//! every one at shutdown.

use std::{
    any::Any,
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
    sync::{Arc, Weak},
    time::Duration,
};

use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Reading;

/// The key a waiting session is found by, which its client sends back: 128 random bits,
/// written as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(u128);

/// Hashes a [`Key`] by taking 64 of its bits: they are random already (a key a client makes
/// up finds nothing, whatever bucket it lands in), so there is nothing for SipHash to add.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Key {
    /// A new key, for a session parked for the first time.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the operating system's random generator works");
        Self(u128::from_le_bytes(bytes))
    }

    /// The key a client sent; `None` if it cannot be one.
    pub fn parse(text: &str) -> Option<Self> {
        // A digit at a time, without the standard library's checks and radix arithmetic:
        // each long-poll that takes a session up reads one.
        if text.len() != 32 {
            return None;
        }
        let mut key = 0u128;
        for b in text.bytes() {
            let nibble = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                b'A'..=b'F' => b - b'A' + 10,
                _ => return None,
            };
            key = key << 4 | u128::from(nibble);
        }
        Some(Self(key))
    }

    /// The key's 32 hex digits, made without allocating (one per long-poll answer).
    pub fn hex(&self) -> KeyHex {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, digit) in out.iter_mut().enumerate() {
            *digit = DIGITS[(self.0 >> (124 - 4 * i) & 0xf) as usize];
        }
        KeyHex(out)
    }
}

/// A key as its 32 hex digits.
pub struct KeyHex([u8; 32]);

impl KeyHex {
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.hex().as_str())
    }
}

/// The node's one store: each transport keeps its own kind of session in it, and finds
/// only its own under a key.
pub type Store = Waiting<Box<dyn Any + Send>>;

/// A waiting session and when it is dropped.
#[derive(Debug)]
struct Slot<V> {
    value: V,
    until: Instant,
}

type Slots<V> = HashMap<Key, Slot<V>, BuildHasherDefault<KeyHasher>>;

#[derive(Debug)]
struct Inner<V> {
    slots: Mutex<Slots<V>>,
}

impl<V> Inner<V> {
    fn count(&self) -> usize {
        self.slots.lock().len()
    }
}

/// Sessions waiting for their clients' next requests, by key.
#[derive(Debug)]
pub struct Waiting<V>(Arc<Inner<V>>);

impl<V> Clone for Waiting<V> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<V: Send + 'static> Waiting<V> {
    /// An empty store whose sweeper (inside a runtime) drops what waited too long, and
    /// everything at `shutdown`; `count`, if given, reads how many wait.
    pub fn new(shutdown: CancellationToken, count: Option<&Reading>) -> Self {
        let waiting = Self(Arc::new(Inner {
            slots: Mutex::default(),
        }));
        if let Some(count) = count {
            count.follow(Arc::downgrade(&waiting.0), Inner::count);
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(sweep(Arc::downgrade(&waiting.0), shutdown));
        }
        waiting
    }

    /// Keeps `value` under `key` until `until` (a value it replaces is dropped).
    pub fn insert(&self, key: Key, value: V, until: Instant) {
        let replaced = self.0.slots.lock().insert(key, Slot { value, until });
        // Outside the lock: a session's drop takes other locks and spawns its leave.
        drop(replaced);
    }

    /// Takes what waits under `key` if its time has not passed and `fits` says so;
    /// otherwise it stays (until its time).
    pub fn take(&self, key: Key, fits: impl FnOnce(&V) -> bool) -> Option<V> {
        let mut slots = self.0.slots.lock();
        let slot = slots.get(&key)?;
        if slot.until <= Instant::now() || !fits(&slot.value) {
            return None;
        }
        slots.remove(&key).map(|s| s.value)
    }

    /// What `look` finds in what waits under `key`, if its time has not passed; if it
    /// finds something, the wait is moved on to `until` at least (its client is there).
    pub fn look<R>(
        &self,
        key: Key,
        until: Instant,
        look: impl FnOnce(&V) -> Option<R>,
    ) -> Option<R> {
        let mut slots = self.0.slots.lock();
        let slot = slots.get_mut(&key)?;
        if slot.until <= Instant::now() {
            return None;
        }
        let found = look(&slot.value)?;
        slot.until = slot.until.max(until);
        Some(found)
    }

    /// Drops what waits under `key`, if `is` says it is what the caller means.
    pub fn forget(&self, key: Key, is: impl FnOnce(&V) -> bool) {
        let gone = {
            let mut slots = self.0.slots.lock();
            match slots.get(&key) {
                Some(slot) if is(&slot.value) => slots.remove(&key),
                _ => None,
            }
        };
        drop(gone);
    }
}

/// Drops what waited past its time (every second), and everything at shutdown.
async fn sweep<V>(waiting: Weak<Inner<V>>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            () = shutdown.cancelled() => true,
        };
        let Some(inner) = waiting.upgrade() else {
            return;
        };
        let now = Instant::now();
        // Dropped outside the lock: a session's drop takes other locks and spawns its leave.
        let gone: Vec<Slot<V>> = {
            let mut slots = inner.slots.lock();
            if stopping {
                slots.drain().map(|(_, s)| s).collect()
            } else {
                let expired: Vec<Key> = slots
                    .iter()
                    .filter(|(_, s)| s.until <= now)
                    .map(|(k, _)| *k)
                    .collect();
                expired.iter().filter_map(|k| slots.remove(k)).collect()
            }
        };
        drop(gone);
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_and_nothing_else_is_one() {
        let key = Key::random();
        assert_eq!(Key::parse(&key.to_string()), Some(key));
        assert_eq!(key.to_string(), format!("{:032x}", key.0));
        assert_eq!(Key(0xf).to_string(), format!("{}f", "0".repeat(31)));
        assert_eq!(Key::parse("abc"), None);
        assert_eq!(Key::parse(&"g".repeat(32)), None);
        assert_eq!(Key::parse(&"+".repeat(32)), None);
        assert_eq!(Key::parse(&format!("-{}", "f".repeat(31))), None);
        assert_eq!(Key::parse(&"é".repeat(16)), None);
        let key = Key::parse("0123456789abcdefFEDCBA9876543210").unwrap();
        assert_eq!(key.0, 0x0123456789abcdef_fedcba9876543210);
    }

    /// Waits (at most 5 s) until `waiting` holds `n`.
    async fn until_count<V>(waiting: &Waiting<V>, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while waiting.0.count() != n {
            assert!(
                Instant::now() < deadline,
                "{} wait, not {n}",
                waiting.0.count()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn what_waits_is_found_until_its_time_and_swept_after() {
        let shutdown = CancellationToken::new();
        let waiting = Waiting::new(shutdown.clone(), None);
        let (a, b, c) = (Key::random(), Key::random(), Key::random());
        let later = Instant::now() + Duration::from_secs(60);
        waiting.insert(a, "a", later);
        waiting.insert(b, "b", later);
        assert_eq!(waiting.take(a, |v| *v == "b"), None, "not what was meant");
        assert_eq!(waiting.take(a, |v| *v == "a"), Some("a"));
        assert_eq!(waiting.take(a, |_| true), None, "taken");
        waiting.forget(b, |v| *v == "a");
        assert_eq!(waiting.look(b, later, |v| Some(*v)), Some("b"));
        // Past its time: found by nobody, then swept.
        let past = Instant::now();
        waiting.insert(c, "c", past);
        assert_eq!(waiting.look(c, past, |v| Some(*v)), None);
        assert_eq!(waiting.take(c, |_| true), None);
        until_count(&waiting, 1).await;
        // A request that looks moves its time on.
        let (d, soon) = (Key::random(), Instant::now() + Duration::from_millis(100));
        waiting.insert(d, "d", soon);
        assert_eq!(waiting.look(d, later, |v| Some(*v)), Some("d"));
        tokio::time::sleep_until(soon).await;
        assert_eq!(waiting.take(d, |_| true), Some("d"));
        shutdown.cancel();
        until_count(&waiting, 0).await;
    }
}

//! A TCP relay in front of a remote store's server (Redis, NATS) that fails the way
//! networks do: silently (every byte swallowed, nothing closed), abruptly (every connection
//! closed at once), or slowly (every byte delayed). For the remote brokers' tests.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

/// The relay; it runs as long as the test.
#[derive(Debug)]
pub struct Partition {
    port: u16,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Connections accepted so far; those numbered below `cut_below` are silenced.
    accepted: AtomicU64,
    cut_below: AtomicU64,
    /// Every connection, open or new, swallows what it gets (see [`Partition::blackhole`]).
    dark: AtomicBool,
    /// How long every byte waits before it is passed on, in milliseconds.
    latency_ms: AtomicU64,
    /// Both ends of every connection, to close them at once (see [`Partition::reset`]).
    open: Mutex<Vec<(TcpStream, TcpStream)>>,
    /// Byte strings replaced in what the server sends (see [`Partition::rewrite_ports`]).
    rewrites: Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl Partition {
    /// Starts relaying a free loopback port to `upstream` on 127.0.0.1.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start_to(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        let state = Arc::new(State::default());
        let relay = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let id = relay.accepted.fetch_add(1, SeqCst);
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    relay.open.lock().expect("not poisoned").push((c, s));
                }
                for (from, to, answers) in [
                    (client.try_clone(), server.try_clone(), false),
                    (server.try_clone(), client.try_clone(), true),
                ] {
                    let (Ok(from), Ok(to)) = (from, to) else {
                        continue;
                    };
                    pass_on(id, from, to, answers, relay.clone());
                }
            }
        });
        Self { port, state }
    }

    /// The relay's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Silences every connection open now; later ones pass.
    pub fn cut(&self) {
        self.state
            .cut_below
            .store(self.state.accepted.load(SeqCst), SeqCst);
    }

    /// Silences every connection, open now or made later, until [`Partition::heal`]: the
    /// way to Redis is gone, and nothing says so.
    pub fn blackhole(&self) {
        self.state.dark.store(true, SeqCst);
    }

    /// Lets new connections through again; those open during the blackhole stay silent
    /// (what they carried is lost), so clients must notice and reconnect.
    pub fn heal(&self) {
        self.cut();
        self.state.dark.store(false, SeqCst);
    }

    /// Closes every open connection at once, both ways (as a reset or a restarted
    /// middlebox would); new ones pass.
    pub fn reset(&self) {
        for (client, server) in self.state.open.lock().expect("not poisoned").drain(..) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }

    /// From now on, the server's answers name each port `from` as `to` instead (same
    /// number of digits), as RESP writes them: `:PORT` (an integer, or the end of
    /// `host:port` in a redirection) and a bulk string of the port alone. A client that
    /// learns the servers' addresses from them (a Sentinel's `get-master-addr-by-name`, a
    /// cluster's slot map) then reaches them through relays, which a test can cut for it
    /// alone.
    ///
    /// # Panics
    /// When a pair's ports differ in length.
    pub fn rewrite_ports(&self, pairs: &[(u16, u16)]) {
        let mut rewrites = Vec::new();
        for (from, to) in pairs {
            let (from, to) = (from.to_string(), to.to_string());
            assert_eq!(from.len(), to.len(), "ports of one length");
            rewrites.push((
                format!(":{from}").into_bytes(),
                format!(":{to}").into_bytes(),
            ));
            let bulk = |p: &str| format!("${}\r\n{p}\r", p.len()).into_bytes();
            rewrites.push((bulk(&from), bulk(&to)));
        }
        *self.state.rewrites.lock().expect("not poisoned") = rewrites;
    }

    /// Delays every byte, both ways, by `latency` from now on (zero: none).
    pub fn latency(&self, latency: Duration) {
        self.state
            .latency_ms
            .store(latency.as_millis() as u64, SeqCst);
    }
}

/// Copies `from` to `to` for connection `id`: what is read is swallowed while the
/// connection is silenced, otherwise written once the latency asked for has passed since
/// it was read (a second thread writes, so a delay never slows the reading down).
fn pass_on(id: u64, mut from: TcpStream, mut to: TcpStream, answers: bool, state: Arc<State>) {
    let (chunks, delayed) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reading = state.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        let mut carry = Vec::new();
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                // Swallowed: the peer hears nothing, and no close either.
                Ok(_) if id < reading.cut_below.load(SeqCst) || reading.dark.load(SeqCst) => {}
                Ok(n) => {
                    let chunk = if answers {
                        let rewrites = reading.rewrites.lock().expect("not poisoned");
                        rewrite(&rewrites, &mut carry, &buf[..n])
                    } else {
                        buf[..n].to_vec()
                    };
                    if chunks.send((Instant::now(), chunk)).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (read_at, chunk) in delayed {
            let latency = Duration::from_millis(state.latency_ms.load(SeqCst));
            let due = read_at + latency;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                return;
            }
        }
        if id >= state.cut_below.load(SeqCst) {
            let _ = to.shutdown(Shutdown::Write);
        }
    });
}

/// What `carry` (held back from the last chunk) and `chunk` read as once every `from` is
/// replaced by its `to` (of the same length), but for a tail that may begin a `from`: held
/// back in `carry` until the next chunk says. A complete RESP answer ends in `\r\n`, which
/// begins none, so nothing is held back at the end of one.
fn rewrite(pairs: &[(Vec<u8>, Vec<u8>)], carry: &mut Vec<u8>, chunk: &[u8]) -> Vec<u8> {
    carry.extend_from_slice(chunk);
    let mut out = std::mem::take(carry);
    for (from, to) in pairs {
        let mut at = 0;
        while let Some(i) = (out.get(at..).unwrap_or_default())
            .windows(from.len())
            .position(|w| w == from.as_slice())
        {
            out[at + i..at + i + from.len()].copy_from_slice(to);
            at += i + from.len();
        }
    }
    let begins_one = |k: usize| {
        let tail = &out[out.len() - k..];
        pairs
            .iter()
            .any(|(from, _)| from.len() > k && from.starts_with(tail))
    };
    let longest = pairs.iter().map(|(f, _)| f.len()).max().unwrap_or(0);
    let hold = (1..longest.min(out.len() + 1))
        .rev()
        .find(|k| begins_one(*k))
        .unwrap_or(0);
    *carry = out.split_off(out.len() - hold);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_rewritten_across_chunks_and_nothing_else_is_held() {
        let pairs = vec![(b":12345".to_vec(), b":54321".to_vec())];
        let mut carry = Vec::new();
        let mut out = rewrite(&pairs, &mut carry, b"*1\r\n:123");
        assert_eq!(out, b"*1\r\n");
        out.extend(rewrite(&pairs, &mut carry, b"45\r\n"));
        assert_eq!(out, b"*1\r\n:54321\r\n");
        assert!(carry.is_empty());
        assert_eq!(rewrite(&pairs, &mut carry, b"+OK\r\n"), b"+OK\r\n");
    }
}

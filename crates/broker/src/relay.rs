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
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(from), Ok(to)) = (from, to) else {
                        continue;
                    };
                    pass_on(id, from, to, relay.clone());
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
fn pass_on(id: u64, mut from: TcpStream, mut to: TcpStream, state: Arc<State>) {
    let (chunks, delayed) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reading = state.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                // Swallowed: the peer hears nothing, and no close either.
                Ok(_) if id < reading.cut_below.load(SeqCst) || reading.dark.load(SeqCst) => {}
                Ok(n) => {
                    if chunks.send((Instant::now(), buf[..n].to_vec())).is_err() {
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

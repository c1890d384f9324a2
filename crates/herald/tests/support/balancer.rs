//! A TCP load balancer for tests that routes as nginx or a Kubernetes Service does behind a
//! readiness probe: each new connection goes to the next node whose `/readyz` answered 200
//! at the last look (every 100 ms), or, while pinned, to one node. A connection stays with
//! the node it was given until either side closes it.

use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    time::Duration,
};

pub struct Balancer {
    port: u16,
    state: Arc<State>,
}

struct State {
    nodes: Vec<SocketAddr>,
    ready: Vec<AtomicBool>,
    pinned: Mutex<Option<usize>>,
    next: AtomicUsize,
    stopped: AtomicBool,
}

impl Balancer {
    /// Balances over `nodes` (`http://127.0.0.1:PORT`).
    pub fn start(nodes: &[&str]) -> Self {
        let nodes: Vec<SocketAddr> = nodes
            .iter()
            .map(|u| u.trim_start_matches("http://").parse().unwrap())
            .collect();
        let state = Arc::new(State {
            ready: nodes.iter().map(|_| AtomicBool::new(true)).collect(),
            nodes,
            pinned: Mutex::new(None),
            next: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        });
        let probe = state.clone();
        std::thread::spawn(move || {
            while !probe.stopped.load(SeqCst) {
                for (node, ready) in probe.nodes.iter().zip(&probe.ready) {
                    ready.store(is_ready(*node), SeqCst);
                }
                // The probe's period, as a load balancer's health check has one.
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let routing = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if routing.stopped.load(SeqCst) {
                    return;
                }
                let node = routing.choose();
                let Ok(server) = TcpStream::connect(node) else {
                    continue;
                };
                relay(client, server);
            }
        });
        Self { port, state }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends every new connection to node `index` (whatever its readiness), or with
    /// `None` back to the ready ones in turn.
    pub fn pin(&self, index: Option<usize>) {
        *self.state.pinned.lock().unwrap() = index;
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.state.stopped.store(true, SeqCst);
    }
}

impl State {
    fn choose(&self) -> SocketAddr {
        if let Some(i) = *self.pinned.lock().unwrap() {
            return self.nodes[i];
        }
        let n = self.nodes.len();
        let start = self.next.fetch_add(1, SeqCst);
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.ready[i].load(SeqCst))
            .map_or(self.nodes[start % n], |i| self.nodes[i])
    }
}

/// Whether `node` answers `GET /readyz` with 200 within half a second.
fn is_ready(node: SocketAddr) -> bool {
    let asked = || -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&node, Duration::from_millis(500))?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head)?;
        Ok(&head == b"HTTP/1.1 200")
    };
    asked().unwrap_or(false)
}

/// Copies both ways until either side closes.
fn relay(client: TcpStream, server: TcpStream) {
    for (from, to) in [
        (client.try_clone(), server.try_clone()),
        (server.try_clone(), client.try_clone()),
    ] {
        let (Ok(mut from), Ok(mut to)) = (from, to) else {
            continue;
        };
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    }
}

//! A real `redis-server` for tests: started on a free loopback port in a temporary
//! directory, stopped when dropped.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

/// A running `redis-server` that lives as long as this value.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `redis-server` (from `PATH`) and returns once it accepts connections.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not start: tests that need Redis cannot run.
    pub fn start() -> Self {
        Self::try_start().expect("redis-server must be installed (apt-get install redis-server)")
    }

    /// Like [`RedisServer::start`], for tools: an error instead of a panic.
    pub fn try_start() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let child = spawn(dir.path(), port)?;
        Ok(Self {
            child,
            port,
            _dir: dir,
        })
    }

    /// Writes its data to its dump file now (`SAVE`).
    pub fn save(&self) {
        let status = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "SAVE"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli must be installed with redis-server");
        assert!(status.success(), "redis-cli SAVE failed");
    }

    /// Kills it (SIGKILL: nothing saved) and starts it again on the same port and
    /// directory. It loads its dump file: its data goes back to the last
    /// [`save`](RedisServer::save), as after a restart from an older dump (or a failover to
    /// a replica that lagged).
    pub fn restart_from_dump(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self._dir.path(), self.port).expect("redis-server restarts");
    }

    /// Its process id (for CPU and memory figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Closes every client connection (as a Redis failover or a network cut would), keeping
    /// the data.
    pub fn kill_clients(&self) {
        let status = Command::new("redis-cli")
            .args([
                "-p",
                &self.port.to_string(),
                "CLIENT",
                "KILL",
                "TYPE",
                "pubsub",
            ])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli must be installed with redis-server");
        assert!(status.success(), "redis-cli CLIENT KILL failed");
    }
}

/// Starts `redis-server` on `port`, keeping its files in `dir` (where it loads a dump from,
/// if there is one), and returns once it accepts connections.
fn spawn(dir: &std::path::Path, port: u16) -> std::io::Result<Child> {
    let mut child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("Ready to accept connections") => break,
            Some(Ok(_)) => {}
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::other(
                    "redis-server exited before it was ready",
                ));
            }
        }
    }
    // Keep draining the log so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Ok(child)
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis URL on a loopback port nobody listens on: for the unreachable-Redis paths.
pub fn unreachable_url() -> String {
    format!(
        "redis://127.0.0.1:{}",
        free_port().expect("a free loopback port")
    )
}

/// A loopback port nobody listens on right now.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A TCP relay in front of a [`RedisServer`] that can cut its connections silently, as a
/// network partition does: [`Partition::cut`] makes every connection open at that moment
/// swallow what either side sends, without closing it, while new connections pass.
#[derive(Debug)]
pub struct Partition {
    port: u16,
    /// Connections accepted so far; those numbered below `cut_below` are silenced.
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    cut_below: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Partition {
    /// Starts relaying a free loopback port to `redis`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(redis: &RedisServer) -> Self {
        use std::sync::{
            atomic::{AtomicU64, Ordering},
            Arc,
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        let (accepted, cut_below) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let upstream = redis.port();
        let (count, cut) = (accepted.clone(), cut_below.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let id = count.fetch_add(1, Ordering::SeqCst);
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(mut from), Ok(mut to)) = (from, to) else {
                        continue;
                    };
                    let cut = cut.clone();
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                // Swallowed: the peer hears nothing, and no close either.
                                Ok(_) if id < cut.load(Ordering::SeqCst) => {}
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        if id >= cut.load(Ordering::SeqCst) {
                            let _ = to.shutdown(std::net::Shutdown::Write);
                        }
                    });
                }
            }
        });
        Self {
            port,
            accepted,
            cut_below,
        }
    }

    /// `redis://127.0.0.1:PORT` through the relay.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Silences every connection open now; later ones pass.
    pub fn cut(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.cut_below.store(self.accepted.load(SeqCst), SeqCst);
    }
}

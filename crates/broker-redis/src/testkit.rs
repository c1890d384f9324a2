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
        let mut child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
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
        Ok(Self {
            child,
            port,
            _dir: dir,
        })
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

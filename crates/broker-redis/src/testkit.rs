//! A real `redis-server` for tests: started on a free loopback port in a temporary
//! directory, stopped when dropped.

mod cluster;
mod partition;
mod sentinel;

pub use cluster::ClusterSet;
pub use partition::Partition;
pub use sentinel::{SentinelSet, MASTER_NAME};

use herald_broker::certs::make_certificates;
pub use herald_broker::certs::TlsFiles;
use herald_broker::ports::{free_port, on_free_port};

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
    /// Its certificates, when it speaks TLS only, and whether clients must prove themselves.
    tls: Option<(TlsFiles, bool)>,
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
        let (child, port) = on_free_port(|port| spawn(dir.path(), port, None))?;
        Ok(Self {
            child,
            port,
            _dir: dir,
            tls: None,
        })
    }

    /// Starts `redis-server` speaking TLS only (`rediss://`), with certificates made here;
    /// with `clients_prove`, it accepts only clients with a certificate its CA signed.
    ///
    /// # Panics
    /// When `redis-server` or `openssl` is missing or fails.
    pub fn start_tls(clients_prove: bool) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let files = make_certificates(dir.path());
        let (child, port) =
            on_free_port(|port| spawn(dir.path(), port, Some((&files, clients_prove))))
                .expect("redis-server with TLS starts (Debian's is built with it)");
        Self {
            child,
            port,
            _dir: dir,
            tls: Some((files, clients_prove)),
        }
    }

    /// Its certificates, if it speaks TLS.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref().map(|(files, _)| files)
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
        let tls = self.tls.as_ref().map(|(files, prove)| (files, *prove));
        self.child = spawn(self._dir.path(), self.port, tls).expect("redis-server restarts");
    }

    /// Its process id (for CPU and memory figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` when it speaks TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
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
/// if there is one), and returns once it accepts connections. With `tls`, it speaks TLS
/// only on that port (and asks clients for a certificate if told).
fn spawn(
    dir: &std::path::Path,
    port: u16,
    tls: Option<(&TlsFiles, bool)>,
) -> std::io::Result<Child> {
    spawn_with(dir, port, tls, &[])
}

/// [`spawn`], with more arguments for `redis-server` (`--replicaof HOST PORT`).
fn spawn_with(
    dir: &std::path::Path,
    port: u16,
    tls: Option<(&TlsFiles, bool)>,
    more: &[&str],
) -> std::io::Result<Child> {
    let mut command = Command::new("redis-server");
    command.args(["--bind", "127.0.0.1"]).args(more);
    match tls {
        None => {
            command.args(["--port", &port.to_string()]);
        }
        Some((files, clients_prove)) => {
            command
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(dir.join("server.crt"))
                .arg("--tls-key-file")
                .arg(dir.join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(&files.ca)
                .args([
                    "--tls-auth-clients",
                    if clients_prove { "yes" } else { "no" },
                ]);
        }
    }
    command
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir);
    run_until(command, "Ready to accept connections")
}

/// Runs `command` (a `redis-server`) and returns once its log says `ready`. When it exits
/// first, the error carries its log, and is of kind `AddrInUse` when its port was taken.
fn run_until(mut command: Command, ready: &str) -> std::io::Result<Child> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut log = String::new();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains(ready) => break,
            Some(Ok(line)) => log += &(line + "\n"),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                let kind = if log.contains("Address already in use") {
                    std::io::ErrorKind::AddrInUse
                } else {
                    std::io::ErrorKind::Other
                };
                return Err(std::io::Error::new(
                    kind,
                    format!("redis-server exited before it was ready:\n{log}"),
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

/// What `redis-cli -p PORT ARGS…` prints (empty when it cannot connect).
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("redis-cli must be installed with redis-server");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

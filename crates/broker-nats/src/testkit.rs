//! A real `nats-server` with JetStream for tests: started on a free loopback port with its
//! store in a temporary directory, stopped when dropped. And the relay that fails the way
//! networks do, to put in front of it.

pub use herald_broker::{certs::TlsFiles, relay::Partition};

use herald_broker::certs::make_certificates;
use herald_broker::ports::{free_port, on_free_port};

use std::{
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A running `nats-server` that lives as long as this value.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    tls: Option<TlsFiles>,
}

/// How clients must prove themselves to a [`NatsServer`].
#[derive(Debug, Clone, Default)]
pub enum Auth {
    /// Not at all.
    #[default]
    None,
    /// With this user and password.
    Password(String, String),
    /// With this token.
    Token(String),
    /// By signing with the NKey whose public key (`U…`) this is.
    NKey(String),
}

/// What a [`NatsServer`] is started with.
#[derive(Debug, Clone)]
pub struct Setup {
    /// JetStream on (file storage in its directory).
    pub jetstream: bool,
    /// Its clients' proof.
    pub auth: Auth,
    /// TLS only (`tls://`), with certificates made here; `Some(true)`: clients must show
    /// a certificate its CA signed.
    pub tls: Option<bool>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            jetstream: true,
            auth: Auth::None,
            tls: None,
        }
    }
}

impl NatsServer {
    /// Starts `nats-server` (from `PATH`) with JetStream (file storage) and returns once it
    /// accepts connections.
    ///
    /// # Panics
    /// When `nats-server` is missing or does not start: tests that need NATS cannot run.
    pub fn start() -> Self {
        Self::start_with(Setup::default())
    }

    /// Like [`NatsServer::start`], requiring `user` and `password` from clients.
    pub fn start_with_password(user: &str, password: &str) -> Self {
        Self::start_with(Setup {
            auth: Auth::Password(user.into(), password.into()),
            ..Setup::default()
        })
    }

    /// Like [`NatsServer::start`], without JetStream (core NATS only).
    pub fn start_without_jetstream() -> Self {
        Self::start_with(Setup {
            jetstream: false,
            ..Setup::default()
        })
    }

    /// Starts it as `setup` says.
    ///
    /// # Panics
    /// When `nats-server` (or, for TLS, `openssl`) is missing or fails.
    pub fn start_with(setup: Setup) -> Self {
        Self::try_start(setup).expect("nats-server must be installed (apt-get install nats-server)")
    }

    /// Like [`NatsServer::start_with`], for tools: an error instead of a panic.
    pub fn try_start(setup: Setup) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let tls = setup.tls.map(|_| make_certificates(dir.path()));
        let (child, port) = on_free_port(|port| {
            write_config(dir.path(), port, &setup, tls.as_ref())?;
            spawn(dir.path(), port)
        })?;
        Ok(Self {
            child,
            port,
            dir,
            tls,
        })
    }

    /// Kills it (SIGKILL) and starts it again on the same port and store: what JetStream
    /// wrote to its files is back.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.restart();
    }

    /// Kills it (SIGKILL) and leaves it down until [`NatsServer::restart`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again after [`NatsServer::kill`].
    pub fn restart(&mut self) {
        self.child = spawn(self.dir.path(), self.port).expect("nats-server restarts");
    }

    /// Its process id (for CPU and memory figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its certificates, if it speaks TLS.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// `nats://127.0.0.1:PORT` (`tls://` when it speaks TLS), without credentials.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Servers of one NATS cluster with JetStream, on loopback ports, each with its store in a
/// temporary directory; stopped when dropped.
#[derive(Debug)]
pub struct NatsCluster {
    servers: Vec<(Option<Child>, u16, tempfile::TempDir)>,
}

impl NatsCluster {
    /// Starts `size` servers that route to each other and returns once each accepts
    /// connections (JetStream elects its leaders a moment later: clients retry meanwhile).
    ///
    /// # Panics
    /// When `nats-server` is missing or does not start.
    pub fn start(size: usize) -> Self {
        let ports: Vec<(u16, u16)> = (0..size)
            .map(|_| (free_port().expect("a port"), free_port().expect("a port")))
            .collect();
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, route)| format!("\"nats-route://127.0.0.1:{route}\""))
            .collect();
        let mut servers = Vec::new();
        for (i, (port, route)) in ports.iter().enumerate() {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let config = format!(
                "server_name: \"n{i}\"\nlisten: \"127.0.0.1:{port}\"\n\
                 jetstream {{ store_dir: {:?} }}\n\
                 cluster {{ name: \"herald-test\", listen: \"127.0.0.1:{route}\", routes: [{}] }}\n",
                dir.path().join("jetstream").display().to_string(),
                routes.join(", ")
            );
            std::fs::write(dir.path().join("nats.conf"), config).expect("writable directory");
            servers.push((None, *port, dir));
        }
        for (child, port, dir) in &mut servers {
            *child = Some(spawn(dir.path(), *port).expect("nats-server starts"));
        }
        Self { servers }
    }

    /// Every server's `nats://127.0.0.1:PORT`.
    pub fn urls(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|(_, port, _)| format!("nats://127.0.0.1:{port}"))
            .collect()
    }

    /// Kills server `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again on its store.
    pub fn restart(&mut self, i: usize) {
        let (child, port, dir) = &mut self.servers[i];
        *child = Some(spawn(dir.path(), *port).expect("nats-server restarts"));
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.kill(i);
        }
    }
}

/// `nats.conf` in `dir`, as `setup` says.
fn write_config(
    dir: &Path,
    port: u16,
    setup: &Setup,
    tls: Option<&TlsFiles>,
) -> std::io::Result<()> {
    let mut config = format!("listen: \"127.0.0.1:{port}\"\n");
    if setup.jetstream {
        config += &format!(
            "jetstream {{ store_dir: {:?} }}\n",
            dir.join("jetstream").display().to_string()
        );
    }
    match &setup.auth {
        Auth::None => {}
        Auth::Password(user, password) => {
            config += &format!("authorization {{ user: {user:?}, password: {password:?} }}\n");
        }
        Auth::Token(token) => config += &format!("authorization {{ token: {token:?} }}\n"),
        Auth::NKey(public) => {
            config += &format!("authorization {{ users: [ {{ nkey: {public:?} }} ] }}\n");
        }
    }
    if let (Some(files), Some(clients_prove)) = (tls, setup.tls) {
        let path = |p: &Path| p.display().to_string();
        config += &format!(
            "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: {clients_prove} }}\n",
            path(&dir.join("server.crt")),
            path(&dir.join("server.key")),
            path(&files.ca),
        );
    }
    std::fs::write(dir.join("nats.conf"), config)
}

fn spawn(dir: &Path, port: u16) -> std::io::Result<Child> {
    let log = std::fs::File::create(dir.join("nats-server.log"))?;
    let mut child = Command::new("nats-server")
        .arg("-c")
        .arg(dir.join("nats.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()?;
    // Ready when its port accepts: JetStream is up by then (it starts before the listener).
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(dir.join("nats-server.log")).unwrap_or_default();
            let kind = if log.contains("address already in use") {
                std::io::ErrorKind::AddrInUse
            } else {
                std::io::ErrorKind::Other
            };
            return Err(std::io::Error::new(
                kind,
                format!("nats-server exited ({status}): {log}"),
            ));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(std::io::Error::other("nats-server did not start in 20 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child)
}

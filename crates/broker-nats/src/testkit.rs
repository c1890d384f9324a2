//! A real `nats-server` with JetStream for tests: started on a free loopback port with its
//! store in a temporary directory, stopped when dropped. And the relay that fails the way
//! networks do, to put in front of it.

pub use herald_broker::relay::Partition;

use std::{
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A running `nats-server -js` that lives as long as this value.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    /// `user:password` it requires, if any.
    auth: Option<(String, String)>,
    jetstream: bool,
}

impl NatsServer {
    /// Starts `nats-server` (from `PATH`) with JetStream (file storage) and returns once it
    /// accepts connections.
    ///
    /// # Panics
    /// When `nats-server` is missing or does not start: tests that need NATS cannot run.
    pub fn start() -> Self {
        Self::try_start(None).expect("nats-server must be installed (apt-get install nats-server)")
    }

    /// Like [`NatsServer::start`], requiring `user` and `password` from clients.
    pub fn start_with_password(user: &str, password: &str) -> Self {
        Self::try_start(Some((user.into(), password.into())))
            .expect("nats-server must be installed (apt-get install nats-server)")
    }

    /// Like [`NatsServer::start`], without JetStream (core NATS only).
    pub fn start_without_jetstream() -> Self {
        Self::try_start_with(None, false)
            .expect("nats-server must be installed (apt-get install nats-server)")
    }

    /// Like [`NatsServer::start`], for tools: an error instead of a panic.
    pub fn try_start(auth: Option<(String, String)>) -> std::io::Result<Self> {
        Self::try_start_with(auth, true)
    }

    fn try_start_with(auth: Option<(String, String)>, jetstream: bool) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let child = spawn(dir.path(), port, auth.as_ref(), jetstream)?;
        Ok(Self {
            child,
            port,
            dir,
            auth,
            jetstream,
        })
    }

    /// Kills it (SIGKILL) and starts it again on the same port and store: what JetStream
    /// synced to its files is back.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.child = spawn(
            self.dir.path(),
            self.port,
            self.auth.as_ref(),
            self.jetstream,
        )
        .expect("nats-server restarts");
    }

    /// Kills it (SIGKILL) and leaves it down until [`NatsServer::restart`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again after [`NatsServer::kill`].
    pub fn restart(&mut self) {
        self.child = spawn(
            self.dir.path(),
            self.port,
            self.auth.as_ref(),
            self.jetstream,
        )
        .expect("nats-server restarts");
    }

    /// Its process id (for CPU and memory figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:PORT`, without credentials.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(
    dir: &Path,
    port: u16,
    auth: Option<&(String, String)>,
    jetstream: bool,
) -> std::io::Result<Child> {
    let mut command = Command::new("nats-server");
    command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
    if jetstream {
        command.arg("-js").arg("-sd").arg(dir.join("jetstream"));
    }
    if let Some((user, password)) = auth {
        command.args(["--user", user, "--pass", password]);
    }
    let log = std::fs::File::create(dir.join("nats-server.log"))?;
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()?;
    // Ready when its port accepts: JetStream is up by then (it starts before the listener).
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(dir.join("nats-server.log")).unwrap_or_default();
            return Err(std::io::Error::other(format!(
                "nats-server exited ({status}): {log}"
            )));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(std::io::Error::other("nats-server did not start in 20 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child)
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

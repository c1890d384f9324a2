//! A primary, two replicas and three Sentinels watching them, all real `redis-server`s on
//! loopback ports: for failover tests.

use std::{
    process::{Child, Command},
    time::{Duration, Instant},
};

use super::{cli, on_free_port, run_until, spawn_with};

/// The name the Sentinels monitor the primary under.
pub const MASTER_NAME: &str = "herald";

/// How long the set may take to be ready (replica in sync, Sentinels agreed).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A primary, two replicas of it, and three Sentinels (quorum 2) that fail over to a
/// replica about a second after the primary stops answering (and point the other replica
/// at it, so the new primary has a replica too). Stopped when dropped.
#[derive(Debug)]
pub struct SentinelSet {
    servers: Vec<(Child, u16)>,
    sentinels: Vec<(Child, u16)>,
    _dir: tempfile::TempDir,
}

impl SentinelSet {
    /// Starts the set and returns once the replicas are in sync and every Sentinel knows
    /// the replicas and the other Sentinels (so a failover can be agreed).
    ///
    /// # Panics
    /// When `redis-server` is missing or the set does not get ready.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let server = |name: &str, more: &[&str]| {
            let path = dir.path().join(name);
            std::fs::create_dir(&path).expect("a directory per server");
            on_free_port(|port| spawn_with(&path, port, None, more)).expect("redis-server starts")
        };
        let primary = server("primary", &[]);
        let primary_port = primary.1.to_string();
        let replicas = ["replica-1", "replica-2"]
            .map(|name| server(name, &["--replicaof", "127.0.0.1", &primary_port]));
        let sentinels = (0..3)
            .map(|i| {
                let conf = dir.path().join(format!("sentinel-{i}.conf"));
                on_free_port(|port| {
                    std::fs::write(
                        &conf,
                        format!(
                            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                         sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                         sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                         sentinel failover-timeout {MASTER_NAME} 5000\n",
                            dir = dir.path().display()
                        ),
                    )
                    .expect("a Sentinel configuration");
                    let mut command = Command::new("redis-server");
                    command.arg(&conf).arg("--sentinel");
                    run_until(command, "+monitor master")
                })
                .expect("a Sentinel starts")
            })
            .collect();
        let set = Self {
            servers: [primary].into_iter().chain(replicas).collect(),
            sentinels,
            _dir: dir,
        };
        set.wait_ready();
        set
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        let ready = || {
            let in_sync =
                |port: u16| cli(port, &["INFO", "replication"]).contains("master_link_status:up");
            self.servers[1..].iter().all(|(_, port)| in_sync(*port))
                && self.sentinels.iter().all(|(_, port)| {
                    cli(*port, &["SENTINEL", "ckquorum", MASTER_NAME]).starts_with("OK 3")
                        && !cli(*port, &["SENTINEL", "replicas", MASTER_NAME])
                            .trim()
                            .is_empty()
                })
        };
        while !ready() {
            assert!(
                started.elapsed() < READY_WITHIN,
                "the Sentinel set did not get ready within {READY_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `host:port` of each Sentinel.
    pub fn sentinels(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(_, port)| format!("127.0.0.1:{port}"))
            .collect()
    }

    /// A relay in front of the primary, and one in front of each Sentinel whose answers
    /// name that relay instead of the primary (see [`Partition::rewrite_ports`]): a client
    /// given the Sentinels' relays reaches the primary only through the first, which a test
    /// can cut.
    ///
    /// [`Partition::rewrite_ports`]: herald_broker::relay::Partition::rewrite_ports
    pub fn relays(
        &self,
    ) -> (
        herald_broker::relay::Partition,
        Vec<herald_broker::relay::Partition>,
    ) {
        use herald_broker::relay::Partition;
        let primary = self.primary_port().expect("a Sentinel names the primary");
        let to_primary = Partition::start_to(primary);
        let to_sentinels: Vec<_> = (self.sentinels.iter())
            .map(|(_, port)| Partition::start_to(*port))
            .collect();
        for relay in &to_sentinels {
            relay.rewrite_ports(&[(primary, to_primary.port())]);
        }
        (to_primary, to_sentinels)
    }

    /// A URL for the primary's credentials and database (none here): its address is the
    /// first primary's, which the Sentinels' answer replaces.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.servers[0].1)
    }

    /// The port of the primary as the first Sentinel that answers names it.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|(_, port)| {
            let named = cli(*port, &["SENTINEL", "get-master-addr-by-name", MASTER_NAME]);
            named.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) every server but the primary. Stopping them
    /// also closes the primary's replication links to them (what a stopped server's socket
    /// would otherwise buffer reaches it when continued), so they take none of its writes
    /// until they reconnect: a failover after the primary dies loses what they missed.
    pub fn pause_replicas(&self, paused: bool) {
        let primary = self.primary_port();
        for (child, _) in self.servers.iter().filter(|(_, p)| Some(*p) != primary) {
            let signal = if paused { "-STOP" } else { "-CONT" };
            let done = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("kill runs");
            assert!(done.success(), "kill {signal} failed");
        }
        if let (true, Some(port)) = (paused, primary) {
            cli(port, &["CLIENT", "KILL", "TYPE", "replica"]);
        }
    }

    /// Kills the server that is the primary now (SIGKILL: it says goodbye to no one), and
    /// returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port().expect("a Sentinel names the primary");
        let (child, _) = self
            .servers
            .iter_mut()
            .find(|(_, p)| *p == port)
            .expect("the primary is one of the set's servers");
        let _ = child.kill();
        let _ = child.wait();
        port
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for (child, _) in self.sentinels.iter_mut().chain(self.servers.iter_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

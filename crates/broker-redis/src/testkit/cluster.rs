//! A Redis Cluster of real `redis-server`s on loopback ports: three primaries (each with
//! replicas if asked), slots spread by `redis-cli --cluster create`, for tests.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::{cli, free_port, on_free_port, spawn_with};

/// How long the cluster may take to agree on its slots (and its replicas to sync).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A running cluster, stopped when dropped.
#[derive(Debug)]
pub struct ClusterSet {
    /// Every server, primaries first (as created), with its port.
    servers: Vec<(Option<Child>, u16)>,
    _dir: tempfile::TempDir,
}

impl ClusterSet {
    /// Three primaries and `replicas` replicas of each; returns once every node says
    /// `cluster_state:ok` and the replicas are in sync. A replica takes over a primary that
    /// stops answering for a second (`cluster-node-timeout 1000`).
    ///
    /// # Panics
    /// When `redis-server` or `redis-cli` is missing, or the cluster does not get ready.
    pub fn start(replicas: usize) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let count = 3 * (1 + replicas);
        let servers: Vec<(Option<Child>, u16)> = (0..count)
            .map(|i| {
                let path = dir.path().join(format!("node-{i}"));
                std::fs::create_dir(&path).expect("a directory per server");
                // The cluster bus gets a free port of its own: the default (port + 10000)
                // may be taken or out of range.
                let (child, port) = on_free_port(|port| {
                    let bus = free_port()?.to_string();
                    spawn_with(
                        &path,
                        port,
                        None,
                        &[
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            "nodes.conf",
                            "--cluster-node-timeout",
                            "1000",
                            "--cluster-port",
                            &bus,
                            // A replica may take over however long it was cut off: in a test,
                            // availability is what is measured.
                            "--cluster-replica-validity-factor",
                            "0",
                        ],
                    )
                })
                .expect("redis-server starts in cluster mode");
                (Some(child), port)
            })
            .collect();
        let addresses: Vec<String> = servers
            .iter()
            .map(|(_, port)| format!("127.0.0.1:{port}"))
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli must be installed with redis-server");
        assert!(status.success(), "redis-cli --cluster create failed");
        let set = Self { servers, _dir: dir };
        set.wait_ready(replicas);
        set
    }

    fn wait_ready(&self, replicas: usize) {
        let started = Instant::now();
        let ready = || {
            self.servers.iter().all(|(_, port)| {
                cli(*port, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
                    && cli(*port, &["CLUSTER", "INFO"])
                        .contains(&format!("cluster_known_nodes:{}", self.servers.len()))
            }) && self.servers.iter().all(|(_, port)| {
                let replication = cli(*port, &["INFO", "replication"]);
                !replication.contains("role:slave") || replication.contains("master_link_status:up")
            }) && (replicas == 0 || self.primaries_with_replicas() == 3)
        };
        while !ready() {
            assert!(
                started.elapsed() < READY_WITHIN,
                "the cluster did not get ready within {READY_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Primaries that a replica follows, as the first node sees them.
    fn primaries_with_replicas(&self) -> usize {
        let nodes = cli(self.servers[0].1, &["CLUSTER", "NODES"]);
        let followed: std::collections::HashSet<&str> = nodes
            .lines()
            .filter(|l| l.contains("slave") && !l.contains("fail"))
            .filter_map(|l| l.split(' ').nth(3))
            .collect();
        followed.len()
    }

    /// `host:port` of every node (what Herald's `[redis] cluster` lists).
    pub fn addresses(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|(_, port)| format!("127.0.0.1:{port}"))
            .collect()
    }

    /// A relay in front of every node, whose answers (slot maps, redirections) name the
    /// relays instead of the nodes (see [`Partition::rewrite_ports`]): a client given
    /// their addresses reaches the cluster only through them, which a test can cut.
    ///
    /// [`Partition::rewrite_ports`]: herald_broker::relay::Partition::rewrite_ports
    pub fn relays(&self) -> Vec<herald_broker::relay::Partition> {
        let ports: Vec<u16> = self.servers.iter().map(|(_, p)| *p).collect();
        let relays: Vec<_> = (ports.iter())
            .map(|p| herald_broker::relay::Partition::start_to(*p))
            .collect();
        let map: Vec<(u16, u16)> = ports
            .iter()
            .zip(&relays)
            .map(|(p, r)| (*p, r.port()))
            .collect();
        relays.iter().for_each(|r| r.rewrite_ports(&map));
        relays
    }

    /// The port of the primary that serves `key`'s slot now.
    pub fn primary_of(&self, key: &str) -> u16 {
        for (child, port) in &self.servers {
            if child.is_none() {
                continue;
            }
            let slot = cli(*port, &["CLUSTER", "KEYSLOT", key]);
            let slot: u16 = slot.trim().parse().expect("a slot number");
            let nodes = cli(*port, &["CLUSTER", "NODES"]);
            for line in nodes.lines() {
                let fields: Vec<&str> = line.split(' ').collect();
                if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                    continue;
                }
                let serves = fields[8..].iter().any(|range| {
                    let (low, high) = range.split_once('-').unwrap_or((range, range));
                    matches!(
                        (low.parse::<u16>(), high.parse::<u16>()),
                        (Ok(l), Ok(h)) if l <= slot && slot <= h
                    )
                });
                if serves {
                    let address = fields[1].split('@').next().expect("an address");
                    let port = address.rsplit(':').next().expect("a port");
                    return port.parse().expect("a port number");
                }
            }
        }
        panic!("no live node knows who serves {key:?}");
    }

    /// Moves `key`'s slot, with its keys, to another primary, as an operator's resharding
    /// does (`SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE`, `SETSLOT NODE`), and returns once
    /// every live node names the new primary. Returns its port.
    pub fn move_slot_of(&self, key: &str) -> u16 {
        let from = self.primary_of(key);
        let to = self
            .primaries()
            .into_iter()
            .find(|p| *p != from)
            .expect("another primary");
        let slot = cli(from, &["CLUSTER", "KEYSLOT", key]).trim().to_string();
        let id = |port: u16| cli(port, &["CLUSTER", "MYID"]).trim().to_string();
        let (from_id, to_id) = (id(from), id(to));
        let ok = |port: u16, args: &[&str]| {
            let said = cli(port, args);
            assert!(said.trim() == "OK", "{args:?} on {port}: {said:?}");
        };
        ok(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        ok(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
        loop {
            let keys = cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let to_port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            ok(from, &args);
        }
        for port in [to, from].into_iter().chain(
            self.primaries()
                .into_iter()
                .filter(|p| *p != to && *p != from),
        ) {
            ok(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        }
        let started = Instant::now();
        while self.primary_of(key) != to {
            assert!(
                started.elapsed() < READY_WITHIN,
                "the slot move did not spread"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        to
    }

    /// The ports of the live primaries.
    fn primaries(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|(child, port)| {
                child.is_some() && cli(*port, &["INFO", "replication"]).contains("role:master")
            })
            .map(|(_, port)| *port)
            .collect()
    }

    /// Closes every pub/sub client connection on every live node (as a network cut would),
    /// keeping the data.
    pub fn kill_pubsub_clients(&self) {
        for (child, port) in &self.servers {
            if child.is_some() {
                cli(*port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
            }
        }
    }

    /// What `redis-cli -p PORT ARGS…` prints.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli(port, args)
    }

    /// The replicas that follow the primary on `port`.
    pub fn replicas_of(&self, primary: u16) -> Vec<u16> {
        let follows = format!("master_port:{primary}");
        (self.servers.iter())
            .filter(|(c, p)| c.is_some() && *p != primary)
            .map(|(_, p)| *p)
            .filter(|p| {
                let replication = cli(*p, &["INFO", "replication"]);
                replication.lines().any(|l| l.trim() == follows)
            })
            .collect()
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) the servers on `ports`.
    pub fn pause(&self, ports: &[u16], paused: bool) {
        for (child, _) in self.servers.iter().filter(|(_, p)| ports.contains(p)) {
            let child = child.as_ref().expect("a live server");
            let signal = if paused { "-STOP" } else { "-CONT" };
            let done = std::process::Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("kill runs");
            assert!(done.success(), "kill {signal} failed");
        }
    }

    /// Kills the server on `port` (SIGKILL: it says goodbye to no one).
    pub fn kill(&mut self, port: u16) {
        let (child, _) = self
            .servers
            .iter_mut()
            .find(|(_, p)| *p == port)
            .expect("one of the cluster's servers");
        if let Some(mut child) = child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether a live node other than `port` serves `key`'s slot now (a failover finished).
    pub fn failed_over(&self, key: &str, port: u16) -> bool {
        let live = self.servers.iter().filter(|(c, _)| c.is_some());
        live.into_iter()
            .all(|(_, p)| cli(*p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            && self.primary_of(key) != port
    }
}

impl Drop for ClusterSet {
    fn drop(&mut self) {
        for (child, _) in self.servers.iter_mut() {
            if let Some(mut child) = child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

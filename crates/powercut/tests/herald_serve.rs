//! `herald serve` on a file system that loses every write not synced when the power goes
//! (issue #57): publishers through the HTTP API, the server killed mid-stream, the power
//! cut, the server started again. With `sync = "always"` and `"group"` every acknowledged
//! publication must come back, in its epoch (the machine did not reboot: the boot id is
//! the same, so nothing else may explain a loss). Needs FUSE (`/dev/fuse`, Debian's
//! `fuse3`, root); said and skipped where it is missing.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, Mutex},
};

use serde_json::{json, Value};

const KEY: &str = "herald-powercut-test-key";

fn sibling(name: &str) -> PathBuf {
    let me = PathBuf::from(env!("CARGO_BIN_EXE_herald-powercut"));
    me.with_file_name(name)
}

/// The power-cut file system mounted at `mnt` over `backing`.
struct Mount {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Mount {
    /// `None` where this machine cannot mount FUSE (a container without the right, say).
    fn new(backing: &Path, mnt: &Path) -> Option<Self> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_herald-powercut"))
            .arg(backing)
            .arg(mnt)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let stdin = child.stdin.take();
        let mount = Self { child, stdin };
        if line.trim() != "mounted" {
            return None;
        }
        std::thread::spawn(move || out.lines().for_each(drop));
        Some(mount)
    }

    /// The power goes: what was not synced is undone, and the file system unmounted.
    fn cut(mut self) {
        writeln!(self.stdin.take().unwrap(), "cut").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for Mount {
    /// Unmounts (end of input) if the test stopped before the cut.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(data: &Path, sync: &str) -> Self {
        let mut child = Command::new(sibling("herald"))
            .args(["serve", "--listen", "127.0.0.1:0", "--api-key", KEY])
            .args(["--log-format", "json", "--sync", sync, "--data-dir"])
            .arg(data)
            .env("HERALD_STORE_SEGMENT_BYTES", "65536")
            .env("HERALD_STORE_CHECKPOINT_BYTES", "65536")
            .stderr(Stdio::piped())
            .spawn()
            .expect("the herald binary is built beside this one (cargo test --workspace)");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let address = loop {
            let line = lines.next().expect("server logs its address").unwrap();
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["fields"]["message"] == "herald is listening" {
                break v["fields"]["address"].as_str().unwrap().to_string();
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        Self {
            child,
            url: format!("http://{address}"),
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Acknowledged publications of a channel: offset → [epoch, data].
type Acked = Arc<Mutex<BTreeMap<u64, Value>>>;

async fn publish_until_refused(url: String, channel: String, tag: String, acked: Acked) {
    let http = reqwest::Client::new();
    for i in 0.. {
        let data = json!({ "tag": tag, "i": i, "pad": "x".repeat(700) });
        let body = json!({ "channel": channel, "data": data });
        let sent = http
            .post(format!("{url}/api/publish"))
            .header("Authorization", format!("apikey {KEY}"))
            .json(&body)
            .send()
            .await;
        let Ok(r) = sent else { return };
        let Ok(v) = r.json::<Value>().await else {
            return;
        };
        let Some(offset) = v["offset"].as_u64() else {
            return;
        };
        acked
            .lock()
            .unwrap()
            .insert(offset, json!([v["epoch"], data]));
    }
}

async fn history(url: &str, channel: &str) -> Value {
    reqwest::Client::new()
        .get(format!(
            "{url}/api/history?channel={channel}&since=0&limit=1000"
        ))
        .header("Authorization", format!("apikey {KEY}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn fuse_missing() -> Option<&'static str> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse");
    }
    let found = Command::new("fusermount3").arg("--version").output();
    if found.is_err() {
        return Some("no fusermount3 (Debian: apt-get install fuse3)");
    }
    None
}

#[test]
fn every_acknowledged_publication_survives_a_power_cut_under_herald_serve() {
    if let Some(why) = fuse_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for sync in ["always", "group"] {
        let backing = tempfile::tempdir().unwrap();
        let channels = ["chat:a", "chat:b"];
        let acked: Vec<Acked> = channels.iter().map(|_| Acked::default()).collect();
        for round in 0..3u64 {
            let mnt = tempfile::tempdir().unwrap();
            let Some(mount) = Mount::new(backing.path(), mnt.path()) else {
                eprintln!(
                    "skipped: FUSE cannot be mounted here (see herald-powercut's error above)"
                );
                return;
            };
            let server = Server::start(mnt.path(), sync);
            let publishers: Vec<_> = (0..4)
                .map(|p| {
                    let (channel, acked) = (channels[p % 2], acked[p % 2].clone());
                    let tag = format!("{sync}/{round}/{p}");
                    rt.spawn(publish_until_refused(
                        server.url.clone(),
                        channel.to_owned(),
                        tag,
                        acked,
                    ))
                })
                .collect();
            // Killed and cut at a different point of each round.
            let target = 60 + 40 * round as usize;
            while acked[0].lock().unwrap().len() < target {
                std::thread::yield_now();
            }
            server.kill();
            for p in publishers {
                rt.block_on(p).unwrap();
            }
            mount.cut();
            // Started again on what the disk kept.
            let server = Server::start(backing.path(), sync);
            for (channel, acked) in channels.iter().zip(&acked) {
                let h = rt.block_on(history(&server.url, channel));
                let stored: BTreeMap<u64, Value> = h["publications"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        (
                            p["offset"].as_u64().unwrap(),
                            json!([h["epoch"], p["data"]]),
                        )
                    })
                    .collect();
                for (offset, data) in acked.lock().unwrap().iter() {
                    assert_eq!(
                        stored.get(offset),
                        Some(data),
                        "{sync}, round {round}: acknowledged offset {offset} of {channel} lost, changed or of another epoch"
                    );
                }
            }
            let total: usize = acked.iter().map(|a| a.lock().unwrap().len()).sum();
            eprintln!("{sync}, round {round}: {total} acknowledged so far, all kept");
            server.kill();
        }
    }
}

//! Running the `herald` binary in tests.

#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
};

use serde_json::Value;

pub mod balancer;
pub mod nginx;

const BIN: &str = env!("CARGO_BIN_EXE_herald");

/// The API key [`Server`] starts with (`serve` refuses keys shorter than 16 bytes).
pub const KEY: &str = "herald-test-api-key";

/// The binary, with no `HERALD_*` variable from the developer's environment.
pub fn herald() -> Command {
    let mut c = Command::new(BIN);
    without_herald_env(&mut c);
    c
}

/// `command` (the binary or a wrapper that starts it: `taskset`, `prlimit`) without the
/// developer's `HERALD_*` variables.
pub fn without_herald_env(command: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            command.env_remove(k);
        }
    }
    command
}

/// A channel's whole history (up to 1,000) through the API of the server at `url`.
pub fn history(rt: &tokio::runtime::Runtime, url: &str, channel: &str) -> Value {
    rt.block_on(api_get(&format!(
        "{url}/api/history?channel={channel}&since=0&limit=1000"
    )))
}

/// A GET of the HTTP API (key [`KEY`], as [`Server`] starts it), answered with JSON.
pub async fn api_get(url: &str) -> Value {
    reqwest::Client::new()
        .get(url)
        .header("Authorization", format!("apikey {KEY}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A POST of `body` to the HTTP API (key [`KEY`]), answered with JSON.
pub async fn api_post(url: &str, body: Value) -> Value {
    reqwest::Client::new()
        .post(url)
        .header("Authorization", format!("apikey {KEY}"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Runs `command` to its end and returns its output, failing the test (with its stderr)
/// unless it succeeded.
pub fn succeeds(command: &mut Command) -> std::process::Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        command,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A `herald serve` process on a free port; killed when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    _data: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts with a fresh temporary data directory.
    pub fn start(extra: &[&str]) -> Self {
        let data = tempfile::tempdir().unwrap();
        let mut server = Self::start_in(data.path(), extra);
        server._data = Some(data);
        server
    }

    /// Starts on a data directory that outlives the process.
    pub fn start_in(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_at("127.0.0.1:0", data_dir, extra)
    }

    /// Starts listening on `listen` (with `--reuse-port`, an address another node holds).
    pub fn start_at(listen: &str, data_dir: &Path, extra: &[&str]) -> Self {
        Self::spawn(&mut herald(), listen, data_dir, extra)
    }

    /// Starts with files limited to `bytes` (`prlimit --fsize`): writes beyond fail as on a
    /// full disk, until [`Server::lift_file_size_limit`].
    pub fn start_with_file_size_limit(data_dir: &Path, bytes: u64) -> Self {
        let mut prlimit = Command::new("prlimit");
        prlimit
            .arg(format!("--fsize={bytes}:unlimited"))
            .arg("--")
            .arg(BIN);
        without_herald_env(&mut prlimit);
        Self::spawn(&mut prlimit, "127.0.0.1:0", data_dir, &[])
    }

    /// Lets the process write files of any size again, as freeing disk space would.
    pub fn lift_file_size_limit(&self) {
        succeeds(Command::new("prlimit").args([
            "--pid",
            &self.child.id().to_string(),
            "--fsize=unlimited:unlimited",
        ]));
    }

    /// Starts `command` (the binary, set up by the caller: its environment, say) on a free
    /// port.
    /// Starts `command` (a `herald` with its environment) on a data directory of its own.
    pub fn spawn_in_temp(command: &mut Command, extra: &[&str]) -> Self {
        let data = tempfile::tempdir().unwrap();
        let mut server = Self::spawn_with(command, data.path(), extra);
        server._data = Some(data);
        server
    }

    pub fn spawn_with(command: &mut Command, data_dir: &Path, extra: &[&str]) -> Self {
        Self::spawn(command, "127.0.0.1:0", data_dir, extra)
    }

    fn spawn(command: &mut Command, listen: &str, data_dir: &Path, extra: &[&str]) -> Self {
        let mut child = command
            .args([
                "serve",
                "--listen",
                listen,
                "--api-key",
                KEY,
                "--log-format",
                "json",
                "--data-dir",
            ])
            .arg(data_dir)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let address = loop {
            let line = lines.next().expect("server logs its address").unwrap();
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["fields"]["message"] == "herald is listening" {
                break v["fields"]["address"].as_str().unwrap().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self {
            child,
            url: format!("http://{address}"),
            _data: None,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `herald serve` on a free port, logging JSON to a pipe: its log lines, parsed (a line
/// that is not JSON is `Null`). Stopped when dropped.
pub struct Logging {
    pub child: std::process::Child,
    pub lines: Box<dyn Iterator<Item = Value>>,
    _data: tempfile::TempDir,
}

pub fn serve_logging(configure: impl FnOnce(&mut Command)) -> Logging {
    let data = tempfile::tempdir().unwrap();
    let mut command = herald();
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .arg("--data-dir")
        .arg(data.path())
        .stderr(Stdio::piped());
    configure(&mut command);
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(stderr))
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap_or_default());
    Logging {
        child,
        lines: Box::new(lines),
        _data: data,
    }
}

impl Logging {
    /// The lines logged before "herald is listening" (which ends the iteration), and the
    /// address it names.
    pub fn until_listening(&mut self) -> (Vec<Value>, String) {
        let mut before = Vec::new();
        for v in self.lines.by_ref() {
            if v["fields"]["message"] == "herald is listening" {
                return (before, v["fields"]["address"].as_str().unwrap().to_string());
            }
            before.push(v);
        }
        panic!("the server ended before listening: {before:?}");
    }
}

impl Drop for Logging {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `herald` printed on standard error when it failed (exit code 2).
pub fn fails(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    String::from_utf8(out.stderr).unwrap()
}

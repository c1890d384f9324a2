//! What is measured: a Herald this tool starts (the default), or any running server given by
//! URL (and PID, for its CPU and memory), with a publisher for each.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Stdio},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::procstat::{self, ProcSample};

pub const BENCH_API_KEY: &str = "herald-bench-api-key";

pub struct Server {
    /// `http://IP:PORT`.
    pub url: String,
    /// Every process whose CPU and memory count as the server's (its nodes, and the Redis
    /// this tool started for them).
    pub pids: Vec<u32>,
    /// The Redis the nodes share, when there are several.
    pub redis_url: Option<String>,
    children: Vec<Child>,
    _redis: Option<LocalRedis>,
    _data: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts `herald serve` (this same binary) on a free loopback port, with a fresh data
    /// directory and `extra` arguments (e.g. `--storage memory`). With `nodes` > 1, starts
    /// that many on the same address (`--reuse-port`), sharing channels through Redis:
    /// `redis_url`, or a `redis-server` started here; or through NATS at `nats_url`.
    pub fn spawn(
        extra: &[String],
        nodes: usize,
        redis_url: Option<&str>,
        nats_url: Option<&str>,
        env: &[(String, String)],
        place: &crate::cores::Placement,
    ) -> anyhow::Result<Self> {
        let data = tempfile::tempdir()?;
        let mut args: Vec<String> = extra.to_vec();
        let mut redis = None;
        let mut shared = None;
        if let Some(url) = nats_url {
            args.extend(["--storage", "nats", "--nats-url", url, "--reuse-port"].map(String::from));
        } else if nodes > 1 {
            let url = match redis_url {
                Some(url) => url.to_string(),
                None => {
                    let started = LocalRedis::start(place).context(
                        "starting redis-server for --nodes (install it, or give --redis-url)",
                    )?;
                    let url = started.url();
                    redis = Some(started);
                    url
                }
            };
            args.extend(
                ["--storage", "redis", "--redis-url", &url, "--reuse-port"].map(String::from),
            );
            shared = Some(url);
        }
        let (first, address) = spawn_node("127.0.0.1:0", data.path(), &args, env, place)?;
        let mut children = vec![first];
        for _ in 1..nodes.max(1) {
            children.push(spawn_node(&address, data.path(), &args, env, place)?.0);
        }
        let mut pids: Vec<u32> = children.iter().map(Child::id).collect();
        pids.extend(redis.as_ref().map(|r| r.child.id()));
        Ok(Self {
            url: format!("http://{address}"),
            pids,
            redis_url: shared,
            children,
            _redis: redis,
            _data: Some(data),
        })
    }

    /// Starts the uWebSockets floor (`tools/uws-floor/floor.ts`) with `bun`, on a free
    /// loopback port: clients open `/ws/CHANNEL`, publications are `POST /pub/CHANNEL`.
    pub fn floor(bun: &std::path::Path, place: &crate::cores::Placement) -> anyhow::Result<Self> {
        let script = bun
            .ancestors()
            .find(|d| d.join("floor.ts").is_file())
            .map(|d| d.join("floor.ts"))
            .unwrap_or_else(|| "tools/uws-floor/floor.ts".into());
        let mut child = place
            .command(bun)
            .arg(&script)
            .env("PORT", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| {
                format!(
                    "starting the floor with {} (run `npm install` in tools/uws-floor)",
                    bun.display()
                )
            })?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let port = match lines.next() {
            Some(Ok(line)) => line
                .strip_prefix("listening ")
                .and_then(|p| p.trim().parse::<u16>().ok()),
            _ => None,
        };
        let Some(port) = port else {
            let _ = child.kill();
            bail!(
                "the floor ({}) did not say where it listens",
                script.display()
            );
        };
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        Ok(Self {
            url: format!("http://127.0.0.1:{port}"),
            pids: vec![child.id()],
            redis_url: None,
            children: vec![child],
            _redis: None,
            _data: None,
        })
    }

    pub fn external(url: &str, pids: &[u32]) -> Self {
        Self {
            url: url.trim_end_matches('/').to_string(),
            pids: pids.to_vec(),
            redis_url: None,
            children: Vec::new(),
            _redis: None,
            _data: None,
        }
    }

    /// The server's processes together: CPU and memory summed.
    pub fn sample(&self) -> Option<ProcSample> {
        procstat::sample_all(&self.pids)
    }

    /// Herald's own counters (`/api/info`), when the target is Herald.
    pub async fn info(&self, api_key: &str) -> Option<Value> {
        let r = reqwest::Client::new()
            .get(format!("{}/api/info", self.url))
            .header("authorization", format!("apikey {api_key}"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        r.json().await.ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `redis-server` the bench starts for `--nodes` on a free loopback port, without
/// persistence, stopped when dropped. (The bench's own: the Redis crate's test fixture
/// stays out of the binary.)
struct LocalRedis {
    child: Child,
    port: u16,
}

impl LocalRedis {
    /// Starts `redis-server` where the nodes run (their cores and cgroup): it is counted
    /// with them.
    fn start(place: &crate::cores::Placement) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut child = place
            .command("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|line| line.contains("Ready to accept connections"));
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            bail!("redis-server exited before it was ready");
        }
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Self { child, port })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts one `herald serve` on `listen`; returns it and the address it listens on.
fn spawn_node(
    listen: &str,
    data: &std::path::Path,
    extra: &[String],
    env: &[(String, String)],
    place: &crate::cores::Placement,
) -> anyhow::Result<(Child, String)> {
    let mut child = place
        .command(std::env::current_exe()?)
        .args(["serve", "--listen", listen, "--api-key", BENCH_API_KEY])
        .args(["--log-format", "json", "--log-level", "warn,herald=info"])
        .arg("--data-dir")
        .arg(data)
        .args(extra)
        .env_remove("HERALD_CONFIG")
        // The bench's own switch, not a server setting.
        .env_remove("HERALD_BENCH_DEBUG")
        // Every bench client comes from a few loopback addresses: no per-address limits.
        .env("HERALD_LIMITS__CONNECTIONS_PER_ADDRESS", "0")
        .env("HERALD_LIMITS__CONNECTION_RATE_PER_ADDRESS", "0")
        .env("HERALD_LIMITS__COMMANDS_PER_ADDRESS", "0")
        .env("HERALD_LIMITS__HOOK_CALLS_PER_ADDRESS", "0")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting herald serve")?;
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let address = loop {
        let Some(line) = lines.next() else {
            let _ = child.wait();
            bail!("herald serve exited before listening");
        };
        let v: Value = serde_json::from_str(&line?).unwrap_or(Value::Null);
        if v["fields"]["message"] == "herald is listening" {
            break v["fields"]["address"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe; with
    // HERALD_BENCH_DEBUG set, show what it logs.
    let show = std::env::var_os("HERALD_BENCH_DEBUG").is_some();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if show {
                eprintln!("server: {line}");
            }
        }
    });
    Ok((child, address))
}

/// Publishes through an HTTP API: Herald's, any server's through a template, or a Pusher
/// server's signed events API.
#[derive(Clone)]
pub struct Publisher {
    http: reqwest::Client,
    url: String,
    /// Body with `{channel}` and `{data}` (JSON) in it (the URL may hold `{channel}` too);
    /// None = Herald's `/api/publish`.
    template: Option<String>,
    headers: Vec<(String, String)>,
    /// A Pusher app's id, key and secret: each publication is signed for `/apps/ID/events`.
    pusher: Option<PusherApp>,
    /// What the data holds.
    content: Content,
}

/// What a publication's data holds besides its stamp (`--content`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Content {
    /// One letter repeated: compresses to almost nothing.
    #[default]
    Pad,
    /// A catalogue of items with ids, names, prices and tags, as a shop or a dashboard
    /// pushes: compresses as real JSON does.
    Json,
    /// A chat line and its author.
    Chat,
}

impl Content {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "pad" => Ok(Self::Pad),
            "json" => Ok(Self::Json),
            "chat" => Ok(Self::Chat),
            other => Err(format!("unknown content {other:?}: pad, json or chat")),
        }
    }

    /// Data of about `size` bytes, stamped with the time and `seq`.
    pub fn data(self, seq: u64, size: usize) -> serde_json::Value {
        let t = now_ns();
        match self {
            Self::Pad => json!({"t": t, "seq": seq, "pad": "x".repeat(size.saturating_sub(48))}),
            Self::Json => {
                let mut items = Vec::new();
                let mut data =
                    json!({"t": t, "seq": seq, "updated": "2026-11-27T10:00:00Z", "items": []});
                let mut i = 0u64;
                while data.to_string().len() < size {
                    let n = seq.wrapping_mul(7919).wrapping_add(i * 104_729);
                    items.push(json!({
                        "id": n % 1_000_000,
                        "name": format!("{} {}", WORDS[(n % 13) as usize], WORDS[(n / 13 % 13) as usize]),
                        "price": (n % 10_000) as f64 / 100.0,
                        "currency": "EUR",
                        "stock": n % 97,
                        "tags": [WORDS[(n / 7 % 13) as usize], "sale"],
                    }));
                    data["items"] = json!(items);
                    i += 1;
                }
                data
            }
            Self::Chat => {
                let mut text = String::new();
                let mut i = seq as usize;
                while text.len() + 60 < size {
                    text.push_str(LINES[i % LINES.len()]);
                    text.push(' ');
                    i += 7;
                }
                json!({"t": t, "seq": seq, "nick": format!("user{}", seq % 50), "text": text.trim_end()})
            }
        }
    }
}

const WORDS: [&str; 13] = [
    "widget", "gadget", "lamp", "chair", "table", "cable", "phone", "case", "shelf", "desk", "mug",
    "pen", "book",
];

const LINES: [&str; 8] = [
    "anyone around?",
    "the deploy went out at noon",
    "ok, looking at it now",
    "can you share the link again",
    "lunch at one?",
    "tests are green on main",
    "I'll be five minutes late",
    "nice work on the release",
];

/// A Pusher app, as `--pusher-app ID:KEY:SECRET` names it.
#[derive(Debug, Clone)]
pub struct PusherApp {
    pub id: String,
    pub key: String,
    pub secret: String,
}

impl PusherApp {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut parts = text.splitn(3, ':');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(id), Some(key), Some(secret)) if !id.is_empty() && !key.is_empty() => Ok(Self {
                id: id.into(),
                key: key.into(),
                secret: secret.into(),
            }),
            _ => bail!("--pusher-app is ID:KEY:SECRET"),
        }
    }

    /// The query that signs `POST path` with `body` (Pusher's HTTP API authentication).
    fn signed_query(&self, path: &str, body: &[u8]) -> String {
        use hmac::{Hmac, Mac};
        use md5::Digest;
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let query = format!(
            "auth_key={}&auth_timestamp={}&auth_version=1.0&body_md5={}",
            self.key,
            now_ns() / 1_000_000_000,
            hex(&md5::Md5::digest(body))
        );
        let mut mac =
            Hmac::<sha2::Sha256>::new_from_slice(self.secret.as_bytes()).expect("any key");
        mac.update(format!("POST\n{path}\n{query}").as_bytes());
        format!(
            "{query}&auth_signature={}",
            hex(&mac.finalize().into_bytes())
        )
    }
}

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Publisher {
    pub fn herald(server_url: &str, api_key: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            url: format!("{server_url}/api/publish"),
            template: None,
            headers: vec![("authorization".into(), format!("apikey {api_key}"))],
            pusher: None,
            content: Content::Pad,
        }
    }

    /// Publishes as a Pusher app's backend to the server at `server_url`: the event
    /// `bench` with the data as a JSON string, as the `pusher` SDKs send it.
    pub fn pusher(server_url: &str, app: PusherApp) -> Self {
        Self {
            http: reqwest::Client::new(),
            url: server_url.trim_end_matches('/').to_string(),
            template: None,
            headers: Vec::new(),
            pusher: Some(app),
            content: Content::Pad,
        }
    }

    pub fn generic(url: &str, template: &str, headers: &[String]) -> anyhow::Result<Self> {
        let headers = headers
            .iter()
            .map(|h| {
                h.split_once(':')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .with_context(|| format!("header {h:?} is not NAME: VALUE"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            http: reqwest::Client::new(),
            url: url.to_string(),
            template: Some(template.to_string()),
            headers,
            pusher: None,
            content: Content::Pad,
        })
    }

    /// The same publisher, its data holding `content`.
    pub fn with_content(self, content: Content) -> Self {
        Self { content, ..self }
    }

    /// Publishes `{"t": now, "seq": seq, …}` of about `payload` bytes (see [`Content`]).
    pub async fn publish(&self, channel: &str, seq: u64, payload: usize) -> anyhow::Result<()> {
        let data = self.content.data(seq, payload);
        if let Some(app) = &self.pusher {
            let path = format!("/apps/{}/events", app.id);
            let body = json!({"name": "bench", "channels": [pusher_name(channel)], "data": data.to_string()})
                .to_string();
            let query = app.signed_query(&path, body.as_bytes());
            let r = self
                .http
                .post(format!("{}{path}?{query}", self.url))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            if !r.status().is_success() {
                bail!(
                    "publish: HTTP {} {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                );
            }
            return Ok(());
        }
        let body = match &self.template {
            None => json!({"channel": channel, "data": data}).to_string(),
            Some(t) => t
                .replace("{channel}", channel)
                .replace("{data}", &data.to_string()),
        };
        let mut req = self
            .http
            .post(self.url.replace("{channel}", channel))
            .body(body);
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let r = req.send().await?;
        if !r.status().is_success() {
            bail!(
                "publish: HTTP {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }
}

/// A bench channel's name as a Pusher channel (Pusher names allow no `:`).
pub fn pusher_name(channel: &str) -> String {
    channel.replace(':', "-")
}

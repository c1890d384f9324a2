//! Command-line arguments (the `pub` and `sub` clients are in `pubsub.rs`).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

/// Herald: a real-time messaging server. Every browser transport, one channel model,
/// no message lost.
#[derive(Debug, Parser)]
#[command(name = "herald", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (durable storage in --data-dir by default; see docs/configuration.md).
    Serve(ServeArgs),
    /// Publish one message through the HTTP API and print its offset.
    Pub(PubArgs),
    /// Subscribe to a channel and print each publication as one JSON line.
    Sub(SubArgs),
    /// Mint a client token with the configured key, for tests and scripts.
    Token(TokenArgs),
    /// A live view of a running Herald, every node of it: connections, deliveries/s, how
    /// connections ended.
    Top(TopArgs),
    /// Measure Herald (or another server): the studies' experiments and the performance goals.
    Bench(Box<herald_bench::BenchArgs>),
    /// A load-generating process of `herald bench` (started by it, not by hand).
    #[command(hide = true)]
    BenchWorker { spec: String },
}

#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// TOML configuration file. Flags override environment variables, which override it.
    #[arg(long, short, env = "HERALD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on, IP:PORT or HOST:PORT (0.0.0.0:8080 for every interface) [env: HERALD_LISTEN] [default: 127.0.0.1:8080]
    #[arg(long, value_parser = listen_address)]
    pub listen: Option<SocketAddr>,
    /// Not an option: `--listen` takes the port. Kept to say so.
    #[arg(long, hide = true)]
    pub port: Option<String>,
    /// Key for the HTTP API (`Authorization: apikey KEY`) [env: HERALD_API_KEY]
    #[arg(long)]
    pub api_key: Option<String>,
    /// Directory for durable history [env: HERALD_DATA_DIR] [default: herald-data]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Where history is kept: durable (in --data-dir), memory, redis (shared by every node using --redis-url) or nats (JetStream, shared by every node using --nats-url) [env: HERALD_STORAGE] [default: durable]
    #[arg(long, value_parser = ["durable", "memory", "redis", "nats"])]
    pub storage: Option<String>,
    /// Redis for --storage redis [env: HERALD_REDIS__URL] [default: redis://127.0.0.1:6379]
    #[arg(long)]
    pub redis_url: Option<String>,
    /// NATS for --storage nats (comma-separated for a cluster) [env: HERALD_NATS__URL] [default: nats://127.0.0.1:4222]
    #[arg(long)]
    pub nats_url: Option<String>,
    /// Share the listening address with other processes (SO_REUSEPORT), e.g. several nodes on one machine [env: HERALD_REUSE_PORT]
    #[arg(long)]
    pub reuse_port: bool,
    /// When durable writes reach the disk: group, always, interval or none [env: HERALD_SYNC] [default: interval]
    #[arg(long, value_parser = ["group", "always", "interval", "none"])]
    pub sync: Option<String>,
    /// Worker threads, 0 = one per core [env: HERALD_WORKERS] [default: 0]
    #[arg(long)]
    pub workers: Option<usize>,
    /// Log level or tracing filter [env: HERALD_LOG_LEVEL] [default: info]
    #[arg(long)]
    pub log_level: Option<String>,
    /// Log format [env: HERALD_LOG_FORMAT] [default: text]
    #[arg(long, value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Browser origin allowed to connect (repeatable; `*` for any) [env: HERALD_ALLOWED_ORIGINS='["https://a.example"]']
    #[arg(long)]
    pub allowed_origin: Vec<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Herald's base URL.
    #[arg(long, env = "HERALD_URL", default_value = "http://127.0.0.1:8080", value_parser = base_url)]
    pub url: String,
}

/// `--listen`: an IP address and port, or a host name and port (resolved here).
fn listen_address(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(address) = s.parse() {
        return Ok(address);
    }
    if s.parse::<u16>().is_ok() {
        return Err(format!(
            "give an address with the port: 127.0.0.1:{s} (or 0.0.0.0:{s} for every interface)"
        ));
    }
    match s.to_socket_addrs() {
        Ok(mut found) => found
            .next()
            .ok_or_else(|| format!("{s} resolves to no address")),
        Err(e) => Err(format!(
            "not IP:PORT or HOST:PORT ({e}); for example 127.0.0.1:8080"
        )),
    }
}

/// `--url`: an absolute http(s) or ws(s) URL.
fn base_url(s: &str) -> Result<String, String> {
    if !s.contains("://") {
        return Err(format!("the URL needs its scheme: http://{s}"));
    }
    let url = reqwest::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" | "ws" | "wss" => Ok(s.trim_end_matches('/').to_string()),
        other => Err(format!(
            "{other}:// is not Herald's: use http:// or https://"
        )),
    }
}

#[derive(Debug, Args)]
pub struct PubArgs {
    /// Channel to publish to.
    pub channel: String,
    /// The message, as JSON (`{"text":"hi"}`, `42`, `"hi"`), or `-` to read it from standard
    /// input. A bare word (`hello`) is sent as a string; anything else that is not valid
    /// JSON is refused, unless --string says to send the text as it is.
    pub data: String,
    /// Send the message as a JSON string, exactly as given.
    #[arg(long)]
    pub string: bool,
    /// Publish once with this key, however often it is sent (default: a key of its own,
    /// which its retries carry). Retries: up to 4, when the server answers 503 or 504 or
    /// took the request without answering.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    /// API key.
    #[arg(long, env = "HERALD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

#[derive(Debug, Args)]
pub struct SubArgs {
    /// Channel to subscribe to.
    pub channel: String,
    /// Start after this offset: history after it is printed first (0 = all history).
    #[arg(long)]
    pub since: Option<u64>,
    /// Epoch the --since offset belongs to (from an earlier line's `epoch`).
    #[arg(long, requires = "since")]
    pub epoch: Option<String>,
    /// Exit after printing this many publications.
    #[arg(long)]
    pub count: Option<u64>,
    /// Transport to receive with (`iframe`: the forever frame's `<script>` chunks).
    #[arg(long, default_value = "ws", value_parser = ["ws", "sse", "stream", "iframe", "longpoll", "poll"])]
    pub transport: String,
    /// The WebSocket's codec: Herald's JSON, or its Protobuf (`herald.protobuf`, binary
    /// frames; printed as the same JSON). The other transports speak JSON only.
    #[arg(long, default_value = "json", value_parser = ["json", "protobuf"])]
    pub protocol: String,
    /// Time between requests with --transport poll.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Connection token (see `herald token`).
    #[arg(long, env = "HERALD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Subscription token for the channel.
    #[arg(long)]
    pub sub_token: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `herald token`: what the token says and how it is signed.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The user the token names (its `sub`, or the claim `auth.user_claim` names).
    #[arg(long)]
    pub user: String,
    /// How long the token is valid: `30s`, `10m`, `1h`, `7d`; `0` for no expiry.
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Channel pattern the user may subscribe to (and read history and presence of);
    /// `*` matches any characters, as in `chat:*`. Repeatable.
    #[arg(long = "grant", value_name = "PATTERN")]
    pub grants: Vec<String>,
    /// Channel pattern the user may publish to. Repeatable.
    #[arg(long = "publish", value_name = "PATTERN")]
    pub publish: Vec<String>,
    /// Channel the connection is subscribed to as it connects. Repeatable.
    #[arg(long = "channel", value_name = "NAME")]
    pub channels: Vec<String>,
    /// Public data about the user (JSON), shown to others.
    #[arg(long)]
    pub info: Option<String>,
    /// Mint a subscription token for this channel instead of a connection token.
    #[arg(long, value_name = "CHANNEL", conflicts_with_all = ["grants", "publish", "channels"])]
    pub subscription: Option<String>,
    /// Sign with this private key (PEM) instead of `auth.hmac_secret`.
    #[arg(long)]
    pub private_key: Option<PathBuf>,
    /// Algorithm for --private-key: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or
    /// EdDSA; with the HMAC secret: HS256, HS384 or HS512.
    #[arg(long)]
    pub alg: Option<String>,
    /// Key id (`kid`) to put in the header, for JWKS keys.
    #[arg(long)]
    pub kid: Option<String>,
    /// The configuration whose `[auth]` the token is for (HERALD_AUTH__* variables count
    /// too, as for `herald serve`).
    #[arg(long, short, env = "HERALD_CONFIG")]
    pub config: Option<PathBuf>,
}

fn parse_ttl(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// `herald top`: which server, and how often to look.
#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// API key with read scope (the view reads `/api/nodes` and `/metrics`).
    #[arg(long, env = "HERALD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Time between two looks (rates are over it).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Print one view (after two looks, for the rates) and exit, instead of redrawing.
    #[arg(long)]
    pub once: bool,
}

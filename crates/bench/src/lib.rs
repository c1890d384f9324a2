//! `herald bench`: reproduces the studies' experiments (`shared/reference/seed-experiments.md`)
//! against Herald or any other server, with load spread over worker processes and loopback
//! source addresses, server CPU and memory read from /proc, and results as tables, JSON
//! lines, Markdown and SVG charts.

pub mod client;
pub mod cores;
pub mod fleet;
pub mod netinfo;
pub mod procstat;
pub mod record;
pub mod report;
pub mod scenarios;
pub mod target;
pub mod worker;

use std::{path::PathBuf, time::Duration};

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: Scenario,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// N subscribers, M publications at rate R: latency, loss, deliveries/s, CPU per 1,000 deliveries.
    Fanout(scenarios::fanout::FanoutArgs),
    /// Idle connections of one transport until a target or the first failure: memory per connection.
    Capacity(scenarios::capacity::CapacityArgs),
    /// Study 1's load test: users arrive at a fixed rate and stay; full-load broadcast time, errors, MTBF.
    Ramp(scenarios::ramp::RampArgs),
    /// Study 1's client experiment: two clients speak every 2.5 s over each transport; bytes and packets.
    Transports(scenarios::transports::TransportsArgs),
    /// Study 2: publish interval x clients x transport; messages received, unique, trip time, CPU, packets.
    Pushpull(scenarios::pushpull::PushpullArgs),
    /// Fan-out over a range of publication sizes (studies 4 and 5).
    Payload(scenarios::payload::PayloadArgs),
    /// Study 5: bursts of connections at once, repeated.
    Burst(scenarios::burst::BurstArgs),
    /// Study 5: clients that connect, stay a while, leave and come back.
    Churn(scenarios::churn::ChurnArgs),
    /// Bytes on the wire for a document changing a little per publication: plain and with
    /// Fossil deltas, beside Centrifugo's (`--centrifugo`).
    Delta(scenarios::delta::DeltaArgs),
    /// Study 4: clients fetch a 130 KB document every second through the server from a backend
    /// (Herald's rpc hook), one more every 2 s, until the server degrades.
    Fetch(scenarios::fetch::FetchArgs),
    /// Presence at scale: members of one channel (several nodes on Redis for more than one
    /// process holds), presence_stats and pages over the wire, join cost, and the pushes of a
    /// mass reconnect.
    Presence(scenarios::presence::PresenceArgs),
}

#[derive(Debug, Args, Clone)]
pub struct Common {
    /// A running server to measure (`http://IP:PORT`); default: start a Herald for the run.
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// The server's process id, for its CPU and memory (default: the Herald this tool
    /// starts); repeat it for a server of several processes, whose figures are summed.
    /// With the Herald this tool starts, more processes to count with it (the Redis
    /// servers a `--redis-url` names).
    #[arg(long, global = true)]
    pub pid: Vec<u32>,
    /// Herald processes to start on one address (`--reuse-port`), sharing channels through
    /// Redis (or NATS, with `--nats-url`): for more connections than one process may hold.
    /// Their CPU and memory (and Redis's) are summed.
    #[arg(long, global = true, default_value_t = 1)]
    pub nodes: usize,
    /// The Redis those nodes use; default: a `redis-server` this tool starts.
    #[arg(long, global = true)]
    pub redis_url: Option<String>,
    /// A NATS with JetStream for those nodes to share instead of Redis (count its process
    /// with `--pid`).
    #[arg(long, global = true, conflicts_with = "redis_url")]
    pub nats_url: Option<String>,
    /// API key of the target Herald's publish API (default: the key of the Herald started here).
    #[arg(long, global = true)]
    pub api_key: Option<String>,
    /// Extra argument for the Herald this tool starts (repeatable), e.g. `--server-arg=--storage=memory`.
    #[arg(long = "server-arg", global = true, allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Load-generating worker processes, at least (more when there are too many clients for one).
    #[arg(long, global = true, default_value_t = 2)]
    pub workers: usize,
    /// Print JSON lines instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Also write the results as Markdown to this file.
    #[arg(long, global = true)]
    pub markdown: Option<PathBuf>,
    /// Also write SVG charts (latency, connections, CPU, memory over time) into this directory.
    #[arg(long, global = true)]
    pub charts: Option<PathBuf>,
    /// Repeat each measurement this many times and report the median run (by its main figure).
    #[arg(long, global = true, default_value_t = 1)]
    pub repeat: usize,
    /// WebSocket clients offer permessage-deflate as browsers do (`permessage-deflate;
    /// client_max_window_bits`) and inflate what comes compressed; bytes on the wire are
    /// counted as they travel.
    #[arg(long, global = true)]
    pub deflate: bool,
    /// The codec of Herald's WebSocket clients: `json`, or `protobuf` (Herald's Protobuf
    /// codec, `herald.protobuf`: binary frames, read back as JSON by the clients).
    #[arg(long, global = true, default_value = "json", value_parser = ["json", "protobuf"])]
    pub protocol: String,
    /// Herald's WebSocket clients subscribe with `delta: "fossil"` and apply every delta
    /// (checked by its checksum) to read the publication's stamp.
    #[arg(long, global = true)]
    pub delta: bool,
    /// What a publication's data holds besides its stamp: `pad` (one repeated letter),
    /// `json` (a catalogue of items, as a shop or dashboard pushes) or `chat` (a nick and a
    /// line of chat), about `--payload` bytes. Compression depends on it.
    #[arg(long, global = true, default_value = "pad", value_parser = target::Content::parse)]
    pub content: target::Content,
    /// Measure through the Pusher protocol (`ID:KEY:SECRET` of an app): clients connect to
    /// `/app/KEY?protocol=7` and subscribe with `pusher:subscribe`; publications go through
    /// the signed `POST /apps/ID/events`. The Herald this tool starts gets the app
    /// (`HERALD_PUSHER__APPS`); a Pusher server of another kind is named by `--url`.
    /// Channel names use `-` for `:` (Pusher names allow no `:`).
    #[arg(long, global = true)]
    pub pusher_app: Option<String>,
    /// With `--pusher-app`: each client connects as a page that opted in to resuming
    /// (`/resume/PAGE/app/KEY`, a page id of its own), to measure that path.
    #[arg(long, global = true, requires = "pusher_app")]
    pub pusher_resume: bool,
    /// Cores the server runs on (a `taskset` list: `0`, `0-1`): the Herald or the floor
    /// started here, or every process `--pid` names (all their threads). With
    /// `--client-cores`: latency at equal load on separate cores (benchmarks.md).
    #[arg(long, global = true)]
    pub server_cores: Option<String>,
    /// A cgroup directory the server runs in, made beforehand with its CPU quota (version 1:
    /// `/sys/fs/cgroup/cpu/NAME` with `cpu.cfs_quota_us`; version 2: `/sys/fs/cgroup/NAME`
    /// with `cpu.max`): the Herald or the floor started here from its first instruction, or
    /// every process `--pid` names when the run begins. With `--client-cores`: latency under
    /// a quota, as in a container (benchmarks.md).
    #[arg(long, global = true)]
    pub server_cgroup: Option<PathBuf>,
    /// Cores this tool and its worker processes (the clients and the publisher) run on.
    #[arg(long, global = true)]
    pub client_cores: Option<String>,
    /// Read Herald with the generic client, the one that reads every other server (it finds
    /// each publication's stamp and checks nothing else), instead of Herald's own, which also
    /// parses each push and checks its offset for repeats and gaps: to compare latency with
    /// a server read alike. WebSocket and SSE; other transports keep Herald's own client.
    #[arg(long, global = true, conflicts_with_all = ["floor", "pusher_app", "client_url"])]
    pub generic_client: bool,
    /// Measure the uWebSockets floor instead of Herald: Bun's native pub/sub with no
    /// protocol (`tools/uws-floor/floor.ts`), started here on a free port.
    #[arg(long, global = true, conflicts_with_all = ["url", "pusher_app"])]
    pub floor: bool,
    /// The `bun` that runs the floor (`npm install` in `tools/uws-floor` puts it here).
    #[arg(
        long,
        global = true,
        default_value = "tools/uws-floor/node_modules/@oven/bun-linux-x64/bin/bun"
    )]
    pub bun: PathBuf,
    #[command(flatten)]
    pub generic: GenericArgs,
}

/// Any other server: where its clients connect and how they subscribe; how to publish to it.
#[derive(Debug, Args, Clone, Default)]
pub struct GenericArgs {
    /// A non-Herald WebSocket (`ws://…`), SSE (`http://…`) or long-polling
    /// (`longpoll+http://…`, Nchan's `Last-Modified`/`ETag` protocol) endpoint; `{channel}` is
    /// replaced.
    #[arg(long, global = true)]
    pub client_url: Option<String>,
    /// Frame a WebSocket client sends after connecting (repeatable); `{channel}` is replaced.
    #[arg(long, global = true)]
    pub subscribe_frame: Vec<String>,
    /// Text the server must send before the frame of the same position is sent (repeatable;
    /// an empty one means no wait), for protocols with a handshake.
    #[arg(long, global = true)]
    pub wait_for: Vec<String>,
    /// A frame WebSocket clients send every --heartbeat-interval (client heartbeats).
    #[arg(long, global = true)]
    pub heartbeat_frame: Option<String>,
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "25s")]
    pub heartbeat_interval: Duration,
    /// A message a server's WebSocket clients must answer (an application ping: Centrifugo's
    /// is `{}`, and it drops a client that does not answer within seconds of its 25 s ping);
    /// the clients answer each with --pong-frame.
    #[arg(long, global = true, requires = "pong_frame")]
    pub ping_frame: Option<String>,
    /// The answer to each --ping-frame (Centrifugo: `{}`).
    #[arg(long, global = true, requires = "ping_frame")]
    pub pong_frame: Option<String>,
    /// URL to POST publications to, `{channel}` replaced (default: Herald's /api/publish).
    #[arg(long, global = true)]
    pub publish_url: Option<String>,
    /// Body of a publication with `{channel}` and `{data}` (a JSON object holding "t" and "seq").
    #[arg(
        long,
        global = true,
        default_value = r#"{"channel":"{channel}","data":{data}}"#
    )]
    pub publish_body: String,
    /// Header of the publish request, `Name: value` (repeatable).
    #[arg(long, global = true)]
    pub publish_header: Vec<String>,
}

/// Runs one scenario and prints its results.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let (soft, hard) = procstat::raise_fd_limit();
    if soft < 20_000 {
        eprintln!(
            "note: open-file limit is {soft} (hard {hard}) and cannot be raised further here; \
             each worker process holds at most that many connections"
        );
    }
    // Before any thread or worker process is made: they inherit the cores.
    if let Some(cores) = &args.common.client_cores {
        cores::pin(&[std::process::id()], cores)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let outcome = rt.block_on(scenarios::run(args.scenario, &args.common))?;
    if args.common.json {
        print!("{}", report::json_lines(&outcome));
    } else {
        print!("{}", report::text(&outcome));
    }
    if let Some(path) = &args.common.markdown {
        std::fs::write(path, report::markdown(&outcome))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(dir) = &args.common.charts {
        for f in report::charts(&outcome, dir)? {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}

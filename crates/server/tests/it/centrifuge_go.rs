//! `centrifuge-go` (Centrifugo's Go SDK, the real module) against Herald's Centrifugo
//! front, in both of its codecs: `tests/centrifuge-go/main.go` is a client this test drives
//! a command per line and reads an event per line from. The Go toolchain builds it once
//! per run (from the Go module proxy, then its cache).

use std::{
    collections::VecDeque,
    path::PathBuf,
    process::Stdio,
    sync::OnceLock,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout},
};

use crate::{
    auth::{auth_config, claims, hs256},
    support::{config, start, start_embedded, TestServer, PATIENCE},
};

/// The built client: `go build` once for every test of the run.
fn binary() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/centrifuge-go");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("centrifuge-go-client");
        let built = std::process::Command::new("go")
            .args(["build", "-buildvcs=false", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(&source)
            .status()
            .expect("go (1.25 or newer) must be installed to build the centrifuge-go client");
        assert!(built.success(), "go build of tests/centrifuge-go failed");
        out
    })
}

/// A running centrifuge-go client.
struct GoClient {
    child: Child,
    commands: ChildStdin,
    events: Lines<BufReader<ChildStdout>>,
    /// Lines read but not yet asked for, in order.
    unread: VecDeque<Value>,
    /// Every line read so far, for failure messages.
    seen: Vec<Value>,
}

impl GoClient {
    /// Starts one against `server`'s front, speaking Protobuf if asked, with `args` more.
    fn start(server: &TestServer, protobuf: bool, args: &[&str]) -> Self {
        let binary = binary();
        let url = server
            .url("/centrifugo/connection/websocket")
            .replace("http", "ws");
        let mut child = tokio::process::Command::new(binary)
            .arg(format!("-url={url}"))
            .arg(format!("-protobuf={protobuf}"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the centrifuge-go client starts");
        let commands = child.stdin.take().expect("piped");
        let events = BufReader::new(child.stdout.take().expect("piped")).lines();
        Self {
            child,
            commands,
            events,
            unread: VecDeque::new(),
            seen: Vec::new(),
        }
    }

    async fn send(&mut self, command: Value) {
        let mut line = command.to_string();
        line.push('\n');
        self.commands
            .write_all(line.as_bytes())
            .await
            .expect("the client reads its commands");
    }

    /// The first line not yet taken that `matches`; the others stay for later calls.
    async fn until(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        if let Some(at) = self.unread.iter().position(&matches) {
            return self.unread.remove(at).expect("found");
        }
        let waited = tokio::time::timeout(PATIENCE, async {
            loop {
                let line = self.events.next_line().await.expect("readable stdout");
                let line = line?;
                let value: Value = serde_json::from_str(&line).expect("a JSON line");
                self.seen.push(value.clone());
                if matches(&value) {
                    return Some(value);
                }
                self.unread.push_back(value);
            }
        })
        .await;
        match waited {
            Ok(Some(value)) => value,
            Ok(None) => panic!("the client exited before {what}; it said {:#?}", self.seen),
            Err(_) => panic!(
                "timed out waiting for {what}; the client said {:#?}",
                self.seen
            ),
        }
    }

    /// Sends `command` and returns its reply, which must not be an error.
    async fn call(&mut self, command: Value) -> Value {
        let name = command["do"].as_str().unwrap().to_owned();
        self.send(command).await;
        let reply = self
            .until(&format!("the {name} reply"), |v| {
                v["reply"] == name.as_str()
            })
            .await;
        assert!(reply.get("error").is_none(), "{name} failed: {reply}");
        reply
    }

    async fn event(&mut self, event: &str, channel: &str) -> Value {
        self.until(&format!("{event} on {channel}"), |v| {
            v["event"] == event && (channel.is_empty() || v["channel"] == channel)
        })
        .await
    }

    async fn quit(mut self) {
        self.send(json!({"do": "quit"})).await;
        let _ = tokio::time::timeout(PATIENCE, self.child.wait()).await;
    }
}

#[tokio::test]
async fn centrifuge_go_subscribes_publishes_and_reads_in_both_codecs() {
    for protobuf in [false, true] {
        let server = start(auth_config()).await;
        let channel = "chat:go";
        server.publish(channel, json!({"text": "before"})).await;
        let token = hs256(&claims("alice", json!({"info": {"name": "Alice"}})));
        let mut go = GoClient::start(&server, protobuf, &[&format!("-token={token}")]);
        go.call(json!({"do": "connect"})).await;
        go.event("connected", "").await;
        go.call(json!({"do": "subscribe", "channel": channel, "join_leave": true}))
            .await;
        let subscribed = go.event("subscribed", channel).await;
        assert_eq!(subscribed["offset"], 1, "codec protobuf={protobuf}");
        let join = go.event("join", channel).await;
        assert_eq!(join["user"], "alice");

        server
            .publish(channel, json!({"text": "from the api"}))
            .await;
        let from_api = go.event("publication", channel).await;
        assert_eq!(
            (&from_api["offset"], &from_api["data"]),
            (&json!(2), &json!({"text": "from the api"}))
        );
        go.call(json!({"do": "publish", "channel": channel, "data": {"text": "from go"}}))
            .await;
        let own = go.event("publication", channel).await;
        assert_eq!(own["offset"], 3);
        assert_eq!(own["data"], json!({"text": "from go"}));
        assert_eq!(own["info"]["user"], "alice");
        assert_eq!(own["info"]["conn_info"], json!({"name": "Alice"}));

        let history = go
            .call(json!({"do": "history", "channel": channel, "limit": 10}))
            .await;
        let texts: Vec<&Value> = history["publications"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["data"]["text"])
            .collect();
        assert_eq!(texts, ["before", "from the api", "from go"]);
        assert_eq!(history["offset"], 3);
        assert_eq!(history["epoch"], subscribed["epoch"]);

        let presence = go.call(json!({"do": "presence", "channel": channel})).await;
        let members: Vec<&Value> = presence["clients"].as_object().unwrap().values().collect();
        assert_eq!(members.len(), 1, "{presence}");
        assert_eq!(members[0]["user"], "alice");
        let stats = go
            .call(json!({"do": "presence_stats", "channel": channel}))
            .await;
        assert_eq!((&stats["clients"], &stats["users"]), (&json!(1), &json!(1)));

        // A refusal is Centrifugo's error, and the connection stays.
        go.send(json!({"do": "publish", "channel": "news:go", "data": {}}))
            .await;
        let refused = go.until("the refusal", |v| v["reply"] == "publish").await;
        assert_eq!(refused["code"], 103, "permission denied: {refused}");
        go.call(json!({"do": "presence_stats", "channel": channel}))
            .await;
        go.quit().await;
    }
}

/// A client that missed publications while the server was down gets them on its
/// reconnect, from the durable store that outlived the restart: `recovered`, in order,
/// none twice. Centrifugo's memory engine forgets its streams on a restart.
#[tokio::test]
async fn centrifuge_go_recovers_across_a_restart_of_the_durable_store() {
    let dir = tempfile::tempdir().unwrap();
    let durable = |front: bool| {
        let mut c = config();
        c.data_dir = dir.path().to_owned();
        c.centrifugo.enabled = front;
        c
    };
    let channel = "chat:recover";
    let server = start_embedded(durable(true)).await;
    let addr = server.addr;
    let mut go = GoClient::start(&server, true, &[]);
    go.call(json!({"do": "connect"})).await;
    go.call(json!({"do": "subscribe", "channel": channel}))
        .await;
    let first = go.event("subscribed", channel).await;
    for i in 1..=3 {
        server.publish(channel, json!(i)).await;
        assert_eq!(go.event("publication", channel).await["offset"], i);
    }
    server.stop().await.unwrap();
    go.until("a reconnect", |v| {
        v["event"] == "connecting" && v["code"] != 0
    })
    .await;

    // Back on the same port with the front off: the client's reconnects are refused
    // while the API publishes what it will have to recover.
    let mut off = durable(false);
    off.listen = addr;
    let server = start_embedded(off).await;
    for i in 4..=6 {
        server.publish(channel, json!(i)).await;
    }
    server.stop().await.unwrap();
    let mut on = durable(true);
    on.listen = addr;
    let server = start_embedded(on).await;

    let resubscribed = go
        .until("the resubscription", |v| {
            v["event"] == "subscribed" && v["was_recovering"] == true
        })
        .await;
    assert_eq!(resubscribed["recovered"], true, "{resubscribed}");
    assert_eq!(resubscribed["epoch"], first["epoch"]);
    for i in 4..=6 {
        let p = go.event("publication", channel).await;
        assert_eq!((&p["offset"], &p["data"]), (&json!(i), &json!(i)));
    }
    server.publish(channel, json!(7)).await;
    assert_eq!(go.event("publication", channel).await["offset"], 7);
    go.quit().await;
}

/// Centrifugo's clients count on the server's ping every `ping` seconds of the connect
/// reply, whatever else they hear, and reconnect when one is late: a client that keeps
/// talking still hears one every period (a WebSocket ping only on a quiet line would not do).
#[tokio::test]
async fn centrifuge_go_stays_connected_while_it_talks_past_several_pings() {
    let mut cfg = config();
    cfg.client.ping_interval = Duration::from_secs(1);
    cfg.client.idle_timeout = Duration::from_secs(3);
    let server = start(cfg).await;
    // It waits at most 1 s + 300 ms for each ping.
    let mut go = GoClient::start(&server, false, &["-max-ping-delay=300ms"]);
    go.call(json!({"do": "connect"})).await;
    go.event("connected", "").await;
    go.seen.clear();
    let started = Instant::now();
    let mut said = 0;
    while started.elapsed() < Duration::from_secs(4) {
        go.call(json!({"do": "publish", "channel": "chat:talk", "data": said}))
            .await;
        said += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dropped: Vec<&Value> = go
        .seen
        .iter()
        .filter(|v| v["event"] == "disconnected" || v["event"] == "connecting")
        .collect();
    assert!(dropped.is_empty(), "the client reconnected: {dropped:?}");
    go.quit().await;
}

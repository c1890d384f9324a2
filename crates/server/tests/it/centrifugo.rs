//! Centrifugo's own SDKs against Herald's Centrifugo front. `centrifuge-go` (the Go client
//! module, both of its codecs): `tests/centrifuge-go/main.go` is a client the tests drive a
//! command per line and read an event per line from, built once per run by the Go
//! toolchain (from the Go module proxy, then its cache). `cent` (the Python server SDK,
//! from PyPI, in a virtual environment of the run's own): `tests/cent/calls.py` calls
//! Centrifugo's server API on Herald.

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
    support::{config, response, start, start_embedded, TestServer, KEY, PATIENCE},
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

/// `POST /centrifugo/api/{method}` with `X-API-Key`, as Centrifugo's server API.
async fn centrifugo_api(server: &TestServer, key: &str, method: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(server.url(&format!("/centrifugo/api/{method}")))
        .header("X-API-Key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    response(r).await
}

/// A backend written against Centrifugo's server API keeps its calls: publish, broadcast,
/// history, history_remove, presence, presence_stats, unsubscribe and disconnect, answered
/// `{"result": …}` or `{"error": …}`, reaching a centrifuge-go client as Centrifugo's would.
#[tokio::test]
async fn centrifugos_server_api_publishes_reads_and_acts_on_connections() {
    use herald_server::config::{ApiKey, ApiScope};
    let mut cfg = auth_config();
    cfg.api_keys = vec![
        ApiKey::Scoped {
            key: "read-only-key-0123".into(),
            scope: ApiScope::Read,
        },
        ApiKey::Scoped {
            key: "publish-only-key-0123".into(),
            scope: ApiScope::Publish,
        },
    ];
    let server = start(cfg).await;
    let channel = "chat:api";
    let token = hs256(&claims("bob", json!({})));
    let mut go = GoClient::start(&server, false, &[&format!("-token={token}")]);
    go.call(json!({"do": "connect"})).await;
    go.call(json!({"do": "subscribe", "channel": channel}))
        .await;
    go.event("subscribed", channel).await;

    let (status, published) = centrifugo_api(
        &server,
        KEY,
        "publish",
        json!({"channel": channel, "data": {"n": 1}, "tags": {"ignored": "yes"}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(published["result"]["offset"], 1, "{published}");
    let epoch = published["result"]["epoch"].clone();
    assert!(epoch.is_string());
    let p = go.event("publication", channel).await;
    assert_eq!(p["data"], json!({"n": 1}));

    let (_, broadcast) = centrifugo_api(
        &server,
        KEY,
        "broadcast",
        json!({"channels": [channel, "chat:other", "bad channel"], "data": {"n": 2}}),
    )
    .await;
    let responses = broadcast["result"]["responses"].as_array().unwrap();
    assert_eq!(responses[0]["result"]["offset"], 2, "{broadcast}");
    assert_eq!(responses[1]["result"]["offset"], 1);
    assert!(responses[2]["error"]["code"].is_number(), "{broadcast}");
    assert_eq!(
        go.event("publication", channel).await["data"],
        json!({"n": 2})
    );

    // No limit: the stream's position only; -1: everything; since: what follows it.
    let read = ["read-only-key-0123", KEY];
    let (_, position) =
        centrifugo_api(&server, read[0], "history", json!({"channel": channel})).await;
    assert_eq!(position["result"]["offset"], 2, "{position}");
    assert_eq!(position["result"]["epoch"], epoch);
    assert!(position["result"].get("publications").is_none());
    let (_, all) = centrifugo_api(
        &server,
        read[1],
        "history",
        json!({"channel": channel, "limit": -1}),
    )
    .await;
    let offsets: Vec<&Value> = all["result"]["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["offset"])
        .collect();
    assert_eq!(offsets, [1, 2]);
    let (_, after) = centrifugo_api(
        &server,
        KEY,
        "history",
        json!({"channel": channel, "limit": 10, "since": {"offset": 1, "epoch": epoch}}),
    )
    .await;
    assert_eq!(
        after["result"]["publications"][0]["data"],
        json!({"n": 2}),
        "{after}"
    );

    let (_, presence) =
        centrifugo_api(&server, read[0], "presence", json!({"channel": channel})).await;
    let members: Vec<&Value> = presence["result"]["presence"]
        .as_object()
        .unwrap()
        .values()
        .collect();
    assert_eq!(members.len(), 1, "{presence}");
    assert_eq!(members[0]["user"], "bob");
    let (_, stats) = centrifugo_api(
        &server,
        read[0],
        "presence_stats",
        json!({"channel": channel}),
    )
    .await;
    assert_eq!(stats["result"], json!({"num_clients": 1, "num_users": 1}));

    // Keys and methods: a read key cannot publish, no key is no call, and an unknown
    // method says which are served.
    let (status, refused) = centrifugo_api(
        &server,
        read[0],
        "publish",
        json!({"channel": channel, "data": 1}),
    )
    .await;
    assert_eq!(status, 403, "{refused}");
    let (status, _) = centrifugo_api(&server, "wrong-key-0123456", "presence", json!({})).await;
    assert_eq!(status, 401);
    let (status, unknown) = centrifugo_api(&server, KEY, "refresh", json!({})).await;
    assert_eq!(status, 404);
    assert!(unknown["error"]["message"]
        .as_str()
        .unwrap()
        .contains("publish"));
    let (status, bad) = centrifugo_api(&server, KEY, "publish", json!({"data": 1})).await;
    assert_eq!((status, &bad["error"]["code"]), (200, &json!(107)), "{bad}");
    // What Herald cannot do is refused, not half done: binary data, no channels, history
    // backwards.
    for (method, body, why) in [
        (
            "publish",
            json!({"channel": channel, "data": 1, "b64data": "AAE="}),
            "b64data",
        ),
        ("broadcast", json!({"channels": [], "data": 1}), "channels"),
        (
            "history",
            json!({"channel": channel, "limit": 5, "reverse": true}),
            "reverse",
        ),
    ] {
        let (status, refused) = centrifugo_api(&server, KEY, method, body).await;
        assert_eq!(
            (status, &refused["error"]["code"]),
            (200, &json!(107)),
            "{method}: {refused}"
        );
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{method}: {refused}");
    }

    // Channels with subscribers, by pattern, and the nodes: bob's subscription counts.
    let (_, listed) = centrifugo_api(&server, KEY, "channels", json!({"pattern": "chat:*"})).await;
    assert_eq!(
        listed["result"]["channels"],
        json!({"chat:api": {"num_clients": 1}}),
        "{listed}"
    );
    for pattern in ["chat:?pi", "*api", "", "*"] {
        let (_, listed) =
            centrifugo_api(&server, KEY, "channels", json!({"pattern": pattern})).await;
        assert!(
            listed["result"]["channels"]["chat:api"].is_object(),
            "{pattern}: {listed}"
        );
    }
    let (_, none) = centrifugo_api(&server, KEY, "channels", json!({"pattern": "news:*"})).await;
    assert_eq!(none["result"]["channels"], json!({}), "{none}");
    let (_, info) = centrifugo_api(&server, "read-only-key-0123", "info", json!({})).await;
    let nodes = info["result"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{info}");
    assert_eq!(
        (
            &nodes[0]["num_clients"],
            &nodes[0]["num_users"],
            &nodes[0]["num_subs"]
        ),
        (&json!(1), &json!(1), &json!(1)),
        "{info}"
    );
    assert!(
        nodes[0]["uid"].is_string() && nodes[0]["version"].is_string(),
        "{info}"
    );

    // A batch: each command answered in order as `{METHOD: RESULT}` or its error, each
    // checked against the key's scope (a read key's publish is refused, its reads pass).
    let commands = json!({"commands": [
        {"presence_stats": {"channel": channel}},
        {"publish": {"channel": channel, "data": {"n": "batched"}}},
        {"nonsense": {}},
        {"batch": {"commands": []}},
        {"history": {"channel": channel, "limit": 1}},
    ], "parallel": true});
    let (status, read_only) =
        centrifugo_api(&server, "read-only-key-0123", "batch", commands.clone()).await;
    assert_eq!(status, 200);
    let replies = read_only["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 5, "{read_only}");
    assert_eq!(
        replies[0]["presence_stats"]["num_clients"], 1,
        "{read_only}"
    );
    assert_eq!(replies[1]["error"]["code"], 103, "{read_only}");
    assert_eq!(replies[2]["error"]["code"], 104, "{read_only}");
    assert_eq!(replies[3]["error"]["code"], 107, "{read_only}");
    assert_eq!(
        replies[4]["history"]["publications"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // A publish key's batch: its publish passes, its reads are refused.
    let (status, publisher) =
        centrifugo_api(&server, "publish-only-key-0123", "batch", commands.clone()).await;
    assert_eq!(status, 200, "{publisher}");
    let replies = publisher["replies"].as_array().unwrap();
    assert_eq!(replies[0]["error"]["code"], 103, "{publisher}");
    assert!(replies[1]["publish"]["offset"].is_u64(), "{publisher}");
    assert_eq!(replies[4]["error"]["code"], 103, "{publisher}");
    assert_eq!(
        go.event("publication", channel).await["data"],
        json!({"n": "batched"})
    );
    let (status, _) = centrifugo_api(&server, "wrong-key-0123456", "batch", commands.clone()).await;
    assert_eq!(status, 401);
    // A command of two methods, and a batch past 1,000 commands, are refused.
    let two = json!({"commands": [{"info": {}, "channels": {}}]});
    let (_, refused) = centrifugo_api(&server, KEY, "batch", two).await;
    assert_eq!(refused["replies"][0]["error"]["code"], 107, "{refused}");
    let many = json!({"commands": vec![json!({"info": {}}); 1001]});
    let (_, refused) = centrifugo_api(&server, KEY, "batch", many).await;
    assert_eq!(refused["error"]["code"], 107, "{refused}");
    let (_, full) = centrifugo_api(&server, KEY, "batch", commands).await;
    let offset = full["replies"][1]["publish"]["offset"].as_u64().unwrap();
    assert_eq!(
        go.event("publication", channel).await["data"],
        json!({"n": "batched"})
    );
    assert_eq!(full["replies"][4]["history"]["offset"], offset, "{full}");

    let (_, removed) =
        centrifugo_api(&server, KEY, "history_remove", json!({"channel": channel})).await;
    assert_eq!(removed, json!({"result": {}}));
    let (_, emptied) = centrifugo_api(
        &server,
        KEY,
        "history",
        json!({"channel": channel, "limit": -1}),
    )
    .await;
    assert_ne!(emptied["result"]["epoch"], epoch, "{emptied}");

    let (_, unsubscribed) = centrifugo_api(
        &server,
        KEY,
        "unsubscribe",
        json!({"user": "bob", "channel": channel}),
    )
    .await;
    assert_eq!(unsubscribed, json!({"result": {}}));
    let gone = go.event("unsubscribed", channel).await;
    assert_eq!(gone["code"], 2000, "{gone}");
    let (_, disconnected) = centrifugo_api(
        &server,
        KEY,
        "disconnect",
        json!({"user": "bob", "disconnect": {"code": 3501, "reason": "go away"}}),
    )
    .await;
    assert_eq!(disconnected, json!({"result": {}}));
    let closed = go.event("disconnected", "").await;
    assert_eq!(closed["reason"], "go away", "{closed}");
    go.quit().await;
}

/// A Python with `cent` (Centrifugo's server SDK, the pinned `tests/cent/requirements.txt`
/// from PyPI) in a virtual environment of the run's own: made once per run.
fn cent_python() -> &'static PathBuf {
    static MADE: OnceLock<PathBuf> = OnceLock::new();
    MADE.get_or_init(|| {
        let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cent-venv");
        let python = venv.join("bin/python");
        let requirements =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cent/requirements.txt");
        let run = |command: &mut std::process::Command, what: &str| {
            let status = command.status().unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(status.success(), "{what} failed");
        };
        if !python.exists() {
            run(
                std::process::Command::new("python3")
                    .arg("-m")
                    .arg("venv")
                    .arg(&venv),
                "python3 -m venv (Python 3.9 or newer must be installed)",
            );
        }
        run(
            std::process::Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "-r",
                ])
                .arg(&requirements),
            "pip install of tests/cent/requirements.txt",
        );
        python
    })
}

/// The same API through `cent`, Centrifugo's Python SDK, as a backend would call it.
#[tokio::test]
async fn cent_the_python_server_sdk_calls_centrifugos_api_on_herald() {
    // First: installing `cent` blocks the test's runtime, which runs the server too (on a
    // fresh machine it took over a minute, and the listener was gone for idle by then).
    let python = cent_python().clone();
    let server = start(config()).await;
    let mut listener = server.client().await;
    listener.subscribe("chat:cent", None).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cent/calls.py");
    let url = server.url("/centrifugo/api");
    let out = tokio::process::Command::new(python)
        .arg(script)
        .args([&url, KEY, "chat:cent"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cent failed: {stderr}");
    let said: std::collections::HashMap<String, Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["call"].as_str().unwrap().to_owned(), v)
        })
        .collect();
    let result = |call: &str| &said[call]["result"];
    assert_eq!(result("publish")["offset"], 1, "{said:?}");
    let epoch = &result("publish")["epoch"];
    let responses = &result("broadcast")["responses"];
    assert_eq!(responses[0]["result"]["offset"], 2, "{said:?}");
    assert_eq!(responses[1]["result"]["offset"], 1);
    let data = |call: &str| -> Vec<Value> {
        result(call)["publications"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["data"].clone())
            .collect()
    };
    assert_eq!(data("history"), [json!({"n": 1}), json!({"n": 2})]);
    assert_eq!(&result("history")["epoch"], epoch);
    assert_eq!(data("history_since"), [json!({"n": 2})]);
    assert_eq!(result("presence_stats")["num_clients"], 1);
    for call in ["unsubscribe", "disconnect", "history_remove"] {
        assert!(
            said[call].get("error").is_none(),
            "{call}: {:?}",
            said[call]
        );
    }
    assert_eq!(
        result("channels")["channels"],
        json!({"chat:cent": {"num_clients": 1}})
    );
    assert_eq!(result("channels_none")["channels"], json!({}));
    let nodes = result("info")["nodes"].as_array().unwrap();
    assert_eq!(
        (nodes.len(), &nodes[0]["num_clients"]),
        (1, &json!(1)),
        "{said:?}"
    );
    let replies = result("batch")["replies"].as_array().unwrap();
    assert_eq!(replies[0]["offset"], 3, "{said:?}");
    assert_eq!(replies[1]["num_clients"], 1, "{said:?}");
    assert_eq!(replies[2]["publications"].as_array().unwrap().len(), 3);
    drop(listener);
    // Herald's code for an invalid channel name (Centrifugo has none of its own: codes
    // from 113 pass as they are).
    assert_eq!(said["bad_channel"]["error"]["code"], 114, "{said:?}");
}

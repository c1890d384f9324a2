//! The `herald` binary as scripts use it: `serve`, `pub`, `sub`, configuration sources.

use std::{process::Stdio, time::Duration};

use serde_json::Value;

mod support;

use support::{fails, herald, succeeds, Server, KEY};

fn publish(server: &Server, channel: &str, data: &str) -> u64 {
    let out =
        succeeds(herald().args(["pub", "--url", &server.url, "--api-key", KEY, channel, data]));
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn pub_prints_offsets_and_sub_prints_json_lines_then_exits_after_count() {
    let server = Server::start(&[]);
    // The same lines whichever codec the WebSocket speaks.
    for protocol in ["json", "protobuf"] {
        let channel = format!("chat:cli-{protocol}");
        assert_eq!(publish(&server, &channel, r#"{"text":"one"}"#), 1);
        assert_eq!(publish(&server, &channel, "two"), 2);
        let sub = herald()
            .args(["sub", &channel, "--since", "0", "--count", "3"])
            .args(["--protocol", protocol])
            .env("HERALD_URL", &server.url)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Whether the third arrives from history or live, it arrives exactly once.
        assert_eq!(publish(&server, &channel, "[3]"), 3);
        let out = sub.wait_with_output().unwrap();
        assert!(out.status.success(), "{protocol}");
        let lines: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{protocol}");
        assert_eq!(lines[0]["channel"], *channel);
        assert_eq!(lines[0]["data"]["text"], "one");
        assert_eq!(lines[1]["data"], "two");
        assert_eq!(lines[2]["data"][0], 3);
        let offsets: Vec<_> = lines
            .iter()
            .map(|l| l["offset"].as_u64().unwrap())
            .collect();
        assert_eq!(offsets, [1, 2, 3], "{protocol}");
    }
    let said = fails(herald().args([
        "sub",
        "chat:cli",
        "--transport",
        "sse",
        "--protocol",
        "protobuf",
    ]));
    assert!(said.contains("only --transport ws"), "{said}");
}

/// Issue 12, goal 4: a kept history longer than one resume may replay is printed whole,
/// page by page, then the subscription goes live.
#[test]
fn sub_since_0_prints_a_history_longer_than_one_replay_then_goes_live() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    std::fs::write(&file, "[client]\nmax_history_limit = 20\n").unwrap();
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        for i in 1..=75 {
            let r = http
                .post(format!("{}/api/publish", server.url))
                .header("Authorization", format!("apikey {KEY}"))
                .json(&serde_json::json!({ "channel": "chat:long", "data": i }))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
    });
    let mut sub = herald()
        .args(["sub", "chat:long", "--since", "0", "--count", "76"])
        .env("HERALD_URL", &server.url)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = sub.stdout.take().unwrap();
    let (tx, printed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
            tx.send(v["offset"].as_u64().unwrap()).unwrap();
        }
    });
    let mut offsets = Vec::new();
    for _ in 0..75 {
        match printed.recv_timeout(Duration::from_secs(20)) {
            Ok(o) => offsets.push(o),
            Err(_) => {
                let _ = sub.kill();
                panic!("history stopped after {offsets:?}");
            }
        }
    }
    assert_eq!(offsets, (1..=75).collect::<Vec<_>>());
    assert_eq!(publish(&server, "chat:long", "76"), 76);
    assert_eq!(
        printed.recv_timeout(Duration::from_secs(20)),
        Ok(76),
        "then live"
    );
    assert!(sub.wait().unwrap().success());
}

#[test]
fn sub_resumes_over_every_transport() {
    let server = Server::start(&[]);
    for i in 1..=3 {
        publish(&server, "chat:t", &format!("[{i}]"));
    }
    for transport in ["ws", "sse", "stream", "iframe", "longpoll", "poll"] {
        let out = herald()
            .args([
                "sub",
                "chat:t",
                "--since",
                "1",
                "--count",
                "2",
                "--transport",
                transport,
                "--interval",
                "50ms",
            ])
            .args(["--url", &server.url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{transport}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let got: Vec<_> = lines
            .iter()
            .map(|l| {
                (
                    l["offset"].as_u64().unwrap(),
                    l["data"][0].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(got, [(2, 2), (3, 3)], "{transport}");
        assert!(
            lines.iter().all(|l| l["epoch"].is_string()),
            "{transport}: {lines:?}"
        );
    }
}

/// The same `--idempotency-key` publishes once; without one, each `herald pub` is its own.
#[test]
fn pub_with_an_idempotency_key_publishes_once() {
    let server = Server::start(&[]);
    let keyed = |data: &str| {
        let out = succeeds(herald().args([
            "pub",
            "--url",
            &server.url,
            "--api-key",
            KEY,
            "--idempotency-key",
            "deploy-42",
            "chat:once",
            data,
        ]));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert_eq!(keyed("1"), "1");
    assert_eq!(keyed("1"), "1", "the same key: stored once");
    assert_eq!(publish(&server, "chat:once", "2"), 2);
    assert_eq!(publish(&server, "chat:once", "2"), 3, "keys of their own");
}

#[test]
fn pub_without_a_key_explains_what_is_missing() {
    let out = herald()
        .args(["pub", "--url", "http://127.0.0.1:9", "x", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HERALD_API_KEY"));
}

/// Issue #18, item 3: broken JSON is refused, not published as a string; `-` reads stdin.
#[test]
fn pub_refuses_broken_json_reads_standard_input_and_sends_strings_when_asked() {
    let server = Server::start(&[]);
    let publish_args = ["pub", "--url", &server.url, "--api-key", KEY, "chat:json"];
    let said = fails(herald().args(publish_args).arg(r#"{"text": hi}"#));
    assert!(
        said.contains("not valid JSON") && said.contains("--string"),
        "{said}"
    );
    let mut piped = herald()
        .args(publish_args)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    piped
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"text\": \"from stdin\"}\n")
        .unwrap();
    assert!(piped.wait_with_output().unwrap().status.success());
    succeeds(
        herald()
            .args(publish_args)
            .args(["--string", r#"{"text": hi}"#]),
    );
    succeeds(herald().args(publish_args).arg("plain words"));
    let history = support::history(
        &tokio::runtime::Runtime::new().unwrap(),
        &server.url,
        "chat:json",
    );
    let data: Vec<Value> = history["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["data"].clone())
        .collect();
    assert_eq!(
        data,
        [
            serde_json::json!({"text": "from stdin"}),
            serde_json::json!(r#"{"text": hi}"#),
            serde_json::json!("plain words"),
        ],
        "nothing of the refused one was published"
    );
}

/// Issue #18, item 9: mistakes in addresses and URLs say how to put them right.
#[test]
fn address_and_url_mistakes_say_how_to_fix_them() {
    let said = fails(herald().args(["serve", "--port", "9000"]));
    assert!(said.contains("--listen 127.0.0.1:9000"), "{said}");
    let said = fails(herald().args(["serve", "--listen", "9000"]));
    assert!(said.contains("127.0.0.1:9000"), "{said}");
    let said = fails(herald().args(["pub", "--url", "127.0.0.1:8080", "--api-key", KEY, "c", "1"]));
    assert!(said.contains("http://127.0.0.1:8080"), "{said}");
    // A host name is resolved: the server listens and says where.
    let server = Server::start_at("localhost:0", tempfile::tempdir().unwrap().path(), &[]);
    assert!(
        server.url.starts_with("http://127.0.0.1:"),
        "{}",
        server.url
    );
}

/// Issue #18, item 9: every transport stops at once when nothing listens, saying why.
#[test]
fn sub_over_http_transports_stops_at_once_when_the_server_is_not_there() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    for transport in ["ws", "sse", "stream", "iframe", "longpoll", "poll"] {
        let started = std::time::Instant::now();
        let said = fails(herald().args([
            "sub",
            "chat:nobody",
            "--transport",
            transport,
            "--url",
            &format!("http://{closed}"),
        ]));
        assert!(said.contains("refused"), "{transport}: {said}");
        // Issue #29: one line, the cause once, and where to look.
        assert_eq!(said.lines().count(), 1, "{transport}: {said}");
        assert_eq!(
            said.matches("Connection refused").count(),
            1,
            "{transport}: {said}"
        );
        assert!(
            said.contains("is `herald serve` running there?"),
            "{transport}: {said}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{transport} gave up after {:?}",
            started.elapsed()
        );
    }
    let said = fails(herald().args([
        "pub",
        "--api-key",
        KEY,
        "--url",
        &format!("http://{closed}"),
        "chat:nobody",
        "hi",
    ]));
    assert_eq!(said.lines().count(), 1, "pub: {said}");
    assert!(
        said.contains("is `herald serve` running there?"),
        "pub: {said}"
    );
}

/// Issue #29: a channel the server refuses ends `herald sub` at once on every transport,
/// with the server's reason and code, instead of resuming forever; a publication a client
/// sent is printed with `from`, who sent it.
#[test]
fn sub_stops_with_the_servers_reason_when_refused_and_prints_who_sent() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        "[auth]\nhmac_secret = \"a-cli-test-secret-of-at-least-32-bytes\"\n\
         [namespaces.team]\nsubscribe = \"granted\"\npublish = \"authenticated\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let server = Server::start(&["--config", config]);
    for transport in ["ws", "sse", "stream", "iframe", "longpoll", "poll"] {
        let started = std::time::Instant::now();
        let said = fails(herald().args([
            "sub",
            "team:ops",
            "--transport",
            transport,
            "--url",
            &server.url,
        ]));
        assert!(said.contains("refused team:ops"), "{transport}: {said}");
        assert!(said.contains("(error 103"), "{transport}: {said}");
        assert!(said.contains("needs a grant"), "{transport}: {said}");
        assert!(started.elapsed() < Duration::from_secs(5), "{transport}");
    }

    let token = String::from_utf8(
        succeeds(herald().args([
            "token",
            "--config",
            config,
            "--user",
            "42",
            "--grant",
            "team:*",
            "--info",
            r#"{"name":"Ada"}"#,
        ]))
        .stdout,
    )
    .unwrap();
    let token = token.trim();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sent = rt.block_on(
        reqwest::Client::new()
            .post(format!("{}/connection/send?token={token}", server.url))
            .body(r#"{"id":1,"publish":{"channel":"team:ops","data":"from ada"}}"#)
            .send(),
    );
    assert_eq!(sent.unwrap().status(), 200);
    let out = succeeds(herald().args([
        "sub",
        "team:ops",
        "--since",
        "0",
        "--count",
        "1",
        "--token",
        token,
        "--url",
        &server.url,
    ]));
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["data"], "from ada", "{line}");
    assert_eq!(line["from"]["user"], "42", "{line}");
    assert_eq!(line["from"]["info"]["name"], "Ada", "{line}");
}

/// Issue #18, item 7: an epoch that is not the channel's is named as the reason.
#[test]
fn sub_with_a_wrong_epoch_says_the_epoch_differs() {
    let server = Server::start(&[]);
    for n in 1..=6 {
        publish(&server, "chat:epoch", &n.to_string());
    }
    let mut sub = herald()
        .args(["sub", "chat:epoch", "--since", "5", "--epoch", "nonsense"])
        .args(["--count", "1", "--url", &server.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // What it says when its subscription is answered; then it waits for the next one.
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(sub.stderr.take().unwrap()),
        &mut said,
    )
    .unwrap();
    assert!(
        said.contains("epoch nonsense is not the channel's"),
        "{said}"
    );
    assert!(!said.contains("does not cover"), "{said}");
    publish(&server, "chat:epoch", "7");
    let out = sub.wait_with_output().unwrap();
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        printed["offset"], 7,
        "it goes on from the channel's position"
    );
}

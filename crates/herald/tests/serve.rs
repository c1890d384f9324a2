//! `herald serve` as operators start it: configuration sources and their order, refusals
//! that name the key, a Redis it cannot reach, SIGTERM; `metrics_listen`, `herald top`
//! and `herald token`.

use std::{process::Command, time::Duration};

use serde_json::Value;

mod support;

use support::{fails, herald, serve_logging, succeeds, without_herald_env, Server, KEY};

#[test]
fn flags_beat_environment_which_beats_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:1111\"\nlog_level = \"debug\"\nworkers = 3\n",
    )
    .unwrap();
    let effective = |env: &[(&str, &str)], flags: &[&str]| -> toml::Table {
        let out = succeeds(
            herald()
                .args([
                    "serve",
                    "--print-config",
                    "--config",
                    file.to_str().unwrap(),
                ])
                .args(flags)
                .envs(env.iter().copied()),
        );
        String::from_utf8(out.stdout).unwrap().parse().unwrap()
    };
    let file_only = effective(&[], &[]);
    assert_eq!(file_only["listen"].as_str(), Some("127.0.0.1:1111"));
    assert_eq!(file_only["log_level"].as_str(), Some("debug"));
    let env = [
        ("HERALD_LISTEN", "127.0.0.1:2222"),
        ("HERALD_CLIENT__PING_INTERVAL", "7s"),
    ];
    let with_env = effective(&env, &[]);
    assert_eq!(with_env["listen"].as_str(), Some("127.0.0.1:2222"));
    assert_eq!(with_env["client"]["ping_interval"].as_str(), Some("7s"));
    assert_eq!(
        with_env["workers"].as_integer(),
        Some(3),
        "untouched keys keep the file's value"
    );
    let with_flag = effective(
        &env,
        &[
            "--listen",
            "127.0.0.1:3333",
            "--storage",
            "memory",
            "--sync",
            "always",
        ],
    );
    assert_eq!(with_flag["listen"].as_str(), Some("127.0.0.1:3333"));
    assert_eq!(with_flag["storage"].as_str(), Some("memory"));
    assert_eq!(with_flag["sync"].as_str(), Some("always"));
}

#[test]
fn invalid_configuration_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[client]\nping_intervl = \"5s\"\n", "client.ping_intervl"),
        (
            "[client]\nping_interval = \"soon\"\n",
            "client.ping_interval",
        ),
        (
            "[client]\nping_interval = \"30s\"\nidle_timeout = \"10s\"\n",
            "client.idle_timeout",
        ),
        (
            "[namespaces.chat]\nhistory_ttl = \"0s\"\n",
            "namespaces.chat.history_ttl",
        ),
        (
            "storage = \"redis\"\n[redis]\nprefix = \"\"\n",
            "redis.prefix",
        ),
        (
            "storage = \"nats\"\n[nats]\nprefix = \"a.b\"\n",
            "nats.prefix",
        ),
        (
            "storage = \"nats\"\n[nats]\nuser = \"u\"\ntoken = \"t\"\n",
            "nats.user",
        ),
        (
            "storage = \"nats\"\n[nats]\npassword = \"p\"\n",
            "nats.password",
        ),
        (
            "storage = \"nats\"\n[nats]\nreplicas = 0\n",
            "nats.replicas",
        ),
        // Moved to [broker] when NATS came: the error says where to.
        (
            "[redis]\npublish_timeout = \"1s\"\n",
            "broker.publish_timeout",
        ),
        (
            "[broker]\nunreachable_after = \"100ms\"\n",
            "broker.unreachable_after",
        ),
    ];
    for (text, key) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let out = herald()
            .args(["serve", "--config", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(key),
            "error for {text:?} should name {key}: {err}"
        );
    }
    let out = herald()
        .args(["serve"])
        .env("HERALD_WORKERS", "many")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("WORKERS"));
}

#[test]
fn an_unreachable_redis_stops_the_server_at_start_without_showing_its_password() {
    let url =
        herald_broker_redis::testkit::unreachable_url().replace("redis://", "redis://u:hunter2@");
    let out = herald()
        .args(["serve", "--listen", "127.0.0.1:0", "--storage", "redis"])
        .args(["--redis-url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot use redis at redis://***@127.0.0.1:"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn an_unreachable_nats_stops_the_server_at_start_without_showing_its_password() {
    let out = herald()
        .args(["serve", "--listen", "127.0.0.1:0", "--storage", "nats"])
        .args(["--nats-url", "nats://u:hunter2@127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot use nats at nats://***@127.0.0.1:1 (prefix herald)"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn a_nats_without_jetstream_stops_the_server_at_start() {
    let nats = herald_broker_nats::testkit::NatsServer::start_without_jetstream();
    let out = herald()
        .args(["serve", "--listen", "127.0.0.1:0", "--storage", "nats"])
        .args(["--nats-url", &nats.url()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("jetstream"), "{err}");
}

#[test]
fn sigterm_stops_the_server_promptly() {
    let mut server = Server::start(&[]);
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "server did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Started on one core (`taskset`, as an operator pins it), the server sizes its threads to
/// that core: one runtime worker, one fan-out thread, jemalloc's background work on at most
/// one; and every thread it has, the store's included, runs on that core alone (issue #60:
/// its threads follow the cores it is given, so a second load on the machine meets one
/// server per core, not a server sized for every core squeezed onto one).
#[test]
fn a_server_given_one_core_makes_its_threads_for_one() {
    let mut taskset = Command::new("taskset");
    taskset.args(["-c", "0", env!("CARGO_BIN_EXE_herald")]);
    without_herald_env(&mut taskset);
    let server = Server::spawn_in_temp(&mut taskset, &[]);
    let threads = named_threads(server.child.id());
    let named = |prefix: &str| {
        threads
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .count()
    };
    assert_eq!(named("herald-w-"), 1, "runtime workers: {threads:?}");
    assert_eq!(named("herald-f-"), 1, "fan-out threads: {threads:?}");
    assert!(named("jemalloc_bg_thd") <= 1, "{threads:?}");
    assert!(
        named("herald-store") >= 1,
        "the store's threads: {threads:?}"
    );
    assert!(
        threads.iter().all(|(_, cores)| cores == "0"),
        "every thread on core 0: {threads:?}"
    );
}

/// Given one runtime worker, the server keeps at most one allocator background thread,
/// whatever cores it may run on: jemalloc counts cores and not a cgroup's CPU quota, which
/// the runtime's size follows (with both cores of this machine jemalloc made four).
#[test]
fn a_server_with_one_worker_keeps_one_allocator_thread() {
    let server = Server::spawn_in_temp(herald().env("HERALD_WORKERS", "1"), &[]);
    let threads = named_threads(server.child.id());
    let allocator_threads = threads
        .iter()
        .filter(|(name, _)| name == "jemalloc_bg_thd")
        .count();
    assert!(allocator_threads <= 1, "{threads:?}");
}

/// Each thread of process `pid`: its name and the cores it may run on; read once every
/// thread but the main one has named itself (a thread names itself when it first runs,
/// and on a busy core that may be after the server says it listens).
fn named_threads(pid: u32) -> Vec<(String, String)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let threads: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .map(|task| {
                let task = task.unwrap().path();
                let name = std::fs::read_to_string(task.join("comm")).unwrap();
                let status = std::fs::read_to_string(task.join("status")).unwrap();
                let cores = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .unwrap()
                    .trim()
                    .to_owned();
                (name.trim().to_owned(), cores)
            })
            .collect();
        let unnamed = threads.iter().filter(|(name, _)| name == "herald").count();
        if unnamed <= 1 || std::time::Instant::now() > deadline {
            return threads;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn lists_in_the_environment_use_toml_array_syntax_as_documented() {
    let out = succeeds(herald().args(["serve", "--print-config"]).env(
        "HERALD_ALLOWED_ORIGINS",
        r#"["https://a.example","https://b.example"]"#,
    ));
    let config: toml::Table = String::from_utf8(out.stdout).unwrap().parse().unwrap();
    assert_eq!(config["allowed_origins"].as_array().unwrap().len(), 2);
}

/// Issue #16: `metrics_listen` serves `/metrics` without a key, on its own address only.
#[test]
fn metrics_listen_serves_metrics_without_a_key() {
    let mut server = serve_logging(|c| {
        c.args(["--api-key", KEY])
            .env("HERALD_METRICS_LISTEN", "127.0.0.1:0");
    });
    let (_, main) = server.until_listening();
    let metrics = server
        .lines
        .by_ref()
        .find(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("metrics at /metrics"))
        })
        .expect("the metrics address is logged")["fields"]["address"]
        .as_str()
        .unwrap()
        .to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let get = |url: String| {
        rt.block_on(async {
            let r = reqwest::get(url).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        })
    };
    let (status, text) = get(format!("http://{metrics}/metrics"));
    assert_eq!(status, 200);
    assert!(
        text.contains("herald_connections_accepted_total{transport=\"websocket\"} 0"),
        "{text}"
    );
    // CPU per runtime worker and per fan-out thread (the multi-core study's view).
    for thread in ["herald-w-0", "herald-f-0", "other"] {
        let row = format!("herald_thread_cpu_seconds_total{{thread=\"{thread}\"}}");
        assert!(text.contains(&row), "{row} in {text}");
    }
    let (status, _) = get(format!("http://{main}/metrics"));
    assert_eq!(status, 401, "the main address still needs the key");
}

/// Issue #16, item 5: `herald top` shows every node with its figures.
#[test]
fn top_shows_the_nodes_and_their_connections() {
    let server = Server::start(&[]);
    let out = succeeds(herald().args([
        "top",
        "--once",
        "--interval",
        "200ms",
        "--api-key",
        KEY,
        "--url",
        &server.url,
    ]));
    let view = String::from_utf8(out.stdout).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let info = rt.block_on(support::api_get(&format!("{}/api/info", server.url)));
    assert!(view.contains("1 node, "), "{view}");
    assert!(view.contains(info["node"].as_str().unwrap()), "{view}");
    assert!(view.contains("open:  websocket 0"), "{view}");
    let said = fails(herald().args(["top", "--once", "--url", &server.url]));
    assert!(said.contains("API key"), "{said}");
}

/// Issue #29, section 3: `herald token` refuses a secret `serve` refuses, with the same
/// words; a namespace the configuration names replaces the built-in one whole (keys left
/// out take `[channels]` values), in what `--print-config` shows and in what clients may
/// do; anonymous publishing is a warning even with a token key.
#[test]
fn token_config_and_start_up_say_what_serve_does() {
    let short = [("HERALD_AUTH__HMAC_SECRET", "too-short")];
    let minted = fails(herald().args(["token", "--user", "1"]).envs(short));
    let served = fails(
        herald()
            .args(["serve", "--api-key", "an-api-key-of-16-bytes"])
            .envs(short),
    );
    assert!(minted.contains("at least 32 bytes"), "{minted}");
    assert_eq!(minted, served);
    // Issue #37, item 5: --print-config refuses what serve refuses, in the same words.
    let printed = fails(herald().args(["serve", "--print-config"]).envs(short));
    assert_eq!(printed, served);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        "[auth]\nhmac_secret = \"a-cli-test-secret-of-at-least-32-bytes\"\n\
         [namespaces.chat]\nsubscribe = \"authenticated\"\n\
         [namespaces.wall]\npublish = \"anyone\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let printed = String::from_utf8(
        succeeds(herald().args(["serve", "--config", config, "--print-config"])).stdout,
    )
    .unwrap();
    let chat = printed
        .split("[namespaces.chat]")
        .nth(1)
        .expect("the chat namespace is printed")
        .split("\n[")
        .next()
        .unwrap();
    assert_eq!(chat.trim(), "subscribe = \"authenticated\"", "{printed}");

    let server = Server::start(&["--config", config]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let publish = |channel: &str| {
        let body = format!(r#"{{"id":1,"publish":{{"channel":"{channel}","data":1}}}}"#);
        let url = format!("{}/connection/send", server.url);
        rt.block_on(async {
            let r = reqwest::Client::new().post(url).body(body).send().await;
            r.unwrap().json::<Value>().await.unwrap()
        })
    };
    // `publish` was left out of chat: `[channels]`' nobody, not the built-in's anyone.
    assert_eq!(publish("chat:lobby")["error"]["code"], 103);
    assert!(publish("wall:x")["publish"]["offset"].is_u64());

    let mut logging = serve_logging(|c| {
        c.args(["--config", config]);
    });
    let warned = logging
        .lines
        .by_ref()
        .take(40)
        .find(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("anonymous clients may publish in namespace wall"))
        })
        .expect("a start-up line says anonymous clients may publish in wall");
    assert_eq!(warned["level"], "WARN", "{warned}");
}

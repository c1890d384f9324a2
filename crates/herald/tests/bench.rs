//! `herald bench` end to end: it starts its own Herald and worker processes, and what it
//! reports adds up.

mod support;

use serde_json::Value;
use support::{herald, succeeds, KEY};

fn rows(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("table").is_some())
        .collect()
}

/// The notes of a `--json` run.
fn notes(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v.get("notes").cloned())
        .flat_map(|n| n.as_array().cloned().unwrap_or_default())
        .filter_map(|n| n.as_str().map(String::from))
        .collect()
}

/// A fan-out row that counted `deliveries`, none lost and none twice.
fn every_delivery_once(row: &Value, deliveries: u64) {
    assert_eq!(
        (
            row["deliveries"].as_u64(),
            row["loss"].as_u64(),
            row["duplicates"].as_u64()
        ),
        (Some(deliveries), Some(0), Some(0)),
        "{row}"
    );
}

#[test]
fn fanout_delivers_everything_once_across_worker_processes() {
    let dir = tempfile::tempdir().unwrap();
    let markdown = dir.path().join("fanout.md");
    let out = succeeds(
        herald()
            .args([
                "bench",
                "fanout",
                "--subscribers",
                "30",
                "--publications",
                "40",
                "--rate",
                "40",
            ])
            .args(["--channels", "2", "--workers", "2", "--json", "--charts"])
            .arg(dir.path())
            .arg("--markdown")
            .arg(&markdown),
    );
    let rows = rows(&out.stdout);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    // 30 subscribers over 2 channels, 40 publications round-robin: 20 to each. (A second
    // of publishing: the charts need two points, one taken every 500 ms; 5 publications at
    // 50/s sometimes left one.)
    every_delivery_once(r, 15 * 20 + 15 * 20);
    assert!(r["p99 ms"].as_f64().unwrap() > 0.0, "{r}");
    assert!(std::fs::read_to_string(&markdown)
        .unwrap()
        .contains("| transport |"));
    assert!(dir.path().join("fanout-latency.svg").exists());
}

/// A Pusher app for `--pusher-app`.
const PUSHER_APP: &str = "77:bench-key:bench-secret-0123456789";

/// `herald bench fanout --json` of 20 subscribers and 30 publications with `more`
/// arguments.
fn fanout(more: &[&str]) -> std::process::Output {
    succeeds(
        herald()
            .args([
                "bench",
                "fanout",
                "--subscribers",
                "20",
                "--publications",
                "30",
            ])
            .arg("--json")
            .args(more),
    )
}

/// `herald bench fanout` of 20 subscribers and 30 publications with `more` arguments:
/// its one row.
fn fanout_row(more: &[&str]) -> Value {
    let out = fanout(more);
    let rows = rows(&out.stdout);
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows.into_iter().next().unwrap()
}

/// Issue #60: with `--client-cores` alone, the Herald the bench starts does not inherit the
/// bench's own cores (the clients'): it gets every core online, as it would with a quota
/// (`--server-cgroup`) and no cores of its own. It did, and so shared one core with the
/// clients.
#[test]
fn a_server_started_with_only_the_clients_pinned_gets_every_core() {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let out = succeeds(herald().args([
        "bench",
        "fanout",
        "--subscribers",
        "4",
        "--publications",
        "4",
        "--client-cores",
        "0",
        "--json",
    ]));
    let notes = notes(&out.stdout);
    let want = format!("server on cores {}, clients on cores 0", online.trim());
    assert!(notes.contains(&want), "{want:?} not in {notes:?}");
}

/// Issue #60: Herald read by the generic client (`--generic-client`), as every other server
/// is, to compare latency read alike: on WebSocket and SSE every publication reaches
/// everyone once, and the notes say how it was read.
#[test]
fn herald_read_by_the_generic_client_reaches_everyone_once() {
    for transport in ["ws", "sse"] {
        let out = fanout(&["--rate", "30", "--transport", transport, "--generic-client"]);
        every_delivery_once(&rows(&out.stdout)[0], 20 * 30);
        let notes = notes(&out.stdout);
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with("Herald read by the generic client:")),
            "{transport}: {notes:?}"
        );
    }
}

/// Issue #35: clients that offer permessage-deflate get every publication once, over
/// Herald's own protocol and the Pusher front (a burst, so that the connections' own tasks
/// write too, not only the hub's direct lane), and a JSON publication crosses the wire in
/// well under half its plain size.
#[test]
fn fanout_with_compression_reaches_everyone_once_in_fewer_bytes() {
    let wire = |deflate: bool, pusher: bool| {
        let mut args = vec!["--rate", "0", "--payload", "1000", "--content", "json"];
        if deflate {
            args.push("--deflate");
        }
        if pusher {
            args.extend(["--pusher-app", PUSHER_APP]);
        }
        let row = fanout_row(&args);
        every_delivery_once(&row, 20 * 30);
        row["wire B / delivery"].as_f64().unwrap()
    };
    for pusher in [false, true] {
        let (plain, compressed) = (wire(false, pusher), wire(true, pusher));
        assert!(plain > 1000.0, "pusher {pusher}: {plain}");
        assert!(
            compressed < plain / 2.0,
            "pusher {pusher}: {compressed} of {plain}"
        );
    }
}

/// Issue #58: Herald's clients in Protobuf, and taking deltas (in either codec, with and
/// without compression): every publication reaches everyone once, and data that changes
/// a little (a stamp and a sequence number in 1 KB) crosses the wire in far fewer bytes
/// as deltas.
#[test]
fn fanout_in_protobuf_and_with_deltas_reaches_everyone_once() {
    let wire = |more: &[&str]| {
        let mut args = vec!["--rate", "0", "--payload", "1000"];
        args.extend(more);
        let row = fanout_row(&args);
        every_delivery_once(&row, 20 * 30);
        row["wire B / delivery"].as_f64().unwrap()
    };
    let plain = wire(&[]);
    let protobuf = wire(&["--protocol", "protobuf"]);
    assert!(protobuf < plain, "{protobuf} of {plain}");
    for more in [
        &["--delta"][..],
        &["--delta", "--protocol", "protobuf"],
        &["--delta", "--deflate"],
    ] {
        let deltas = wire(more);
        assert!(deltas < plain / 2.0, "{more:?}: {deltas} of {plain}");
    }
}

/// Issue #34: the Pusher front as one more target: Pusher clients subscribed with
/// `pusher:subscribe`, publications signed for `POST /apps/ID/events`, every one counted.
#[test]
fn fanout_through_the_pusher_protocol_reaches_everyone_once() {
    for resume in [false, true] {
        let mut args = vec![
            "--rate",
            "60",
            "--channels",
            "2",
            "--pusher-app",
            PUSHER_APP,
        ];
        if resume {
            // Each client a page that opted in to resuming: its own task writes, with a
            // ping after each write.
            args.push("--pusher-resume");
        }
        every_delivery_once(&fanout_row(&args), 10 * 15 + 10 * 15);
    }
}

#[test]
fn transports_counts_bytes_and_packets_both_ways() {
    let charts = tempfile::tempdir().unwrap();
    let out = succeeds(
        herald()
            .args([
                "bench",
                "transports",
                "--duration",
                "2s",
                "--every",
                "500ms",
            ])
            .args(["--transports", "ws,sse,longpoll,poll@200ms", "--json"])
            .arg("--charts")
            .arg(charts.path()),
    );
    let rows = rows(&out.stdout);
    let ours: Vec<&Value> = rows
        .iter()
        .filter(|r| r["table"].as_str().unwrap().starts_with("transports"))
        .collect();
    assert_eq!(ours.len(), 4, "{rows:?}");
    for r in ours {
        for key in [
            "client→server packets",
            "server→client packets",
            "client→server bytes",
            "server→client bytes",
        ] {
            assert!(r[key].as_u64().unwrap() > 0, "{key}: {r}");
        }
        // Two clients, each hearing both: at least the first round of messages arrived.
        assert!(r["messages received"].as_u64().unwrap() >= 4, "{r}");
    }
    assert!(
        rows.iter().any(|r| r["transport"] == "WebSocket"),
        "the study's figures are printed beside"
    );
    // Issue #18, item 8: one picture compares the transports, with the table's values
    // (scaled to the study's 60 s) written on the bars, beside the study's.
    let files: Vec<_> = std::fs::read_dir(charts.path())
        .unwrap()
        .map(|f| f.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files, ["transports-comparison.svg"]);
    let svg = std::fs::read_to_string(charts.path().join("transports-comparison.svg")).unwrap();
    for r in rows.iter().filter(|r| r["packets per 60 s"].is_number()) {
        let transport = r["transport"].as_str().unwrap();
        let packets = r["packets per 60 s"].as_f64().unwrap();
        assert_eq!(
            packets,
            r["packets"].as_f64().unwrap() * 30.0,
            "2 s scaled to 60: {r}"
        );
        for text in [transport.to_string(), format!("{packets:.0}")] {
            assert!(svg.contains(&format!("\n{text}\n")), "{text} on the chart");
        }
    }
    assert!(
        svg.contains("\n568\n"),
        "the study's WebSocket packets beside"
    );
}

#[test]
fn the_generic_adapter_measures_a_server_through_its_own_endpoints() {
    // Herald stands in for "any server": the bench knows it only by the URLs and frames given.
    let server = support::Server::start(&[]);
    let ws = server.url.replacen("http", "ws", 1) + "/connection/websocket";
    let out = succeeds(
        herald()
            .args([
                "bench",
                "fanout",
                "--subscribers",
                "10",
                "--publications",
                "4",
                "--rate",
                "40",
                "--json",
            ])
            .args([
                "--url",
                &server.url,
                "--pid",
                &server.child.id().to_string(),
            ])
            .args(["--client-url", &ws])
            // A handshake first; the subscription goes only once it is answered.
            .args(["--subscribe-frame", r#"{"id":1,"connect":{}}"#])
            .args(["--wait-for", "", "--wait-for", r#""id":1"#])
            .args([
                "--subscribe-frame",
                r#"{"id":2,"subscribe":{"channel":"{channel}"}}"#,
            ])
            .args(["--publish-url", &format!("{}/api/publish", server.url)])
            .args(["--publish-header", &format!("Authorization: apikey {KEY}")]),
    );
    let rows = rows(&out.stdout);
    every_delivery_once(&rows[0], 40);
    assert!(
        rows[0]["server RSS MB"].as_f64().unwrap() > 0.0,
        "measured by --pid"
    );
}

#[test]
fn fanout_across_nodes_reaches_subscribers_of_every_node() {
    // Three `herald serve` on one address and a redis-server, all started by the bench.
    let out = succeeds(
        herald()
            .args(["bench", "fanout", "--nodes", "3"])
            .args(["--subscribers", "30", "--publications", "5", "--rate", "50"])
            .arg("--json"),
    );
    let rows = rows(&out.stdout);
    every_delivery_once(&rows[0], 150);
    // The counters come from whichever node answered: it delivered only its own share,
    // so the rest reached subscribers of the other nodes through Redis.
    let notes = notes(&out.stdout);
    let counters = notes
        .iter()
        .find(|n| n.starts_with("one node's (of 3) counters"))
        .unwrap_or_else(|| panic!("{notes:?}"));
    let node_deliveries: u64 = counters
        .rsplit(", ")
        .next()
        .and_then(|d| d.strip_suffix(" deliveries"))
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{counters}"));
    assert!(node_deliveries < 150, "{counters}");
}

/// Issue #32: one hot channel on NATS JetStream written through two nodes as fast as they
/// take it. nats-server may republish two writers' messages out of order; every subscriber
/// still gets every publication once (before the listener put them back in order, a
/// subscriber was closed with 3002 "a publication is missing" in about half such runs).
#[test]
fn a_hot_channel_on_nats_through_two_nodes_reaches_everyone_once() {
    let nats = herald_broker_nats::testkit::NatsServer::start();
    for _ in 0..4 {
        let out = succeeds(
            herald()
                .args(["bench", "fanout", "--nodes", "2", "--nats-url", &nats.url()])
                .args(["--subscribers", "20", "--channels", "1"])
                .args(["--publications", "3000", "--rate", "0", "--json"]),
        );
        every_delivery_once(&rows(&out.stdout)[0], 20 * 3000);
    }
}

#[test]
fn fetch_brings_the_backends_document_through_the_rpc_hook() {
    let out = succeeds(herald().args([
        "bench",
        "fetch",
        "--document",
        "200000",
        "--start",
        "4",
        "--max-clients",
        "5",
        "--arrive-every",
        "100ms",
        "--ask-every",
        "1s",
        "--window",
        "2s",
        // Judged on answers arriving whole, not on speed: CI machines are slow and busy.
        "--max-latency",
        "10s",
        "--json",
    ]));
    let rows = rows(&out.stdout);
    let held = rows
        .iter()
        .find(|r| r["window"].as_str().unwrap().starts_with("held"))
        .unwrap_or_else(|| panic!("no held window: {rows:?}"));
    assert_eq!(held["clients"], 5, "{held}");
    // Five clients asking once a second for 200 KB: about 1 MB/s, every answer whole
    // (MB/s is rounded to 0.1, hence the wide range).
    assert!(held["answers/s"].as_f64().unwrap() >= 3.0, "{held}");
    let per_answer = held["MB/s"].as_f64().unwrap() * 1e6 / held["answers/s"].as_f64().unwrap();
    assert!((150_000.0..250_000.0).contains(&per_answer), "{held}");
}

#[test]
fn presence_pages_every_member_once_and_a_resumed_reconnect_pushes_nothing() {
    let out = succeeds(herald().args([
        "bench",
        "presence",
        "--members",
        "150",
        "--reconnect",
        "40",
        "--calls",
        "20",
        "--json",
    ]));
    let rows = rows(&out.stdout);
    assert_eq!(rows.len(), 4, "{rows:?}");
    let crowd = &rows[0];
    assert_eq!(crowd["members"], 150, "{crowd}");
    assert_eq!(crowd["members listed / distinct"], "150 / 150", "{crowd}");
    assert!(
        crowd["presence_stats p50 ms"].as_f64().unwrap() > 0.0,
        "{crowd}"
    );
    let phase = |name: &str| {
        rows.iter()
            .find(|r| r["phase"].as_str().is_some_and(|p| p.starts_with(name)))
            .unwrap_or_else(|| panic!("no {name} row in {rows:?}"))
    };
    // Joining in a few batches: pushes, but far fewer than one per join per member.
    let joining = phase("joining");
    let pushes = joining["presence pushes"].as_u64().unwrap();
    assert!((40..=40 * 10).contains(&pushes), "{joining}");
    let resumed = phase("reconnect, same clients");
    assert_eq!(resumed["presence pushes"], 0, "{resumed}");
    assert_eq!(resumed["members after"], 40, "{resumed}");
    // New clients: each member hears the leaves and the joins, in a few batches.
    let renewed = phase("reconnect, new clients");
    let pushes = renewed["presence pushes"].as_u64().unwrap();
    assert!((40..=40 * 10).contains(&pushes), "{renewed}");
    let listed = renewed["joins+leaves listed"].as_u64().unwrap();
    assert!(
        listed >= 40 * 40,
        "every member hears the 40 leaves: {renewed}"
    );
    assert_eq!(renewed["members after"], 40, "{renewed}");
}

/// A real Nchan (Debian's `nginx` with `libnginx-mod-nchan`) on a free port, configured as
/// `docs/benchmarks.md` shows; stopped when dropped.
struct Nchan {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Nchan {
    fn start() -> Self {
        const MODULE: &str = "/usr/lib/nginx/modules/ngx_nchan_module.so";
        assert!(
            std::path::Path::new(MODULE).exists(),
            "Nchan must be installed (Debian: nginx and libnginx-mod-nchan; .ci/run installs them)"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.path().display();
        let config = format!(
            "load_module {MODULE};\n\
             worker_processes 1;\n\
             daemon off;\n\
             pid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n\
               access_log off;\n\
               client_body_temp_path {d}/body;\n\
               proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n\
               uwsgi_temp_path {d}/uwsgi;\n\
               scgi_temp_path {d}/scgi;\n\
               server {{\n\
                 listen 127.0.0.1:{port};\n\
                 location ~ ^/sub/(.+)$ {{ nchan_subscriber; nchan_channel_id $1; nchan_subscriber_first_message newest; }}\n\
                 location ~ ^/lp/(.+)$ {{ nchan_subscriber longpoll; nchan_channel_id $1; nchan_subscriber_first_message oldest; }}\n\
                 location ~ ^/pub/(.+)$ {{ nchan_publisher; nchan_channel_id $1; }}\n\
               }}\n\
             }}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, config).unwrap();
        let child = std::process::Command::new("nginx")
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nginx must be installed (Debian: nginx and libnginx-mod-nchan)");
        let url = format!("http://127.0.0.1:{port}");
        // Ready once it accepts connections (or fail with its log).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "nginx did not listen: {}",
                std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
            );
            std::thread::yield_now();
        }
        Self {
            child,
            url,
            _dir: dir,
        }
    }

    /// The master's and the worker's process ids, for `--pid`.
    fn pids(&self) -> Vec<String> {
        let master = self.child.id();
        let children = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
            .unwrap_or_default();
        std::iter::once(master.to_string())
            .chain(children.split_whitespace().map(String::from))
            .collect()
    }
}

impl Drop for Nchan {
    fn drop(&mut self) {
        // SIGTERM: the master stops its worker, then exits (a killed master would leave the
        // worker running, holding the port).
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

#[test]
fn the_generic_adapter_measures_nchan_over_sse_and_long_polling() {
    let nchan = Nchan::start();
    for (transport, client_url) in [
        ("sse", format!("{}/sub/{{channel}}", nchan.url)),
        ("longpoll", format!("longpoll+{}/lp/{{channel}}", nchan.url)),
    ] {
        let mut command = herald();
        command
            .args(["bench", "fanout", "--transport", transport])
            .args(["--subscribers", "10", "--publications", "4"])
            .args(["--rate", "40", "--json", "--url", &nchan.url])
            .args(["--client-url", &client_url])
            .args(["--publish-url", &format!("{}/pub/{{channel}}", nchan.url)])
            .args(["--publish-body", "{data}"]);
        for pid in nchan.pids() {
            command.args(["--pid", &pid]);
        }
        let out = succeeds(&mut command);
        let rows = rows(&out.stdout);
        every_delivery_once(&rows[0], 40);
    }
}

/// Issue #37, item 5: churn against a server whose per-address limits refuse most of its
/// clients backs off instead of retrying at once, names the refusals, and says which limits
/// they are and how to measure past them.
#[test]
fn churn_against_a_refusing_server_backs_off_and_says_why() {
    // One new connection a second per address (bursts of 2).
    let data = tempfile::tempdir().unwrap();
    let mut command = herald();
    command.env("HERALD_LIMITS__CONNECTION_RATE_PER_ADDRESS", "1");
    let server = support::Server::spawn_with(&mut command, data.path(), &["--storage", "memory"]);
    let out = succeeds(herald().args([
        "bench",
        "churn",
        "--url",
        &server.url,
        "--api-key",
        KEY,
        "--clients",
        "10",
        "--lifetime",
        "300ms",
        "--duration",
        "3s",
        "--json",
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    let row = &rows(&out.stdout)[0];
    // Ten clients retrying at once would fail thousands of times in 3 s (a refusal takes a
    // millisecond); backing off from 100 ms, each fails a few times.
    let errors = row["errors"].as_u64().unwrap();
    assert!(errors > 0 && errors < 150, "{errors} errors: {row}");
    let notes: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v.get("notes").is_some())
        .expect("notes");
    let notes = notes["notes"].to_string();
    assert!(notes.contains("refused: 429 too fast"), "{notes}");
    assert!(
        notes.contains("limits.connection_rate_per_address")
            && notes.contains("HERALD_LIMITS__CONNECTION_RATE_PER_ADDRESS=0"),
        "{notes}"
    );
}

#[test]
fn delta_counts_the_bytes_of_plain_and_delta_publications() {
    let out = succeeds(herald().args(["bench", "delta", "--publications", "6", "--json"]));
    let rows = rows(&out.stdout);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (plain, delta) = (&rows[0], &rows[1]);
    assert_eq!(plain["mode"], "plain", "{plain}");
    assert_eq!(delta["mode"], "fossil delta", "{delta}");
    let rest = |r: &Value| r["next publications B"].as_u64().unwrap();
    assert!(rest(plain) > 5 * 2000, "{plain}");
    assert!(rest(delta) * 10 < rest(plain), "{delta} against {plain}");
}

//! The deployment files as an operator copies them (issue #37): nginx from
//! `deploy/nginx.conf` in front of two nodes started with `deploy/herald.toml` on one Redis;
//! the files are shown verbatim in `docs/deployment.md`; the systemd unit verifies.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::Command,
    time::Duration,
};

use futures_util::{SinkExt, StreamExt};
use herald_broker_redis::testkit::RedisServer;
use tokio_tungstenite::tungstenite::Message;

mod support;

use support::{
    nginx::{deploy_dir, free_port, Nginx, HOST_NAME},
    Server, KEY,
};

/// Two nodes as `deploy/herald.toml` configures them (the file given with `--config`; the
/// listen port and Redis are the test's), and nginx in front of them.
struct Deployment {
    nodes: [Server; 2],
    nginx: Nginx,
    _redis: RedisServer,
    _data: tempfile::TempDir,
}

impl Deployment {
    fn start() -> Self {
        let redis = RedisServer::start();
        let data = tempfile::tempdir().unwrap();
        let config = deploy_dir().join("herald.toml");
        let ports = [free_port(), free_port()];
        let node = |port: u16| {
            Server::start_at(
                &format!("127.0.0.1:{port}"),
                data.path(),
                &[
                    "--config",
                    config.to_str().unwrap(),
                    "--redis-url",
                    &redis.url(),
                ],
            )
        };
        let nodes = [node(ports[0]), node(ports[1])];
        let nginx = Nginx::start(ports);
        Self {
            nodes,
            nginx,
            _redis: redis,
            _data: data,
        }
    }

    /// A URL through nginx's plain HTTP server.
    fn url(&self, path: &str) -> String {
        format!("http://{HOST_NAME}:{}{path}", self.nginx.http)
    }

    /// An HTTP client that reaches `chat.example.com` at nginx, from `from`.
    fn client(&self, from: Ipv4Addr) -> reqwest::Client {
        reqwest::Client::builder()
            .resolve(
                HOST_NAME,
                SocketAddr::from(([127, 0, 0, 1], self.nginx.http)),
            )
            .local_address(IpAddr::V4(from))
            .build()
            .unwrap()
    }
}

/// The i-th of many client addresses (all loopback on Linux, no setup needed).
fn address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8)
}

/// Raises this process's open-file limit to its hard limit: thousands of clients.
fn many_files(needed: u64) {
    let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    if soft < hard {
        rlimit::setrlimit(rlimit::Resource::NOFILE, hard, hard).unwrap();
    }
    assert!(
        hard >= needed,
        "this test needs {needed} open files; the hard limit is {hard}"
    );
}

/// Opens a WebSocket through nginx from `from` and sends `connect`; the socket once the
/// server answered, or what it answered instead.
async fn connect(
    http: u16,
    from: Ipv4Addr,
) -> Result<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>, String> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .bind(SocketAddr::from((from, 0)))
        .map_err(|e| e.to_string())?;
    let stream = socket
        .connect(SocketAddr::from(([127, 0, 0, 1], http)))
        .await
        .map_err(|e| e.to_string())?;
    let url = format!("ws://{HOST_NAME}:{http}/connection/websocket");
    let (mut ws, _) = tokio_tungstenite::client_async(url, stream)
        .await
        .map_err(|e| e.to_string())?;
    ws.send(Message::text(r#"{"id":1,"connect":{}}"#))
        .await
        .map_err(|e| e.to_string())?;
    while let Some(m) = ws.next().await {
        let m = m.map_err(|e| e.to_string())?;
        let text = m.to_text().unwrap_or_default();
        if text.contains(r#""id":1"#) {
            return if text.contains(r#""connect""#) {
                Ok(ws)
            } else {
                Err(text.to_string())
            };
        }
    }
    Err("closed before answering".into())
}

/// Issue #37, items 1 and 2: every path Herald serves works through the documented nginx,
/// by the public name; 3,000 clients connecting at 500 a second through it are all accepted
/// (each counted by its own address, which nginx forwards), spread over both nodes, while one
/// address that opens too much too fast still meets its limits.
#[test]
fn the_documented_nginx_serves_every_path_and_counts_people_not_the_proxy() {
    many_files(12_000);
    let deployment = Deployment::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let me = deployment.client(Ipv4Addr::new(127, 0, 0, 1));
    for path in ["/healthz", "/chat", "/herald.js", "/dashboard"] {
        let answer = rt.block_on(me.get(deployment.url(path)).send()).unwrap();
        assert_eq!(answer.status(), 200, "{path} through nginx");
    }
    let published = rt
        .block_on(
            me.post(deployment.url("/api/publish"))
                .header("Authorization", format!("apikey {KEY}"))
                .body(r#"{"channel":"chat:deploy","data":"through nginx"}"#)
                .send(),
        )
        .unwrap();
    assert_eq!(published.status(), 200, "the API through nginx");

    const CLIENTS: usize = 3000;
    let http = deployment.nginx.http;
    let outcomes = rt.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_millis(2)); // 500 a second
        let mut tasks = Vec::with_capacity(CLIENTS);
        for i in 0..CLIENTS {
            tick.tick().await;
            tasks.push(tokio::spawn(connect(http, address(i))));
        }
        let mut outcomes = Vec::with_capacity(CLIENTS);
        for t in tasks {
            outcomes.push(t.await.unwrap());
        }
        outcomes
    });
    let refused: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "{} of {CLIENTS} refused, e.g. {:?}; nginx: {}",
        refused.len(),
        refused.first(),
        deployment.nginx.errors()
    );
    for node in &deployment.nodes {
        let held = rt.block_on(support::api_get(&format!("{}/api/info", node.url)));
        assert!(
            held["connections"].as_u64().unwrap() > 100,
            "both nodes take clients: {held}"
        );
    }

    // One address, as nginx reports it, still has its own limits: 2,500 polls at once from
    // it pass the connection rate (200 a second, bursts of 400, on each of the two nodes).
    let one = deployment.client(Ipv4Addr::new(127, 2, 0, 1));
    let statuses = rt.block_on(async {
        let polls = (0..2500).map(|_| {
            let one = one.clone();
            let url = deployment.url("/connection/poll?channel=chat:deploy");
            async move { one.get(url).send().await.map(|r| r.status().as_u16()) }
        });
        futures_util::future::join_all(polls).await
    });
    let mut seen = std::collections::BTreeMap::new();
    for s in &statuses {
        let key = s.as_ref().map_or_else(|e| e.to_string(), |s| s.to_string());
        *seen.entry(key).or_insert(0) += 1;
    }
    assert!(
        seen.contains_key("429") && seen.contains_key("200"),
        "one address's polls: {seen:?}"
    );
    drop(outcomes);
}

/// Issue #37, "shown verbatim": each deploy file appears whole in `docs/deployment.md`.
#[test]
fn the_deploy_files_are_shown_whole_in_the_deployment_guide() {
    let guide = std::fs::read_to_string(deploy_dir().join("../docs/deployment.md")).unwrap();
    for file in [
        "nginx.conf",
        "herald-locations.conf",
        "herald.toml",
        "herald.service",
    ] {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        assert!(
            guide.contains(&text),
            "docs/deployment.md does not show deploy/{file} as it is"
        );
    }
}

/// Issue #37, item 3: the unit passes `systemd-analyze verify` with the binary where the
/// guide's install step puts it (`cargo install … --root /usr/local`: /usr/local/bin), in a
/// root directory made for the check.
#[test]
fn the_systemd_unit_verifies_with_the_installed_binary() {
    let guide = std::fs::read_to_string(deploy_dir().join("../docs/deployment.md")).unwrap();
    assert!(
        guide.contains("cargo install --locked --path crates/herald --root /usr/local"),
        "the guide installs into /usr/local"
    );
    let unit = std::fs::read_to_string(deploy_dir().join("herald.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/herald serve"));
    assert!(unit.contains("DynamicUser=yes"));
    assert!(
        !unit.contains("Environment=HERALD_API_KEY"),
        "no secret in the unit itself"
    );
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let r = root.path();
    for d in ["usr/local/bin", "etc/systemd/system", "etc/herald"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    // The system's own units (targets the unit names) are seen through the root.
    std::os::unix::fs::symlink("/usr/lib", r.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("usr/lib", r.join("lib")).unwrap();
    let installed = r.join("usr/local/bin/herald");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_herald"), &installed).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_herald"), &installed).unwrap();
    }
    std::fs::write(r.join("etc/herald/secrets.env"), "").unwrap();
    std::fs::copy(
        deploy_dir().join("herald.toml"),
        r.join("etc/herald/herald.toml"),
    )
    .unwrap();
    let path = r.join("etc/systemd/system/herald.service");
    std::fs::write(&path, &unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .arg(&path)
        .output()
        .expect("systemd-analyze must be installed (Debian: systemd; .ci/run installs it)");
    let said = String::from_utf8_lossy(&out.stderr);
    // Lines about the unit; the syscall table of a newer kernel than systemd's is not one.
    let complaints: Vec<_> = said
        .lines()
        .filter(|l| l.contains("herald.service") && !l.contains("Failed to parse system call"))
        .collect();
    assert!(
        out.status.success() && complaints.is_empty(),
        "systemd-analyze verify: {said}"
    );
}

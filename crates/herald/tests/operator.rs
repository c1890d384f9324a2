//! What an operator sees: the lines `herald serve` logs at start-up, and refusals (of
//! origins, of clients over a limit) in its log and in `/metrics`.

use std::process::Command;

use serde_json::Value;

mod support;

use support::serve_logging;

#[test]
fn max_connections_is_kept_under_the_open_file_limit() {
    let mut server = serve_logging(|c| {
        c.env("HERALD_MAX_CONNECTIONS", "0");
    });
    let (said, _) = server.until_listening();
    // No limit asked, but a process has only so many descriptors: the cap leaves 256 spare.
    let f = said
        .iter()
        .map(|v| &v["fields"])
        .find(|f| f["max_connections"].is_u64())
        .expect("a line names the cap");
    assert_eq!(
        f["max_connections"].as_u64().unwrap() + 256,
        f["open_files"].as_u64().unwrap(),
        "{f}"
    );
}

/// Issue #18, item 6: a normal start says nothing alarming about the open-file limit.
#[test]
fn a_default_start_does_not_warn_about_the_open_file_limit() {
    let (said, _) = serve_logging(|_| {}).until_listening();
    for v in said
        .iter()
        .filter(|v| v["fields"]["max_connections"].is_u64())
    {
        assert_eq!(v["level"], "INFO", "{v}");
        assert!(
            v["fields"]["message"]
                .as_str()
                .unwrap()
                .contains("ulimit -n"),
            "{v}"
        );
    }
}

/// Issue #18, item 1: a page of another origin gets an answer it can read (error 119, the
/// origin to add), and the server says so in its log, once however many are refused.
#[test]
fn a_refused_origin_is_told_why_and_logged_once() {
    let mut server = serve_logging(|_| {});
    let (_, address) = server.until_listening();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let origin = "http://127.0.0.1:1";
    for _ in 0..5 {
        let answer = rt.block_on(
            reqwest::Client::new()
                .get(format!("http://{address}/connection/stream?channel=chat:x"))
                .header("Origin", origin)
                .send(),
        );
        let answer = answer.unwrap();
        assert_eq!(answer.status(), 403);
        assert_eq!(
            answer.headers()["access-control-allow-origin"],
            origin,
            "the refused page may read why"
        );
        assert!(answer.headers().get("x-herald-refused-origin").is_none());
        let body: Value = rt.block_on(answer.json()).unwrap();
        assert_eq!(body["error"]["code"], 119, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(origin) && message.contains("allowed_origins"),
            "{body}"
        );
    }
    // Stopped, the server logs no more: every line it wrote is read.
    assert!(Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let logged: Vec<Value> = server
        .lines
        .by_ref()
        .filter(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("refused a browser connection"))
        })
        .collect();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0]["fields"]["message"]
        .as_str()
        .unwrap()
        .contains(origin));
}

/// Issue #37, item 1: a server on a loopback address is usually behind a proxy on the same
/// machine; without `trusted_proxies` every client would share the proxy's limits, and the
/// start-up log says so. With the proxy listed it says nothing of it.
#[test]
fn a_loopback_listener_without_trusted_proxies_says_clients_would_share_limits() {
    let warned = |said: &[Value]| {
        said.iter().any(|v| {
            v["level"] == "WARN"
                && v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("limits.trusted_proxies"))
        })
    };
    let (said, _) = serve_logging(|_| {}).until_listening();
    assert!(warned(&said), "{said:?}");
    let (said, _) = serve_logging(|c| {
        c.env("HERALD_LIMITS__TRUSTED_PROXIES", r#"["127.0.0.1"]"#);
    })
    .until_listening();
    assert!(!warned(&said), "{said:?}");
}

/// Issue #37, item 1: clients refused by a per-address limit are counted by limit in
/// `/metrics`, and logged once per 10 s naming the limit, the address and what to do when
/// that address is a proxy's.
#[test]
fn refusals_are_counted_by_limit_and_logged_once_naming_the_address() {
    let mut server = serve_logging(|c| {
        c.args(["--api-key", "operator-test-key"])
            .env("HERALD_LIMITS__CONNECTION_RATE_PER_ADDRESS", "1");
    });
    let (_, address) = server.until_listening();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let mut refused = 0;
    for _ in 0..10 {
        let answer = rt
            .block_on(
                client
                    .get(format!("http://{address}/connection/poll?channel=chat:x"))
                    .send(),
            )
            .unwrap();
        if answer.status() == 429 {
            refused += 1;
        }
    }
    assert!(refused >= 5, "only {refused} of 10 polls refused at 1/s");
    let metrics = rt
        .block_on(
            client
                .get(format!("http://{address}/metrics"))
                .header("Authorization", "apikey operator-test-key")
                .send(),
        )
        .unwrap();
    let metrics = rt.block_on(metrics.text()).unwrap();
    let line =
        format!("herald_refusals_total{{limit=\"limits.connection_rate_per_address\"}} {refused}");
    assert!(metrics.contains(&line), "no {line:?} in:\n{metrics}");
    assert!(
        metrics.contains("herald_refusals_total{limit=\"limits.connections_per_address\"} 0"),
        "{metrics}"
    );
    // Stopped, the server logs no more: every line it wrote is read.
    assert!(Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let logged: Vec<Value> = server
        .lines
        .by_ref()
        .filter(|v| v["fields"]["limit"].is_string())
        .collect();
    assert_eq!(logged.len(), 1, "{logged:?}");
    let f = &logged[0]["fields"];
    assert_eq!(logged[0]["level"], "WARN");
    assert_eq!(f["limit"], "limits.connection_rate_per_address");
    assert_eq!(f["address"], "127.0.0.1");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("list it in limits.trusted_proxies"),
        "a loopback address may be a proxy's: {f}"
    );
}

/// Issue #37, item 3: a key copied from an example, or too short to resist guessing, does
/// not start a server: `serve` refuses it (exit 2) saying how to make one, from the
/// environment, a flag or the file's `api_keys` alike.
#[test]
fn a_short_api_key_is_refused_at_start() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "api_keys = [\"short-key\"]\n").unwrap();
    let tries: [(&[&str], Option<&str>, &str); 3] = [
        (&[], Some("change-me"), "api_key"),
        (&["--api-key", "secret"], None, "api_key"),
        (
            &["--config", file.path().to_str().unwrap()],
            None,
            "api_keys",
        ),
    ];
    for (args, env, key) in tries {
        let mut command = support::herald();
        command.args(["serve", "--listen", "127.0.0.1:0", "--storage", "memory"]);
        command.args(args);
        if let Some(value) = env {
            command.env("HERALD_API_KEY", value);
        }
        let out = command.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(&format!("`{key}`"))
                && said.contains("at least 16 bytes")
                && said.contains("openssl rand -hex 16"),
            "{said}"
        );
        assert!(
            !said.contains("change-me") && !said.contains("short-key"),
            "the refused key is not repeated: {said}"
        );
    }
}

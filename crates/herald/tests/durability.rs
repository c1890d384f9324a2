//! The default store keeps every acknowledged publication through `kill -9`.

mod support;

use std::{collections::BTreeMap, process::Command, sync::Arc};

use serde_json::{json, Value};
use support::{history, Server};

#[test]
fn kill_9_during_a_publish_burst_loses_no_acknowledged_publication() {
    let data = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(data.path(), &[]);
    let url = server.url.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let acked = Arc::new(acks::Acked::default());
    let publishers: Vec<_> = (0..4)
        .map(|p| {
            let (url, acked) = (url.clone(), acked.clone());
            rt.spawn(async move {
                let http = reqwest::Client::new();
                for i in 0..200 {
                    let body = json!({ "channel": "chat:crash", "data": { "p": p, "i": i } });
                    let sent = http
                        .post(format!("{url}/api/publish"))
                        .header("Authorization", "apikey k")
                        .json(&body)
                        .send()
                        .await;
                    let Ok(r) = sent else { return };
                    let Ok(v) = r.json::<Value>().await else {
                        return;
                    };
                    let Some(offset) = v["offset"].as_u64() else {
                        return;
                    };
                    acked.add(offset, body["data"].clone());
                }
            })
        })
        .collect();
    // Kill in the middle of the burst, without warning.
    while acked.len() < 150 {
        std::thread::yield_now();
    }
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap()
        .success());
    let _ = server.child.wait();
    for p in publishers {
        rt.block_on(p).unwrap();
    }
    let acked = acked.take();
    assert!(acked.len() >= 150);

    let restarted = Server::start_in(data.path(), &[]);
    let h = history(&rt, &restarted.url, "chat:crash");
    let stored: BTreeMap<u64, Value> = h["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["offset"].as_u64().unwrap(), p["data"].clone()))
        .collect();
    for (offset, data) in &acked {
        assert_eq!(
            stored.get(offset),
            Some(data),
            "acknowledged offset {offset} lost or changed"
        );
    }
    let top = h["offset"].as_u64().unwrap();
    assert_eq!(
        stored.keys().copied().collect::<Vec<_>>(),
        (1..=top).collect::<Vec<_>>(),
        "no holes"
    );
    let next = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{}/api/publish", restarted.url))
            .header("Authorization", "apikey k")
            .json(&json!({ "channel": "chat:crash", "data": "after" }))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    assert_eq!(next["offset"].as_u64(), Some(top + 1));
    assert_eq!(next["epoch"], h["epoch"], "same stream after the crash");
    println!(
        "{} acknowledged before kill -9; {top} stored after restart",
        acked.len()
    );
}

#[test]
fn a_damaged_data_file_stops_the_server_with_a_message_naming_it() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("herald.redb"), vec![0x42; 8192]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("herald.redb") && err.contains("damaged"),
        "{err}"
    );
}

mod acks {
    use std::{collections::BTreeMap, sync::Mutex};

    use serde_json::Value;

    /// Acknowledged publications, by offset.
    #[derive(Default)]
    pub struct Acked(Mutex<BTreeMap<u64, Value>>);

    impl Acked {
        pub fn add(&self, offset: u64, data: Value) {
            let previous = self.0.lock().unwrap().insert(offset, data);
            assert!(previous.is_none(), "offset {offset} acknowledged twice");
        }
        pub fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        pub fn take(&self) -> BTreeMap<u64, Value> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }
}

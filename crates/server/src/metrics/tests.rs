use super::*;

#[test]
fn a_named_thread_has_its_own_row_and_the_rest_are_summed() {
    let (started, stop) = std::sync::mpsc::channel::<()>();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let fanout = std::thread::Builder::new()
        .name(format!("{FANOUT_THREAD}7"))
        .spawn(move || {
            started.send(()).unwrap();
            let _ = wait.recv();
        })
        .unwrap();
    stop.recv().unwrap();
    let rows = threads();
    let names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"herald-f-7"), "{names:?}");
    assert!(names.contains(&"other"), "{names:?}");
    assert_eq!(
        thread_cpu("42 (herald-w-0) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0"),
        Some(("herald-w-0".to_string(), 3.0))
    );
    done.send(()).unwrap();
    fanout.join().unwrap();
}

#[test]
fn counts_by_label_and_reads_the_snapshot_when_encoded() {
    let m = Metrics::default();
    m.opened(Transport::Websocket);
    m.opened(Transport::Websocket);
    m.closed(Transport::Websocket);
    m.opened(Transport::Sse);
    m.disconnected(3003);
    m.published("chat", "durable", Duration::from_micros(300));
    m.command("subscribe", Duration::from_micros(80));
    let text = m.encode(Snapshot {
        deliveries: 42,
        channels: 3,
        ..Snapshot::default()
    });
    for line in [
        "herald_connections{transport=\"websocket\"} 1",
        "herald_connections{transport=\"sse\"} 1",
        "herald_connections_accepted_total{transport=\"websocket\"} 2",
        "herald_disconnects_total{code=\"3003\"} 1",
        "herald_publications_total{namespace=\"chat\"} 1",
        "herald_publish_duration_seconds_count{storage=\"durable\"} 1",
        "herald_command_duration_seconds_count{method=\"subscribe\"} 1",
        "herald_deliveries_total 42",
        "herald_channels 3",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    assert!(
        text.contains("herald_process_resident_memory_bytes "),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
}

//! Issue #38: what one hostile client address can make a real `herald serve` process spend,
//! counted from outside (its CPU time in /proc), with the server's default limits.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

mod support;

use support::Server;

/// CPU time the process has used so far (user + system), from /proc/PID/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces, inside parentheses).
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // The kernel counts in USER_HZ, 100 a second on Linux.
    Duration::from_millis(ticks * 10)
}

/// How long `/healthz` of the server at `addr` takes to answer (200, or the test fails).
fn healthz(addr: &str) -> Duration {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    started.elapsed()
}

/// Item 2: a request head that never ends costs nothing while it waits, on the routes
/// served on the socket (SSE, streams, polls) as on hyper's. Each of 300 sockets sends
/// 16 KiB of a head without its blank line; over the next second the server may use at
/// most a tenth of a core (it used most of both, re-reading every head every 2 ms), and
/// `/healthz` still answers at once.
#[test]
fn unfinished_request_heads_cost_no_cpu_while_they_wait() {
    let server = Server::start(&[]);
    let addr = server.url.trim_start_matches("http://").to_string();
    let padding = "a".repeat(16 * 1024);
    let mut sockets = Vec::new();
    for i in 0..300 {
        let mut s = TcpStream::connect(&addr).unwrap();
        let path = if i % 2 == 0 { "sse" } else { "longpoll" };
        write!(
            s,
            "GET /connection/{path}?channel=chat:a&_={padding} HTTP/1.1\r\nHost: {addr}\r\n"
        )
        .unwrap();
        sockets.push(s);
    }
    // Each head has reached the server once /healthz, asked after them all, answers.
    let healthz = || healthz(&addr);
    healthz();
    let pid = server.child.id();
    let before = cpu_time(pid);
    let window = Instant::now();
    let mut slowest = Duration::ZERO;
    while window.elapsed() < Duration::from_secs(1) {
        slowest = slowest.max(healthz());
        std::thread::sleep(Duration::from_millis(50));
    }
    let used = cpu_time(pid) - before;
    let elapsed = window.elapsed();
    assert!(
        used < elapsed / 10,
        "300 unfinished heads cost {used:?} of CPU in {elapsed:?}"
    );
    assert!(
        slowest < Duration::from_millis(100),
        "/healthz took {slowest:?}"
    );
    drop(sockets);
}

/// Opens a WebSocket at `path` offering permessage-deflate, as a browser does; the socket
/// once the server took deflate.
fn deflate_socket(addr: &str, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.contains("permessage-deflate"), "{head}");
    s
}

/// Issue #56 item 6: compressed input is charged by what it inflates to. Messages of
/// about 100 bytes that inflate to 60 KB each (of nothing but line breaks: no command at
/// all) held 96 % of a core from one connection, since each was inflated before anything
/// was charged. Now a connection inflates at most its budget a second and reads nothing
/// more until it refills: sent flat out for two seconds, on Herald's WebSocket and the
/// Phoenix front's, the server may use at most a tenth of a core, and others are served.
#[test]
fn compressed_bombs_cost_little_cpu() {
    use herald_server::transport::websocket::{deflate, frames};
    let server = Server::start(&[]);
    let addr = server.url.trim_start_matches("http://").to_string();
    // Herald's protocol: line breaks (empty lines, no command); Phoenix's: a heartbeat
    // padded with spaces (a message each).
    let herald = [b'\n'; 60_000].to_vec();
    let mut phoenix = br#"[null,"1","phoenix","heartbeat",{}"#.to_vec();
    phoenix.extend([b' '; 60_000]);
    phoenix.push(b']');
    for (path, message) in [
        ("/connection/websocket", herald),
        ("/socket/websocket?vsn=2.0.0", phoenix),
    ] {
        let bomb = deflate::compress(&message);
        assert!(bomb.len() < 200, "{}", bomb.len());
        let mut frame = Vec::new();
        frames::write_client_frame(
            &mut frame,
            (true, true, frames::opcode::TEXT),
            &bomb,
            [1, 2, 3, 4],
        );
        let frames = frame.repeat(100);
        let mut socket = deflate_socket(&addr, path);
        socket.set_nonblocking(true).unwrap();
        let pid = server.child.id();
        let before = cpu_time(pid);
        let window = Instant::now();
        let mut sent = 0usize;
        while window.elapsed() < Duration::from_secs(2) {
            match socket.write(&frames) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{path}: the server closed the connection: {e}"),
            }
        }
        let used = cpu_time(pid) - before;
        let elapsed = window.elapsed();
        eprintln!("{path}: {sent} bytes of compressed bombs cost {used:?} of CPU in {elapsed:?}");
        assert!(
            used < elapsed / 10,
            "{path}: {sent} bytes of compressed bombs cost {used:?} of CPU in {elapsed:?}"
        );
        assert!(
            healthz(&addr) < Duration::from_millis(500),
            "{path}: others wait"
        );
    }
}

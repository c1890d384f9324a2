//! The least a broadcast over loopback TCP can cost on this machine, for comparison with
//! `herald bench fanout`: one thread writes a 101-byte frame to each of N sockets (one
//! non-blocking `write` each, like Herald's direct lane); reader tasks on two threads (like
//! the bench's client workers) read them. Prints, per round, the time from the first write
//! to the last frame read, and the writer's CPU per write (in 10 ms clock ticks, so
//! only meaningful over many rounds).
//!
//! cargo run --release -p herald-bench --example loopback_floor -- 9000 20 500

use std::{
    io::Write,
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use tokio::io::AsyncReadExt;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let (n, rounds, pause_ms) = (
        args.first().copied().unwrap_or(9000) as usize,
        args.get(1).copied().unwrap_or(20) as usize,
        args.get(2).copied().unwrap_or(500),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    // Two reader threads, each a current-thread runtime holding half the clients.
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let received = received.clone();
            let share = n / 2 + (r * (n % 2));
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    for _ in 0..share {
                        let mut s = tokio::net::TcpStream::connect(address).await.unwrap();
                        let received = received.clone();
                        tasks.push(tokio::spawn(async move {
                            let mut buf = [0u8; 4096];
                            loop {
                                match s.read(&mut buf).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(k) => {
                                        let frames =
                                            buf[..k].iter().filter(|b| **b == b'\n').count();
                                        received.fetch_add(frames, Ordering::Release);
                                    }
                                }
                            }
                        }));
                    }
                    for t in tasks {
                        let _ = t.await;
                    }
                });
            })
        })
        .collect();
    let mut sockets: Vec<TcpStream> = (0..n).map(|_| listener.accept().unwrap().0).collect();
    for s in &sockets {
        s.set_nodelay(true).unwrap();
        s.set_nonblocking(true).unwrap();
    }
    let frame = [b"x".repeat(100), b"\n".to_vec()].concat();
    let mut times = Vec::new();
    let cpu = || {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let f: Vec<u64> = stat[stat.rfind(')').unwrap() + 2..]
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        (f[11] + f[12]) as f64 / 100.0
    };
    let mut writer_cpu = 0.0;
    for round in 1..=rounds {
        std::thread::sleep(Duration::from_millis(pause_ms));
        let start = Instant::now();
        let cpu0 = cpu();
        for s in &mut sockets {
            s.write_all(&frame).unwrap();
        }
        writer_cpu += cpu() - cpu0;
        while received.load(Ordering::Acquire) < n * round {
            std::hint::spin_loop();
        }
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{n} sockets, {rounds} rounds: last frame read after {:.1} ms (median; min {:.1}, max {:.1}); writer CPU {:.1} us per write",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        writer_cpu * 1e6 / (n * rounds) as f64
    );
    drop(sockets);
    for r in readers {
        let _ = r.join();
    }
}

//! Issue #60: a fan-out thread that is behind hands each member a run of one channel's
//! publications (`Queue::offer_run`). Its bytes are the same for every member of a kind
//! (one WebSocket message of the run's pushes, a line each), so `queue::Run` makes them
//! once and shares them; before, each member joined and framed the run again. This
//! measures the server's own work per member for both, in one run: `shared` is a socket
//! that says its kind (`DirectSocket::run_kind`), `per_member` one that does not. The
//! socket takes every write whole and copies nothing, so the kernel's `send`, which
//! dominates a real run (see docs/benchmarks.md), is left out on purpose. Throughput is in
//! deliveries.

use std::{io, sync::Arc};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use herald_protocol::{ChannelName, Encoding, Epoch};
use herald_server::{
    queue::{Delivery, DirectSocket, Form, Lane, Position, Queue, Run, RunKind},
    transport::websocket::frames,
};

/// A WebSocket connection's framing of Herald's JSON pushes, writing into nothing.
#[derive(Debug)]
struct Sink {
    alike: bool,
}

impl DirectSocket for Sink {
    fn frame<'d>(&self, d: &'d Delivery, form: Form) -> Option<&'d Bytes> {
        Some(d.framed_as(Lane::WEBSOCKET, form, |d| {
            let mut f = Vec::new();
            frames::write_message(&mut f, d.json(), false, false);
            f.into()
        }))
    }

    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        Ok(std::hint::black_box(buf).len())
    }

    /// As a WebSocket connection of Herald's protocol does (`websocket::Wire`): the pushes
    /// joined a line each in a buffer of the thread's own, then one frame around them.
    fn frame_run(&self, run: &[Arc<Delivery>], out: &mut Vec<u8>) -> usize {
        thread_local! {
            static JOINED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        JOINED.with_borrow_mut(|text| {
            text.clear();
            for d in run {
                Encoding::Json.codec().join(text, d.json());
            }
            frames::write_message(out, text, false, false);
        });
        run.len()
    }

    fn run_kind(&self, _: &[Arc<Delivery>]) -> Option<RunKind> {
        self.alike.then_some(RunKind {
            lane: Lane::WEBSOCKET,
            compress_from: None,
        })
    }
}

const MEMBERS: usize = 1_000;

fn run_frames(c: &mut Criterion) {
    let channel = ChannelName::new("bench").unwrap();
    let epoch = Epoch::new("e");
    let mut group = c.benchmark_group("run_frames");
    for len in [4u64, 16, 64] {
        group.throughput(Throughput::Elements(len * MEMBERS as u64));
        for (name, alike) in [("per_member", false), ("shared", true)] {
            let members: Vec<(Queue, Position)> = (0..MEMBERS)
                .map(|_| {
                    let queue = Queue::new(1 << 20);
                    queue.attach(Arc::new(Sink { alike }));
                    assert!(queue.release());
                    (queue, Position::default())
                })
                .collect();
            let mut next = 1u64;
            let mut run = Run::default();
            group.bench_function(BenchmarkId::new(name, format!("{len}_x{MEMBERS}")), |b| {
                b.iter(|| {
                    // A fresh stretch of the channel each time, 64-byte payloads as in
                    // the fan-out study.
                    run.start((next..next + len).map(|offset| {
                        let json = format!(
                            r#"{{"pub":{{"channel":"bench","offset":{offset},"data":"{}"}}}}"#,
                            "x".repeat(64)
                        );
                        Arc::new(Delivery::new(
                            channel.clone(),
                            epoch.clone(),
                            offset,
                            Bytes::from(json),
                        ))
                    }));
                    for (queue, position) in &members {
                        if next == 1 {
                            position.start(epoch.clone(), 0);
                        }
                        queue.offer_run(&mut run, position);
                    }
                    run.clear();
                    next += len;
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, run_frames);
criterion_main!(benches);

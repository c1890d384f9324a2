//! Issue #60 item 3: how a wake-up's queued publications should leave, measured on a real
//! loopback TCP socket. Herald copies them into one buffer (a WebSocket frame's header,
//! then each publication's push and a line break) and writes it with one `write`; the
//! alternative is one vectored `writev` over the shared push bytes with no copy. Both are one
//! system call per wake-up; what differs is the copy against the kernel's walk over the
//! slices. A reader thread drains the other end, so neither waits for the socket.
//! Throughput is in publications.

use std::{
    io::{IoSlice, Read, Write},
    net::{TcpListener, TcpStream},
    thread,
};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// A connected pair on 127.0.0.1: the writer's end, and a thread reading the other end
/// until it closes.
fn loopback() -> (TcpStream, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    writer.set_nodelay(true).unwrap();
    let (mut reader, _) = listener.accept().unwrap();
    let drain = thread::spawn(move || {
        let mut sink = vec![0u8; 1 << 20];
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    });
    (writer, drain)
}

/// A WebSocket text frame's header for a payload of `len` bytes (server to client).
fn header(len: usize) -> Vec<u8> {
    match len {
        0..=125 => vec![0x81, len as u8],
        126..=0xFFFF => vec![0x81, 126, (len >> 8) as u8, len as u8],
        _ => {
            let mut h = vec![0x81, 127];
            h.extend_from_slice(&(len as u64).to_be_bytes());
            h
        }
    }
}

/// Today's way: the pushes copied into one buffer after the header, one `write`.
fn one_buffer(socket: &mut TcpStream, pushes: &[Bytes], buffer: &mut Vec<u8>) {
    let payload = pushes.iter().map(|p| p.len() + 1).sum::<usize>() - 1;
    buffer.clear();
    buffer.extend_from_slice(&header(payload));
    for (i, push) in pushes.iter().enumerate() {
        if i > 0 {
            buffer.push(b'\n');
        }
        buffer.extend_from_slice(push);
    }
    socket.write_all(buffer).unwrap();
}

/// Most slices one wake-up's writev is given here: a header and 64 pushes with the line
/// breaks between them.
const MAX_SLICES: usize = 129;

/// The alternative: the header, each push and the line breaks between them as slices of
/// one `writev`, the pushes' shared bytes never copied.
fn vectored(socket: &mut TcpStream, pushes: &[Bytes]) {
    let payload = pushes.iter().map(|p| p.len() + 1).sum::<usize>() - 1;
    let head = header(payload);
    let mut slices = [IoSlice::new(&[]); MAX_SLICES];
    slices[0] = IoSlice::new(&head);
    let mut used = 1;
    for (i, push) in pushes.iter().enumerate() {
        if i > 0 {
            slices[used] = IoSlice::new(b"\n");
            used += 1;
        }
        slices[used] = IoSlice::new(push);
        used += 1;
    }
    let mut rest = &mut slices[..used];
    while !rest.is_empty() {
        let n = socket.write_vectored(rest).unwrap();
        IoSlice::advance_slices(&mut rest, n);
    }
}

fn batch_write(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_write");
    for size in [64usize, 1024] {
        for batch in [1usize, 4, 16, 64] {
            let pushes: Vec<Bytes> = (0..batch)
                .map(|i| {
                    let mut p = format!(r#"{{"pub":{{"channel":"bench","offset":{i},"data":""#);
                    p.push_str(&"x".repeat(size.saturating_sub(p.len() + 3)));
                    p.push_str(r#""}}"#);
                    Bytes::from(p)
                })
                .collect();
            group.throughput(Throughput::Elements(batch as u64));
            let id = format!("{size}B_x{batch}");
            let (mut socket, drain) = loopback();
            let mut buffer = Vec::with_capacity(64 * 1024);
            group.bench_function(BenchmarkId::new("one_buffer", &id), |b| {
                b.iter(|| one_buffer(&mut socket, &pushes, &mut buffer))
            });
            group.bench_function(BenchmarkId::new("vectored", &id), |b| {
                b.iter(|| vectored(&mut socket, &pushes))
            });
            drop(socket);
            drain.join().unwrap();
        }
    }
    group.finish();
}

criterion_group!(benches, batch_write);
criterion_main!(benches);

//! The memory presence store with 100,000 members in one channel: `presence_stats`, a page
//! of 1,000 members, and a join (with its leave), each timed at that size. Also prints the
//! store's memory per member (resident memory before and after the members joined).

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use herald_broker::{Member, MemoryPresence, PresenceStore};
use herald_protocol::ChannelName;

const MEMBERS: u64 = 100_000;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = status
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A member as the server makes it: a well-spread id, a user for half of them (their
/// info shared, as a connection's `from` is), none for the rest.
fn member(i: u64, info: &Bytes) -> (Member, Option<String>) {
    let id = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    if i.is_multiple_of(2) {
        (
            Member {
                id,
                info: info.clone(),
            },
            Some(format!("user-{i}")),
        )
    } else {
        (
            Member {
                id,
                info: Bytes::new(),
            },
            None,
        )
    }
}

fn presence(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let channel = ChannelName::new("chat:everyone").unwrap();
    let info = Bytes::from_static(br#"{"user":"someone","info":{"name":"Someone"}}"#);
    let store = MemoryPresence::new();
    let before = rss_bytes();
    rt.block_on(async {
        for i in 0..MEMBERS {
            let (m, user) = member(i, &info);
            store.join(&channel, &m, user.as_deref()).await.unwrap();
        }
    });
    let after = rss_bytes();
    println!(
        "memory presence: {} members, {:.0} bytes each (resident memory)",
        MEMBERS,
        (after.saturating_sub(before)) as f64 / MEMBERS as f64
    );
    let mut group = c.benchmark_group("presence_100k");
    group.bench_function("stats", |b| {
        b.iter(|| rt.block_on(store.stats(&channel)).unwrap())
    });
    group.bench_function("page_of_1000", |b| {
        let mut after = None;
        b.iter(|| {
            let page = rt.block_on(store.members(&channel, after, 1000)).unwrap();
            after = page.last().map(|m| m.id);
            page.len()
        })
    });
    group.bench_function("join_and_leave", |b| {
        let mut i = MEMBERS;
        b.iter(|| {
            i += 1;
            let (m, user) = member(i, &info);
            rt.block_on(async {
                store.join(&channel, &m, user.as_deref()).await.unwrap();
                store.leave(&channel, m.id).await.unwrap()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, presence);
criterion_main!(benches);

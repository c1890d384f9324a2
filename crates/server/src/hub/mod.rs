//! ③ The hub: which local connections listen to which channel, and fan-out to them.
//!
//! The broker calls [`Hub::on_publication`] once per publication, in offset order per
//! channel. The hub encodes the publication once and hands the same bytes to every
//! subscriber's queue (which may write them to the socket at once: see [`crate::queue`]);
//! it never waits for a connection.
//!
//! **Fan-out threads.** Handing a publication to 10,000 connections is 10,000 socket writes;
//! on the broker's thread that would hold up the next commit. So a large channel's
//! subscribers are split into one part per fan-out thread (by session), and each thread
//! writes its part. A connection always lands in the same part, and each thread
//! takes its jobs in order, so every connection still sees a channel's publications in
//! offset order. Small channels are served inline, on the broker's thread, when no job of
//! theirs is still under way (so an inline publication never overtakes a threaded one).
//!
//! **Keeping up.** A fan-out thread writes straight to idle sockets (one `write` per
//! subscriber per publication). When publications arrive faster than that, jobs wait behind
//! each other; then the thread takes them all and writes each connection what waited for
//! it in one message and one `write` (see [`fan_out`]): fewer, larger writes, and no task
//! woken to make them.

use std::{
    collections::{hash_map::RandomState, HashMap, HashSet},
    hash::BuildHasher,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc,
    },
};

use bytes::Bytes;
use herald_broker::{BrokerError, PublicationSink, SharedBroker};
use herald_protocol::{ChannelName, Epoch, Publication};
use parking_lot::{Mutex, RwLock};

use crate::queue::{Delivery, Position, Queue, Run};

mod members;
pub mod presence;

use members::{Member, Members, Snapshot};

const SHARDS: usize = 64;

/// Channels with at most this many local subscribers are fanned out inline.
const INLINE_MAX: usize = 64;

type Subscribers = HashMap<ChannelName, Channel>;

/// A channel's local subscribers, one part per fan-out thread (see [`members`]).
#[derive(Debug)]
struct Channel {
    parts: Box<[Members]>,
    /// Fan-out jobs handed to threads and not finished yet.
    pending: Arc<AtomicUsize>,
    /// The sessions pushed joins and leaves (they may see presence, and the namespace has
    /// `join_leave`): apart from `parts`, so a publication's fan-out walks no more bytes
    /// per member for them.
    presence: HashMap<u64, Arc<Queue>>,
    /// The sessions whose subscription takes deltas. While there are any, the channel keeps
    /// its last publication's data: the base of the next one's delta, made once for all.
    deltas: HashSet<u64>,
    last: Mutex<Option<Last>>,
}

/// A channel's last publication, as the base of the next one's delta.
#[derive(Debug)]
struct Last {
    epoch: Epoch,
    offset: u64,
    data: Bytes,
}

impl Channel {
    fn len(&self) -> usize {
        self.parts.iter().map(Members::len).sum()
    }

    fn members(&self) -> impl Iterator<Item = &Member> {
        self.parts.iter().flat_map(Members::iter)
    }

    /// `delivery` with the data of the channel's last publication when that is the one
    /// right before it (the base of its delta); `publication` becomes the last.
    fn after_last(&self, delivery: Delivery, epoch: &Epoch, publication: &Publication) -> Delivery {
        let data = publication.record.slice_ref(publication.data());
        let mut last = self.last.lock();
        let before = last.replace(Last {
            epoch: epoch.clone(),
            offset: publication.offset,
            data,
        });
        match before {
            Some(b) if b.epoch == *epoch && b.offset + 1 == publication.offset => {
                delivery.after(b.data)
            }
            _ => delivery,
        }
    }
}

/// A fan-out thread's inbox, and how many jobs it holds (waiting or under way).
struct Fanout {
    jobs: mpsc::Sender<Job>,
    backlog: Arc<AtomicUsize>,
}

/// One thread's share of one publication.
struct Job {
    delivery: Arc<Delivery>,
    members: Snapshot,
    pending: Arc<AtomicUsize>,
}

/// Most jobs a fan-out thread takes together, and so most publications it writes to a
/// connection with one `send`.
const MAX_RUN: usize = 64;

/// A fan-out thread: takes the jobs waiting, and hands each run of jobs that share their
/// members (one channel's publications, its members unchanged between them) to every
/// member at once. A thread that keeps up takes one job at a time and writes each
/// publication as it comes; one that is behind writes a connection everything that waited
/// for it in one `send`, itself, rather than queue it and wake the connection's task to
/// do so: on a core shared with the runtime's workers, a publication's deliveries then
/// wait for no other thread.
fn fan_out(rx: &mpsc::Receiver<Job>, held: &AtomicUsize) {
    let mut jobs: Vec<Job> = Vec::new();
    let mut run = Run::default();
    while let Ok(job) = rx.recv() {
        jobs.push(job);
        while jobs.len() < MAX_RUN {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let mut left = &jobs[..];
        while let [first, ..] = left {
            let same = left
                .iter()
                .take_while(|j| Arc::ptr_eq(&j.members, &first.members))
                .count();
            let (these, after) = left.split_at(same);
            if let [job] = these {
                for m in members::walk(&job.members) {
                    m.queue.offer(&job.delivery, &m.position);
                }
            } else {
                run.start(these.iter().map(|j| j.delivery.clone()));
                for m in members::walk(&first.members) {
                    m.queue.offer_run(&mut run, &m.position);
                }
                run.clear();
            }
            for job in these {
                job.pending.fetch_sub(1, Ordering::Release);
                held.fetch_sub(1, Ordering::Release);
            }
            left = after;
        }
        jobs.clear();
    }
}

/// Local subscriptions, sharded by channel.
pub struct Hub {
    shards: Box<[Shard]>,
    hasher: RandomState,
    fanout: Box<[Fanout]>,
    deliveries: AtomicU64,
    publications: AtomicU64,
}

struct Shard {
    subscribers: RwLock<Subscribers>,
    /// Serialises membership changes with the broker calls they imply, so the broker's
    /// interest never lags behind the hub's.
    membership: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("channels", &self.channel_count())
            .field("fanout_threads", &self.fanout.len())
            .finish()
    }
}

impl Hub {
    /// A hub with `threads` fan-out threads (at least one). They end when the hub is dropped.
    pub fn new(threads: usize) -> Self {
        let fanout = (0..threads.max(1))
            .map(|i| {
                let (jobs, rx) = mpsc::channel::<Job>();
                let backlog = Arc::new(AtomicUsize::new(0));
                let held = backlog.clone();
                std::thread::Builder::new()
                    .name(format!("{}{i}", crate::metrics::FANOUT_THREAD))
                    .spawn(move || fan_out(&rx, &held))
                    .expect("spawn a fan-out thread");
                Fanout { jobs, backlog }
            })
            .collect();
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    subscribers: RwLock::default(),
                    membership: tokio::sync::Mutex::new(()),
                })
                .collect(),
            hasher: RandomState::new(),
            fanout,
            deliveries: AtomicU64::new(0),
            publications: AtomicU64::new(0),
        }
    }

    fn shard(&self, channel: &ChannelName) -> &Shard {
        &self.shards[(self.hasher.hash_one(channel) as usize) % SHARDS]
    }

    fn part(&self, session: u64) -> usize {
        (session % self.fanout.len() as u64) as usize
    }

    /// Adds a session's queue to a channel; the first local subscriber makes the node
    /// subscribe at the broker. Publications fanned out from now on reach the queue, checked
    /// against `position`; presence pushes too when `presence`.
    pub async fn subscribe(
        &self,
        broker: &SharedBroker,
        channel: &ChannelName,
        session: u64,
        queue: Arc<Queue>,
        position: Arc<Position>,
        presence: bool,
    ) -> Result<(), BrokerError> {
        let shard = self.shard(channel);
        let _membership = shard.membership.lock().await;
        let first = {
            let mut subs = shard.subscribers.write();
            let entry = subs.entry(channel.clone()).or_insert_with(|| Channel {
                parts: (0..self.fanout.len()).map(|_| Members::default()).collect(),
                pending: Arc::default(),
                presence: HashMap::new(),
                deltas: HashSet::new(),
                last: Mutex::new(None),
            });
            if presence {
                entry.presence.insert(session, queue.clone());
            }
            if position.takes_deltas() {
                entry.deltas.insert(session);
            }
            entry.parts[self.part(session)].insert(Member {
                session,
                queue,
                position,
            });
            entry.len() == 1
        };
        if first {
            if let Err(e) = broker.subscribe(channel).await {
                self.remove(&mut shard.subscribers.write(), channel, session);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Removes a session from a channel; the last local subscriber makes the node
    /// unsubscribe at the broker.
    pub async fn unsubscribe(&self, broker: &SharedBroker, channel: &ChannelName, session: u64) {
        let shard = self.shard(channel);
        let _membership = shard.membership.lock().await;
        let last = self.remove(&mut shard.subscribers.write(), channel, session);
        if last {
            if let Err(e) = broker.unsubscribe(channel).await {
                tracing::warn!(%channel, error = %e, "broker unsubscribe failed");
            }
        }
    }

    /// Returns true when the channel has no local subscribers left.
    fn remove(&self, subs: &mut Subscribers, channel: &ChannelName, session: u64) -> bool {
        let Some(entry) = subs.get_mut(channel) else {
            return false;
        };
        if !entry.parts[self.part(session)].remove(session) {
            return false;
        }
        entry.presence.remove(&session);
        if entry.deltas.remove(&session) && entry.deltas.is_empty() {
            *entry.last.get_mut() = None;
        }
        if entry.len() == 0 {
            subs.remove(channel);
            return true;
        }
        false
    }

    /// Hands a presence push (joins and leaves) to the channel's local subscribers that
    /// take them. It carries no offset (0), so it moves no position, and always goes
    /// through the queue: presence pushes are rare next to publications.
    pub fn push_presence(&self, channel: &ChannelName, push: Bytes) {
        let subs = self.shard(channel).subscribers.read();
        let Some(entry) = subs.get(channel) else {
            return;
        };
        let delivery = Arc::new(Delivery::new(channel.clone(), Epoch::new(""), 0, push));
        for queue in entry.presence.values() {
            queue.offer_queued(&delivery, None);
        }
    }

    /// How many local sessions are subscribed to `channel`.
    pub fn subscriber_count(&self, channel: &ChannelName) -> usize {
        let subs = self.shard(channel).subscribers.read();
        subs.get(channel).map_or(0, Channel::len)
    }

    /// Whether `session` is subscribed to `channel` here.
    pub fn is_member(&self, channel: &ChannelName, session: u64) -> bool {
        let subs = self.shard(channel).subscribers.read();
        subs.get(channel)
            .is_some_and(|entry| entry.parts[self.part(session)].contains(session))
    }

    /// Up to `limit` channels with local subscribers, by name, after `after` and starting
    /// with `prefix`, each with its number of local subscribers: a page of an operator's
    /// listing (a walk over every channel, for an action that is rare).
    pub fn channels_page(&self, after: &str, prefix: &str, limit: usize) -> Vec<(String, usize)> {
        let mut page: Vec<(String, usize)> = Vec::new();
        for shard in self.shards.iter() {
            let subs = shard.subscribers.read();
            page.extend(
                subs.iter()
                    .filter(|(c, _)| c.as_str() > after && c.as_str().starts_with(prefix))
                    .map(|(c, entry)| (c.as_str().to_string(), entry.len())),
            );
            // Keep the first `limit` by name, so a page never holds every channel.
            if page.len() > 2 * limit.max(1) {
                page.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                page.truncate(limit);
            }
        }
        page.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        page.truncate(limit);
        page
    }

    /// Every subscribed session's queue, once each (a walk over every channel): whatever
    /// transport carries it, a held long-poll's and a parked one's included.
    pub fn subscribed_queues(&self) -> Vec<Arc<Queue>> {
        let mut seen = std::collections::HashSet::new();
        let mut queues = Vec::new();
        for shard in self.shards.iter() {
            for entry in shard.subscribers.read().values() {
                for m in entry.members() {
                    if seen.insert(m.session) {
                        queues.push(m.queue.clone());
                    }
                }
            }
        }
        queues
    }

    /// The channels each of `sessions` is subscribed to here (a walk over every channel).
    pub fn channels_of(&self, sessions: &[u64]) -> HashMap<u64, Vec<String>> {
        let mut found: HashMap<u64, Vec<String>> = HashMap::new();
        for shard in self.shards.iter() {
            for (channel, entry) in shard.subscribers.read().iter() {
                for m in entry.members() {
                    if sessions.contains(&m.session) {
                        found
                            .entry(m.session)
                            .or_default()
                            .push(channel.as_str().to_string());
                    }
                }
            }
        }
        for channels in found.values_mut() {
            channels.sort_unstable();
        }
        found
    }

    /// Local subscriptions: every session's, over every channel.
    pub fn subscription_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.subscribers
                    .read()
                    .values()
                    .map(Channel::len)
                    .sum::<usize>()
            })
            .sum()
    }

    /// Channels with at least one local subscriber.
    pub fn channel_count(&self) -> usize {
        self.shards.iter().map(|s| s.subscribers.read().len()).sum()
    }

    /// Publications fanned out and deliveries handed to queues since start.
    pub fn counters(&self) -> (u64, u64) {
        (
            self.publications.load(Ordering::Relaxed),
            self.deliveries.load(Ordering::Relaxed),
        )
    }
}

impl PublicationSink for Hub {
    fn on_publication(&self, channel: &ChannelName, epoch: &Epoch, publication: &Publication) {
        let subs = self.shard(channel).subscribers.read();
        let Some(entry) = subs.get(channel) else {
            return;
        };
        // Encoded in each codec by the first connection that takes it, once for all.
        let mut delivery = Delivery::of_publication(channel.clone(), epoch.clone(), publication);
        if !entry.deltas.is_empty() {
            delivery = entry.after_last(delivery, epoch, publication);
        }
        let delivery = Arc::new(delivery);
        let count = entry.len();
        if count <= INLINE_MAX && entry.pending.load(Ordering::Acquire) == 0 {
            for m in entry.members() {
                m.queue.offer(&delivery, &m.position);
            }
        } else {
            for (part, fanout) in entry.parts.iter().zip(self.fanout.iter()) {
                if part.is_empty() {
                    continue;
                }
                entry.pending.fetch_add(1, Ordering::Relaxed);
                fanout.backlog.fetch_add(1, Ordering::AcqRel);
                let job = Job {
                    delivery: delivery.clone(),
                    members: part.snapshot(),
                    pending: entry.pending.clone(),
                };
                if fanout.jobs.send(job).is_err() {
                    entry.pending.fetch_sub(1, Ordering::Relaxed);
                    fanout.backlog.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        self.publications.fetch_add(1, Ordering::Relaxed);
        self.deliveries.fetch_add(count as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{mpsc::SyncSender, Condvar, Mutex},
        time::{Duration, Instant},
    };

    use herald_broker::MemoryBroker;

    use super::*;
    use crate::queue::DirectSocket;

    /// Sockets whose first write blocks until the test opens the gate.
    #[derive(Debug)]
    struct Gate {
        closed: Mutex<bool>,
        opened: Condvar,
        entered: Mutex<Option<SyncSender<()>>>,
    }

    #[derive(Debug)]
    struct Socket {
        gate: Arc<Gate>,
        writes: Mutex<Vec<Vec<u8>>>,
    }

    impl DirectSocket for Socket {
        fn frame<'d>(&self, d: &'d Delivery, _: crate::queue::Form) -> Option<&'d Bytes> {
            Some(d.framed(crate::queue::Lane::WEBSOCKET, |d| d.json().clone()))
        }

        fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
            if let Some(entered) = self.gate.entered.lock().unwrap().take() {
                entered.send(()).unwrap();
            }
            let mut closed = self.gate.closed.lock().unwrap();
            while *closed {
                closed = self.gate.opened.wait(closed).unwrap();
            }
            self.writes.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }
    }

    #[tokio::test]
    async fn a_fanout_thread_that_is_behind_writes_what_waited_for_a_connection_in_one_send() {
        let hub = Arc::new(Hub::new(1));
        let broker: SharedBroker = MemoryBroker::new(hub.clone());
        let channel = ChannelName::new("big").unwrap();
        let epoch = Epoch::new("e");
        let (entered, first_write) = std::sync::mpsc::sync_channel(1);
        let gate = Arc::new(Gate {
            closed: Mutex::new(true),
            opened: Condvar::new(),
            entered: Mutex::new(Some(entered)),
        });
        // More than INLINE_MAX, so the fan-out thread serves them; every lane idle.
        let mut members = Vec::new();
        for session in 0..=INLINE_MAX as u64 {
            let socket = Arc::new(Socket {
                gate: gate.clone(),
                writes: Mutex::default(),
            });
            let queue = Arc::new(Queue::new(1 << 20));
            queue.attach(socket.clone());
            assert!(queue.release());
            let position = Arc::new(Position::default());
            position.start(epoch.clone(), 0);
            hub.subscribe(&broker, &channel, session, queue.clone(), position, false)
                .await
                .unwrap();
            members.push((socket, queue));
        }
        let publish = |offset| {
            hub.on_publication(
                &channel,
                &epoch,
                &Publication {
                    offset,
                    record: Bytes::from_static(b"1"),
                },
            )
        };
        // Publication 1 is under way (its first write held at the gate) while 2 and 3 arrive.
        publish(1);
        first_write
            .recv_timeout(Duration::from_secs(10))
            .expect("the fan-out thread writes");
        publish(2);
        publish(3);
        *gate.closed.lock().unwrap() = false;
        gate.opened.notify_all();
        let deadline = Instant::now() + Duration::from_secs(10);
        let pending = hub.shard(&channel).subscribers.read()[&channel]
            .pending
            .clone();
        while pending.load(Ordering::Acquire) > 0 {
            assert!(Instant::now() < deadline, "fan-out jobs finish");
            std::thread::yield_now();
        }
        let offsets = |write: &[u8]| -> Vec<u64> {
            let text = String::from_utf8_lossy(write);
            text.split("\"offset\":")
                .skip(1)
                .map(|o| {
                    o.split(|c: char| !c.is_ascii_digit())
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap()
                })
                .collect()
        };
        for (socket, queue) in &members {
            let writes = socket.writes.lock().unwrap();
            let sends: Vec<Vec<u64>> = writes.iter().map(|w| offsets(w)).collect();
            assert_eq!(
                sends,
                [vec![1], vec![2, 3]],
                "publication 1 as it came, then 2 and 3, which waited together, in one send"
            );
            let mut queued = Vec::new();
            queue.take(usize::MAX, &mut queued).unwrap();
            assert!(queued.is_empty(), "nothing left for the connection's task");
            // Issue #60: a fan-out costs no wake-up of a connection that has nothing left
            // to write, paced (publication 1) or behind (2 and 3).
            assert!(
                futures_util::FutureExt::now_or_never(queue.ready()).is_none(),
                "the connection's task was never woken"
            );
        }
    }
}

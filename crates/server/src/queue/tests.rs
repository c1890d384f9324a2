use super::*;
use herald_protocol::Epoch;

/// Offers without a lane: always queued.
fn queue(q: &Queue, d: Arc<Delivery>) -> bool {
    q.offer(&d, &Position::default())
}

fn delivery(offset: u64, size: usize) -> Arc<Delivery> {
    Arc::new(Delivery::new(
        ChannelName::new("c").unwrap(),
        Epoch::new("e"),
        offset,
        Bytes::from(vec![b'x'; size]),
    ))
}

#[tokio::test]
async fn takes_in_order_in_bounded_batches() {
    let q = Queue::new(1000);
    for i in 1..=5 {
        assert!(queue(&q, delivery(i, 10)));
    }
    q.ready().await;
    let mut out = Vec::new();
    q.take(25, &mut out).unwrap();
    assert_eq!(out.iter().map(|d| d.offset).collect::<Vec<_>>(), [1, 2, 3]);
    out.clear();
    q.take(1000, &mut out).unwrap();
    assert_eq!(out.iter().map(|d| d.offset).collect::<Vec<_>>(), [4, 5]);
}

#[tokio::test]
async fn overflow_drops_everything_and_wakes_the_reader() {
    let q = Arc::new(Queue::new(100));
    assert!(queue(&q, delivery(1, 60)));
    let mut out = Vec::new();
    q.take(usize::MAX, &mut out).unwrap();
    assert!(queue(&q, delivery(2, 60)));
    assert!(!queue(&q, delivery(3, 60)), "past the bound");
    assert!(!queue(&q, delivery(4, 1)), "stays overflowed");
    q.ready().await;
    assert_eq!(q.take(usize::MAX, &mut out), Err(Overflowed));
}

/// A socket that takes at most `room` more bytes, like a kernel buffer filling up.
#[derive(Debug, Default)]
struct Buffer {
    written: Mutex<Vec<u8>>,
    room: Mutex<usize>,
    /// Whether it frames a run as every other such socket does (`DirectSocket::run_kind`).
    alike: bool,
    /// How many runs it framed.
    runs_framed: Mutex<usize>,
}

impl Buffer {
    fn with_room(room: usize) -> Arc<Self> {
        let b = Self::default();
        *b.room.lock() = room;
        Arc::new(b)
    }
}

impl DirectSocket for Buffer {
    fn frame<'d>(&self, d: &'d Delivery, form: Form) -> Option<&'d Bytes> {
        Some(d.framed_as(Lane::WEBSOCKET, form, |d| {
            let mut f = b"<".to_vec();
            f.extend_from_slice(d.json_as(form));
            f.push(b'>');
            f.into()
        }))
    }

    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let mut room = self.room.lock();
        if *room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(*room);
        *room -= n;
        self.written.lock().extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn frame_run(&self, run: &[Arc<Delivery>], out: &mut Vec<u8>) -> usize {
        *self.runs_framed.lock() += 1;
        frame_each(self, run, out)
    }

    fn run_kind(&self, _: &[Arc<Delivery>]) -> Option<RunKind> {
        self.alike.then_some(RunKind {
            lane: Lane::WEBSOCKET,
            compress_from: None,
        })
    }
}

fn started(offset: u64) -> Position {
    let p = Position::default();
    p.start(Epoch::new("e"), offset);
    p
}

/// A queue whose lane is open to a socket with `room` bytes, and idle.
fn idle_lane(room: usize) -> (Queue, Arc<Buffer>) {
    let q = Queue::new(1000);
    let socket = Buffer::with_room(room);
    q.attach(socket.clone());
    assert!(q.release());
    (q, socket)
}

fn queued(q: &Queue) -> usize {
    q.inner.lock().items.len()
}

#[test]
fn an_idle_lane_writes_directly_and_a_busy_one_queues() {
    let q = Queue::new(1000);
    let socket = Buffer::with_room(1000);
    q.attach(socket.clone());
    let position = started(0);
    assert!(q.offer(&delivery(1, 1), &position));
    assert_eq!(queued(&q), 1, "held until first released");
    let mut out = Vec::new();
    q.take(usize::MAX, &mut out).unwrap();
    position.set(1);
    assert!(q.release());
    assert!(q.offer(&delivery(2, 1), &position));
    assert!(
        q.offer(&delivery(2, 1), &position),
        "a duplicate is dropped"
    );
    assert_eq!(&socket.written.lock()[..], b"<x>");
    assert_eq!(position.get().unwrap().1, 2);
    q.hold();
    assert!(q.offer(&delivery(3, 1), &position));
    assert_eq!(queued(&q), 1, "busy: queued");
    assert_eq!(&socket.written.lock()[..], b"<x>");
}

#[test]
fn a_gap_an_unset_position_or_a_full_socket_goes_to_the_transport() {
    let (q, socket) = idle_lane(1000);
    assert!(q.offer(&delivery(1, 1), &Position::default()));
    assert_eq!(queued(&q), 1, "unset position");
    let mut out = Vec::new();
    q.take(usize::MAX, &mut out).unwrap();
    assert!(q.release());
    assert!(q.offer(&delivery(5, 1), &started(2)));
    assert_eq!(queued(&q), 1, "a gap");
    assert!(socket.written.lock().is_empty());

    let (q, socket) = idle_lane(0);
    let position = started(0);
    assert!(q.offer(&delivery(1, 1), &position));
    assert_eq!(queued(&q), 1, "the socket took nothing");
    assert_eq!(
        position.get().unwrap().1,
        0,
        "not sent: the transport advances it"
    );
    assert!(socket.written.lock().is_empty());
}

#[test]
fn a_queued_offer_leaves_even_an_idle_lane_to_the_transport() {
    let (q, socket) = idle_lane(1000);
    let position = started(0);
    assert!(q.offer_queued(&delivery(1, 1), None));
    assert!(q.offer_queued(&delivery(2, 1), None));
    assert_eq!(queued(&q), 2, "both wait for one write by the transport");
    assert!(socket.written.lock().is_empty());
    assert_eq!(position.get().unwrap().1, 0, "the transport advances it");
    assert!(q.offer(&delivery(3, 1), &position));
    assert_eq!(
        queued(&q),
        3,
        "behind queued ones, a direct write would overtake"
    );
    assert!(socket.written.lock().is_empty());
}

/// A fan-out thread that is behind hands a connection a run of publications at once
/// (`Queue::offer_run`): what it already had is skipped, what follows on goes in one write,
/// and whatever the socket or the offsets do not allow waits for the transport in order.
#[test]
fn a_run_goes_in_one_write_up_to_a_gap_or_what_the_socket_takes() {
    let mut run = Run::default();
    run.start([1, 2, 3, 5].map(|o| delivery(o, 1)));

    let (q, socket) = idle_lane(1000);
    let position = started(1);
    assert!(q.offer_run(&mut run, &position));
    assert_eq!(
        &socket.written.lock()[..],
        b"<x><x>",
        "1 was sent: 2 and 3 in one write"
    );
    assert_eq!(position.get().unwrap().1, 3);
    let mut out = Vec::new();
    q.take(usize::MAX, &mut out).unwrap();
    let left: Vec<u64> = out.iter().map(|d| d.offset).collect();
    assert_eq!(left, [5], "after the gap, the transport's own checks");

    run.start([1, 2, 3].map(|o| delivery(o, 1)));
    let (q, socket) = idle_lane(4);
    let position = started(0);
    assert!(q.offer_run(&mut run, &position));
    assert_eq!(&socket.written.lock()[..], b"<x><");
    assert_eq!(position.get().unwrap().1, 3, "all three are on their way");
    assert!(q.has_unsent(), "the tail goes before anything else");
    assert_eq!(queued(&q), 0);

    let (q, socket) = idle_lane(0);
    let position = started(0);
    assert!(q.offer_run(&mut run, &position));
    assert_eq!(
        queued(&q),
        3,
        "the socket took nothing: all for the transport"
    );
    assert_eq!(position.get().unwrap().1, 0, "the transport advances it");
    assert!(socket.written.lock().is_empty());
}

/// A run's frames are made once for every socket that frames it alike (`Run`), per
/// stretch of it; a socket of its own kind gets frames of its own; a write taken in part
/// keeps the rest of the shared bytes for the transport.
#[test]
fn a_run_is_framed_once_for_the_sockets_that_frame_it_alike() {
    let mut run = Run::default();
    run.start([1, 2, 3].map(|o| delivery(o, 1)));
    let lane = |room, alike| {
        let q = Queue::new(1000);
        let socket = Arc::new(Buffer {
            alike,
            ..Default::default()
        });
        *socket.room.lock() = room;
        q.attach(socket.clone());
        assert!(q.release());
        (q, socket)
    };
    let members = [
        (lane(1000, true), started(0)),
        (lane(4, true), started(0)),
        (lane(1000, true), started(1)),
        (lane(1000, true), started(0)),
        (lane(1000, false), started(0)),
    ];
    for ((q, _), position) in &members {
        assert!(q.offer_run(&mut run, position));
    }
    let written: Vec<Vec<u8>> = members
        .iter()
        .map(|((_, s), _)| s.written.lock().clone())
        .collect();
    let expected: [&[u8]; 5] = [b"<x><x><x>", b"<x><", b"<x><x>", b"<x><x><x>", b"<x><x><x>"];
    assert_eq!(written, expected);
    let runs_framed: Vec<usize> = members
        .iter()
        .map(|((_, s), _)| *s.runs_framed.lock())
        .collect();
    assert_eq!(
        runs_framed,
        [1, 0, 1, 0, 1],
        "once for 1-3 and once for 2-3 among the alike, once for the other"
    );
    let ((half, _), _) = &members[1];
    assert_eq!(&half.inner.lock().unsent[..], b"x><x>");
}

#[test]
fn a_detached_lane_only_queues() {
    let (q, socket) = idle_lane(1000);
    q.detach();
    assert!(q.release(), "idle, but with no lane");
    assert!(q.offer(&delivery(1, 1), &started(0)));
    assert_eq!(queued(&q), 1);
    assert!(socket.written.lock().is_empty());
}

#[test]
fn a_half_written_frame_goes_out_whole_before_anything_else() {
    let (q, socket) = idle_lane(3);
    let position = started(0);
    assert!(q.offer(&delivery(1, 4), &position), "<xxxx> half taken");
    assert!(q.has_unsent());
    assert!(!q.release(), "the tail must go first");
    assert!(q.offer(&delivery(2, 1), &position));
    assert_eq!(queued(&q), 1, "queued behind the tail");
    // The transport's own write waits for the tail...
    let e = q.write_through(&*socket, b"[reply]").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    // ...and once the socket has room, the tail leaves first, then the new frame.
    *socket.room.lock() = 100;
    assert_eq!(q.write_through(&*socket, b"[reply]").unwrap(), 7);
    assert_eq!(&socket.written.lock()[..], b"<xxxx>[reply]");
    assert!(!q.has_unsent());
}

#[tokio::test]
async fn a_publication_is_made_into_herald_json_only_when_a_connection_asks() {
    let channel = ChannelName::new("room:1").unwrap();
    let publication = herald_protocol::Publication {
        offset: 7,
        record: herald_protocol::Publication::record(Bytes::from_static(br#"{"n":1}"#), None),
    };
    let d = Arc::new(Delivery::of_publication(
        channel.clone(),
        Epoch::new("e"),
        &publication,
    ));
    // Queued, counted and taken without it: a front's connection never asks.
    let q = Queue::new(1000);
    assert!(queue(&q, d.clone()));
    q.ready().await;
    let mut out = Vec::new();
    q.take(1000, &mut out).unwrap();
    assert!(!d.json_made());
    let expected = herald_protocol::Encoding::Json
        .codec()
        .push(&herald_protocol::Push::Pub {
            channel: &channel,
            publication: &publication,
        });
    assert_eq!(&d.json()[..], &expected[..]);
    assert!(d.json_made());
    // The queue's estimate covers the push it stands for.
    assert!(d.size >= expected.len(), "{} < {}", d.size, expected.len());
}

/// A publication of `data` at `offset`, after one of `base` when given (as the hub makes
/// it for a channel with subscriptions that take deltas).
fn publication(offset: u64, data: &str, base: Option<&str>) -> Arc<Delivery> {
    let d = Delivery::new(
        ChannelName::new("c").unwrap(),
        Epoch::new("e"),
        offset,
        Bytes::from(format!("plain {offset}")),
    )
    .carrying(Bytes::from(data.to_owned()));
    Arc::new(match base {
        Some(base) => d.after(Bytes::from(base.to_owned())),
        None => d,
    })
}

const DOC: &str = r#"{"n":1,"text":"a document long enough for a delta to be worth it"}"#;

fn doc(n: u64) -> String {
    DOC.replace("\"n\":1", &format!("\"n\":{n}"))
}

#[test]
fn a_subscription_that_takes_deltas_gets_one_whole_publication_then_deltas_on_either_path() {
    let (q, socket) = idle_lane(1 << 20);
    let position = started(0);
    position.take_deltas();
    let lines = || String::from_utf8(socket.written.lock().clone()).unwrap();

    // The first one whole, even with a base: the client has nothing to apply a delta to.
    q.offer(&publication(1, &doc(1), Some(&doc(0))), &position);
    assert!(lines().contains(r#""full":"#), "{}", lines());
    q.offer(&publication(2, &doc(2), Some(&doc(1))), &position);
    assert!(
        lines().ends_with(r#"}}>"#) && lines().contains(r#""delta":"#),
        "{}",
        lines()
    );
    // Without a base (the hub did not see the one before): whole again.
    q.offer(&publication(3, &doc(3), None), &position);
    assert_eq!(lines().matches(r#""full":"#).count(), 2, "{}", lines());
    assert_eq!(position.get().unwrap().1, 3);

    // Through the queue (the transport busy): the session asks the same position.
    q.hold();
    let d = publication(4, &doc(4), Some(&doc(3)));
    q.offer(&d, &position);
    assert_eq!(queued(&q), 1);
    assert_eq!(position.form(&d), Form::Delta);
    let delta: serde_json::Value = serde_json::from_slice(d.json_as(Form::Delta)).unwrap();
    let delta = delta["pub"]["delta"].as_str().unwrap();
    assert_eq!(
        fossil_delta::apply(doc(3), delta).unwrap(),
        doc(4).as_bytes()
    );

    // A subscription that takes none gets the plain push, the same delivery.
    let plain = started(3);
    assert_eq!(plain.form(&d), Form::Plain);
    assert_eq!(d.json_as(Form::Plain), &Bytes::from("plain 4"));
}

fn keyed(offset: u64, key: Option<&str>) -> Arc<Delivery> {
    let record = herald_protocol::Publication::keyed_record(Bytes::from("1"), None, key);
    Arc::new(
        Delivery::new(
            ChannelName::new("c").unwrap(),
            Epoch::new("e"),
            offset,
            Bytes::from(vec![b'x'; 10]),
        )
        .carrying(record),
    )
}

/// On a subscription that conflates, a publication replaces the waiting one of its key
/// (and only that one), and the replaced offsets are told once, exactly.
#[tokio::test]
async fn a_conflating_subscription_keeps_the_newest_of_each_key() {
    let q = Queue::new(1000);
    let position = Position::default();
    position.conflate();
    for (offset, key) in [(1, Some("a")), (2, Some("b")), (3, Some("a")), (4, None)] {
        assert!(q.offer_queued(&keyed(offset, key), Some(&position)));
    }
    assert!(q.offer_queued(&keyed(5, Some("a")), Some(&position)));
    assert!(q.offer_queued(&keyed(6, None), Some(&position)));
    let mut out = Vec::new();
    q.take(usize::MAX, &mut out).unwrap();
    assert_eq!(
        out.iter().map(|d| d.offset).collect::<Vec<_>>(),
        [2, 4, 5, 6]
    );
    let c = ChannelName::new("c").unwrap();
    // 1 was replaced: the session at 0 skips to 1 before 2; 3 too: at 2 it skips to 3
    // before 4. A gap of anything else is not covered.
    assert!(q.superseded(&c, 0, 2));
    assert!(!q.superseded(&c, 2, 5), "4 was not replaced");
    assert!(!q.superseded(&c, 4, 6), "and 3 is forgotten once passed");
    // What a subscription that ended left is forgotten with it.
    assert!(q.offer_queued(&keyed(7, Some("a")), Some(&position)));
    assert!(q.offer_queued(&keyed(8, Some("a")), Some(&position)));
    q.forget_superseded(&c);
    assert!(!q.superseded(&c, 6, 8), "7 is no longer taken for skipped");
    // A subscription that does not conflate keeps everything.
    let q = Queue::new(1000);
    for offset in 1..=3 {
        assert!(q.offer_queued(&keyed(offset, Some("a")), Some(&Position::default())));
    }
    let mut out = Vec::new();
    q.take(usize::MAX, &mut out).unwrap();
    assert_eq!(out.len(), 3);
    assert!(!q.superseded(&c, 0, 2), "nothing was replaced");
}

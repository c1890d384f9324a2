//! Channel streams in JetStream: publishing as a compare-and-set, history by subject, the
//! epoch of channels nobody published to, and removal.
//!
//! A channel's publications are the messages of its subject, each with its offset and
//! epoch in headers. Publishing sets `Nats-Expected-Last-Subject-Sequence` to the stream
//! sequence of the channel's newest message (as this node last saw it), so JetStream
//! stores it only if nobody else published to the channel meanwhile: offsets stay gap-free
//! with any number of writer nodes. A writer that was late reads the channel's newest
//! message again and retries. Within one node, a channel's publishes take turns, so they
//! never race each other.

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_nats::{
    jetstream::{
        self,
        context::PublishErrorKind,
        message::StreamMessage,
        stream::{
            Config, DirectGetErrorKind, DiscardPolicy, LastRawMessageErrorKind,
            RawMessageErrorKind, Republish, StorageType, Stream,
        },
    },
    HeaderMap,
};
use bytes::Bytes;
use herald_broker::{
    check_since, BrokerError, History, HistoryQuery, Policies, StreamPolicy, EMPTY_STREAM_GRACE,
    MAX_UNWRITTEN_STREAMS,
};
use herald_protocol::{json::stored_record, ChannelName, Epoch, Publication, StreamPosition};
use parking_lot::Mutex;

use crate::{names::Names, unavailable};

/// Header of a publication's offset in its channel.
pub(crate) const OFFSET: &str = "Herald-Offset";
/// Header of the epoch of the channel's stream.
pub(crate) const EPOCH: &str = "Herald-Epoch";
const EXPECTED_LAST: &str = "Nats-Expected-Last-Subject-Sequence";
const MESSAGE_ID: &str = "Nats-Msg-Id";

/// What a publish did.
#[derive(Debug)]
pub(crate) enum Published {
    /// Stored there.
    New(StreamPosition),
    /// Its message id was stored before, there: nothing stored now.
    Before(StreamPosition),
    /// Its message id was stored before, and that message has left history since.
    Gone,
}

/// How many times a publish reads the channel anew after finding another writer ahead.
/// Each retry means another node published meanwhile, so this bounds only a pathological
/// pile-up, never a normal hot channel.
const MOST_ATTEMPTS: usize = 1000;

/// Newest positions remembered per node; past it, the cache starts over (a miss costs one
/// read).
const MOST_TOPS: usize = 100_000;

/// A channel's newest message as a node last saw it.
#[derive(Debug, Clone)]
pub(crate) struct Top {
    /// Its stream sequence (0: the channel has no message).
    pub(crate) seq: u64,
    pub(crate) offset: u64,
    pub(crate) epoch: Epoch,
}

impl Top {
    fn position(&self) -> StreamPosition {
        StreamPosition {
            offset: self.offset,
            epoch: self.epoch.clone(),
        }
    }
}

/// The streams of one prefix.
pub(crate) struct Store {
    pub(crate) js: jetstream::Context,
    pub(crate) names: Names,
    policies: Policies,
    /// Streams made (or found) so far, by name.
    streams: Mutex<HashMap<String, Stream>>,
    /// Epochs of channels read before their first publication.
    empty: Stream,
    tops: Mutex<HashMap<String, Top>>,
    /// Per subject, whose turn it is to publish on this node.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Servers that keep each stream (see [`crate::NatsOptions::replicas`]).
    pub(crate) replicas: usize,
}

impl Store {
    /// Finds or makes the stream of empty channels' epochs: the first call JetStream must
    /// answer, so a server without JetStream is found out at start.
    pub(crate) async fn open(
        js: jetstream::Context,
        names: Names,
        policies: Policies,
        replicas: usize,
    ) -> Result<Self, BrokerError> {
        let empty = js
            .get_or_create_stream(Config {
                name: names.empty_stream(),
                subjects: vec![names.empty_subjects()],
                max_messages_per_subject: 1,
                max_messages: MAX_UNWRITTEN_STREAMS as i64,
                max_age: EMPTY_STREAM_GRACE,
                discard: DiscardPolicy::Old,
                allow_direct: replicas == 1,
                num_replicas: replicas,
                storage: StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| BrokerError::Unavailable(format!("nats jetstream: {e}")))?;
        Ok(Self {
            js,
            names,
            policies,
            streams: Mutex::default(),
            empty,
            tops: Mutex::default(),
            turns: Mutex::default(),
            replicas,
        })
    }

    /// How to read `stream` (see [`Reader`]).
    pub(crate) fn reader<'a>(&self, stream: &'a Stream) -> Reader<'a> {
        Reader {
            stream,
            leader: self.replicas > 1,
        }
    }

    pub(crate) fn policy(&self, channel: &ChannelName) -> StreamPolicy {
        (self.policies)(channel)
    }

    /// The stream that keeps channels with `policy`'s retention, made on first use.
    pub(crate) async fn stream(&self, policy: &StreamPolicy) -> Result<Stream, BrokerError> {
        let name = self.names.stream(policy);
        if let Some(stream) = self.streams.lock().get(&name) {
            return Ok(stream.clone());
        }
        let subjects = self.names.stream_subjects(policy);
        let stream = self
            .js
            .get_or_create_stream(Config {
                name: name.clone(),
                subjects: vec![subjects.clone()],
                // A channel with no history still keeps its newest message: its position.
                max_messages_per_subject: policy.history_size.max(1) as i64,
                // JetStream reads 0 as "forever"; a zero TTL is "as short as it gets".
                max_age: policy.history_ttl.max(Duration::from_millis(1)),
                discard: DiscardPolicy::Old,
                allow_direct: self.replicas == 1,
                num_replicas: self.replicas,
                storage: StorageType::File,
                republish: Some(Republish {
                    source: subjects,
                    destination: self.names.live_all(),
                    headers_only: false,
                }),
                ..Default::default()
            })
            .await
            .map_err(|e| BrokerError::Unavailable(format!("nats: stream {name}: {e}")))?;
        self.streams.lock().insert(name, stream.clone());
        Ok(stream)
    }

    /// Appends `data` to `channel`; see the module docs. With `message_id`, JetStream
    /// stores it only if no message of the stream carried that id within its duplicate
    /// window (two minutes, or the history's age if shorter): otherwise the answer is where
    /// that one is.
    pub(crate) async fn publish(
        &self,
        channel: &ChannelName,
        data: &Bytes,
        policy: &StreamPolicy,
        message_id: Option<&str>,
    ) -> Result<Published, BrokerError> {
        let stream = self.stream(policy).await?;
        let subject = self.names.subject(channel, policy);
        let turn = self
            .turns
            .lock()
            .entry(subject.clone())
            .or_default()
            .clone();
        let published = {
            let _turn = turn.lock().await;
            self.publish_in_turn(&stream, channel, &subject, data, message_id)
                .await
        };
        // The last one out forgets the turn (the map holds one reference, `turn` another).
        drop(turn);
        let mut turns = self.turns.lock();
        if turns
            .get(&subject)
            .is_some_and(|t| Arc::strong_count(t) == 1)
        {
            turns.remove(&subject);
        }
        published
    }

    async fn publish_in_turn(
        &self,
        stream: &Stream,
        channel: &ChannelName,
        subject: &str,
        data: &Bytes,
        message_id: Option<&str>,
    ) -> Result<Published, BrokerError> {
        let cached = self.tops.lock().get(subject).cloned();
        let mut top = match cached {
            Some(top) => top,
            None => self.fresh_top(stream, channel, subject, false).await?,
        };
        for _ in 0..MOST_ATTEMPTS {
            let next = top.offset + 1;
            let mut headers = HeaderMap::new();
            headers.insert(EXPECTED_LAST, top.seq.to_string().as_str());
            headers.insert(OFFSET, next.to_string().as_str());
            headers.insert(EPOCH, top.epoch.as_str());
            if let Some(id) = message_id {
                headers.insert(MESSAGE_ID, id);
            }
            let acked = match self
                .js
                .publish_with_headers(subject.to_string(), headers, data.clone())
                .await
            {
                Ok(ack) => ack.await,
                Err(e) => {
                    self.tops.lock().remove(subject);
                    return Err(unavailable(e));
                }
            };
            match acked {
                Ok(ack) if ack.duplicate => {
                    // Stored before, under this id: where it went, if it is still there.
                    return match self.reader(stream).at(ack.sequence).await? {
                        Some(message) => {
                            let (offset, epoch) = position_of(channel, &message)?;
                            Ok(Published::Before(StreamPosition { offset, epoch }))
                        }
                        None => Ok(Published::Gone),
                    };
                }
                Ok(ack) => {
                    let stored = Top {
                        seq: ack.sequence,
                        offset: next,
                        epoch: top.epoch,
                    };
                    let position = stored.position();
                    let mut tops = self.tops.lock();
                    if tops.len() >= MOST_TOPS {
                        tops.clear();
                    }
                    tops.insert(subject.to_string(), stored);
                    return Ok(Published::New(position));
                }
                Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                    // Another node published (or history was removed, or expired): read
                    // where the channel is now and try again.
                    top = self.fresh_top(stream, channel, subject, false).await?;
                }
                Err(e) => {
                    self.tops.lock().remove(subject);
                    return Err(unavailable(e));
                }
            }
        }
        Err(BrokerError::Unavailable(format!(
            "nats: {channel}: {MOST_ATTEMPTS} writers were ahead in turn"
        )))
    }

    /// Where `channel` is as this node last saw it (read once if it never did).
    pub(crate) async fn top(
        &self,
        channel: &ChannelName,
        policy: &StreamPolicy,
    ) -> Result<Top, BrokerError> {
        let subject = self.names.subject(channel, policy);
        if let Some(top) = self.tops.lock().get(&subject) {
            return Ok(top.clone());
        }
        let stream = self.stream(policy).await?;
        self.fresh_top(&stream, channel, &subject, false).await
    }

    /// Where `channel` is now, read from JetStream. A channel with no message is at offset
    /// 0 of the epoch kept for it while empty: with `keep`, one is made and kept (readers
    /// must see the same epoch until the first publication); without, a new one is taken
    /// if none is kept (the first publication fixes it).
    pub(crate) async fn fresh_top(
        &self,
        stream: &Stream,
        channel: &ChannelName,
        subject: &str,
        keep: bool,
    ) -> Result<Top, BrokerError> {
        match self.reader(stream).newest(subject).await? {
            Some(message) => {
                let (offset, epoch) = position_of(channel, &message)?;
                Ok(Top {
                    seq: message.sequence,
                    offset,
                    epoch,
                })
            }
            None => Ok(Top {
                seq: 0,
                offset: 0,
                epoch: self.empty_epoch(channel, keep).await?,
            }),
        }
    }

    /// The epoch kept for `channel` while it has no publication; see [`Store::fresh_top`].
    async fn empty_epoch(&self, channel: &ChannelName, keep: bool) -> Result<Epoch, BrokerError> {
        let subject = self.names.empty(channel);
        loop {
            let seq = match self.reader(&self.empty).newest(&subject).await? {
                Some(message) => return epoch_of(channel, &message),
                None if !keep => return Ok(new_epoch()),
                None => 0,
            };
            let epoch = new_epoch();
            let mut headers = HeaderMap::new();
            headers.insert(EXPECTED_LAST, seq.to_string().as_str());
            headers.insert(EPOCH, epoch.as_str());
            let acked = self
                .js
                .publish_with_headers(subject.clone(), headers, Bytes::new())
                .await
                .map_err(unavailable)?
                .await;
            match acked {
                Ok(_) => return Ok(epoch),
                // Another reader kept one first: read it.
                Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => continue,
                Err(e) => return Err(unavailable(e)),
            }
        }
    }

    /// Reads history; see [`HistoryQuery`].
    pub(crate) async fn history(
        &self,
        channel: &ChannelName,
        query: &HistoryQuery,
    ) -> Result<History, BrokerError> {
        let policy = self.policy(channel);
        let stream = self.stream(&policy).await?;
        let subject = self.names.subject(channel, &policy);
        let top = self.fresh_top(&stream, channel, &subject, true).await?;
        let position = top.position();
        let oldest = match (top.seq, policy.history_size) {
            (0, _) | (_, 0) => None,
            _ => self.reader(&stream).next_of(&subject, 1).await?,
        };
        let first = match &oldest {
            Some(message) => position_of(channel, message)?.0,
            None => top.offset + 1,
        };
        if let Some(since) = &query.since {
            check_since(since, &position, first)?;
        }
        let Some(oldest) = oldest.filter(|_| query.limit > 0) else {
            return Ok(History {
                position,
                publications: Vec::new(),
            });
        };
        let (from, to) = match &query.since {
            Some(since) => {
                let from = (since.offset + 1).max(first);
                (
                    from,
                    top.offset.min(from.saturating_add(query.limit as u64 - 1)),
                )
            }
            None => (
                first.max((top.offset + 1).saturating_sub(query.limit as u64)),
                top.offset,
            ),
        };
        let mut candidates = Vec::new();
        if from <= to {
            let reader = self.reader(&stream);
            let start = find(reader, channel, &subject, (&oldest, first), &top, from).await?;
            candidates = read_run(reader, channel, &subject, start, from, to).await?;
            if query.since.is_some() && candidates.first().map(|p| p.offset) != Some(from) {
                // Trimmed while being read: the page would not start where it must.
                return Err(BrokerError::Unrecoverable { current: position });
            }
        }
        Ok(History {
            position,
            publications: query.page(candidates.iter()),
        })
    }

    /// Forgets `channel`'s history and its kept epoch: the next read or publication
    /// starts a new epoch.
    pub(crate) async fn remove(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        let policy = self.policy(channel);
        let stream = self.stream(&policy).await?;
        let subject = self.names.subject(channel, &policy);
        stream
            .purge()
            .filter(subject.clone())
            .await
            .map_err(unavailable)?;
        self.empty
            .purge()
            .filter(self.names.empty(channel))
            .await
            .map_err(unavailable)?;
        self.tops.lock().remove(&subject);
        Ok(())
    }
}

/// Reads of one stream: direct gets (any server that holds the stream answers, without
/// the stream's lock) on a stream with one replica; the stream leader's answers on a
/// replicated one, where a follower's direct get could be behind what was acknowledged.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    stream: &'a Stream,
    leader: bool,
}

impl Reader<'_> {
    /// The newest message of `subject`, if it has one.
    pub(crate) async fn newest(&self, subject: &str) -> Result<Option<StreamMessage>, BrokerError> {
        if self.leader {
            return match self.stream.get_last_raw_message_by_subject(subject).await {
                Ok(message) => Ok(Some(message)),
                Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
                Err(e) => Err(unavailable(e)),
            };
        }
        match self.stream.direct_get_last_for_subject(subject).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The first message of `subject` at stream sequence `seq` or later, if there is one.
    async fn next_of(&self, subject: &str, seq: u64) -> Result<Option<StreamMessage>, BrokerError> {
        if self.leader {
            let read = self
                .stream
                .raw_message_builder()
                .sequence(seq)
                .next_by_subject(subject)
                .send()
                .await;
            return match read {
                Ok(message) => Ok(Some(message)),
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
                Err(e) => Err(unavailable(e)),
            };
        }
        match self
            .stream
            .direct_get_next_for_subject(subject, Some(seq))
            .await
        {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The message at stream sequence `seq`, if it is still there.
    async fn at(&self, seq: u64) -> Result<Option<StreamMessage>, BrokerError> {
        if self.leader {
            return match self.stream.get_raw_message(seq).await {
                Ok(message) => Ok(Some(message)),
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
                Err(e) => Err(unavailable(e)),
            };
        }
        match self.stream.direct_get(seq).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(unavailable(e)),
        }
    }
}

/// The message of `channel` with offset `from` (or the first after it), found by bisecting
/// stream sequences: offsets of one subject grow with its sequences, and each offset takes
/// at least one sequence, which bounds the search on both sides (a channel alone in its
/// stream is found at once).
async fn find(
    reader: Reader<'_>,
    channel: &ChannelName,
    subject: &str,
    (oldest, first): (&StreamMessage, u64),
    top: &Top,
    from: u64,
) -> Result<Option<StreamMessage>, BrokerError> {
    if from <= first {
        return Ok(Some(oldest.clone()));
    }
    // The smallest sequence whose next message has an offset >= from.
    let mut lo = oldest.sequence + (from - first);
    let mut hi = top.seq - (top.offset - from);
    let mut found = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let probe = reader.next_of(subject, mid).await?;
        match &probe {
            Some(m) if position_of(channel, m)?.0 < from => lo = m.sequence + 1,
            _ => {
                hi = mid;
                found = probe;
            }
        }
    }
    // The last probe that moved `hi` is the answer (hi == lo now); none moved it: read it.
    match found {
        Some(m) => Ok(Some(m)),
        None => reader.next_of(subject, lo).await,
    }
}

/// The publications from `start` (offset `from`) up to offset `to`, in order, stopping at
/// a gap (trimmed meanwhile). Messages Herald did not write are skipped, never handed on.
async fn read_run(
    reader: Reader<'_>,
    channel: &ChannelName,
    subject: &str,
    start: Option<StreamMessage>,
    from: u64,
    to: u64,
) -> Result<Vec<Publication>, BrokerError> {
    let mut run = Vec::with_capacity((to + 1 - from).min(1024) as usize);
    let mut message = start;
    let mut expected = None;
    while let Some(m) = message {
        let (offset, _) = position_of(channel, &m)?;
        if offset > to || expected.is_some_and(|e| e != offset) {
            break;
        }
        expected = Some(offset + 1);
        match stored_record(&m.payload) {
            Ok(record) => run.push(Publication { offset, record }),
            Err(e) => {
                tracing::warn!(%channel, offset, error = %e, "skipping an invalid publication in nats history");
            }
        }
        if offset == to {
            break;
        }
        message = reader.next_of(subject, m.sequence + 1).await?;
    }
    Ok(run)
}

/// A message's offset and epoch, from its headers: checked, since others can write to
/// NATS too.
pub(crate) fn position_of(
    channel: &ChannelName,
    message: &StreamMessage,
) -> Result<(u64, Epoch), BrokerError> {
    let offset = headers_offset(&message.headers).ok_or_else(|| foreign(channel))?;
    Ok((offset, epoch_of(channel, message)?))
}

pub(crate) fn headers_offset(headers: &HeaderMap) -> Option<u64> {
    headers.get(OFFSET)?.as_str().parse().ok()
}

pub(crate) fn headers_epoch(headers: &HeaderMap) -> Option<Epoch> {
    Epoch::checked(headers.get(EPOCH)?.as_str())
}

fn epoch_of(channel: &ChannelName, message: &StreamMessage) -> Result<Epoch, BrokerError> {
    headers_epoch(&message.headers).ok_or_else(|| foreign(channel))
}

fn foreign(channel: &ChannelName) -> BrokerError {
    BrokerError::Unavailable(format!(
        "nats: the stream of {channel} holds a message Herald did not write"
    ))
}

pub(crate) fn new_epoch() -> Epoch {
    Epoch::random(|| fastrand::u64(..))
}

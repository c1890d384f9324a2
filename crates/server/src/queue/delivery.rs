//! A publication as the hub hands it to every subscriber's queue: encoded once, and
//! framed (and compressed) once per kind of socket that writes it. What a protocol of its
//! own makes of it (a front's event, its frame) is kept here once too, in a slot the front
//! registers ([`Encoding`], [`Lane`]): this module knows no protocol (a layout test checks).

use std::{any::Any, sync::OnceLock, time::Instant};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Publication, Push};

/// The codecs a delivery is encoded in (Herald's JSON by the hub, the others when first
/// asked for).
type Codec = herald_protocol::Encoding;
const CODECS: usize = Codec::ALL.len();

/// A publication encoded once by the hub and shared by every subscriber's queue.
#[derive(Debug)]
pub struct Delivery {
    /// The channel.
    pub channel: ChannelName,
    /// The stream epoch the offset belongs to.
    pub epoch: Epoch,
    /// The publication's offset.
    pub offset: u64,
    /// The push in Herald's JSON, one line without the newline: a presence push as the hub
    /// wrote it, a publication's made when a connection first asks for it (see
    /// [`Delivery::json`]), so a channel whose subscribers all speak another protocol never
    /// makes it.
    json: OnceLock<Bytes>,
    /// What it counts for in a queue's bytes: its JSON push's length, or for a publication
    /// not encoded yet, its record's and channel's and the push's own few bytes.
    pub size: usize,
    /// The publication's record (see [`herald_protocol::Publication`]), for the fronts
    /// that encode it their own way; empty for a presence push.
    pub record: Bytes,
    /// What each [`Encoding`] made of the publication, made by the first connection of that
    /// encoding that takes it and shared by the rest.
    encoded: [OnceLock<Box<dyn Any + Send + Sync>>; ENCODINGS],
    /// The push framed for each kind of [`DirectSocket`] (by [`Lane`]), made by the first
    /// one that writes it and shared by the rest.
    pub framed: [OnceLock<Bytes>; LANES],
    /// The same, compressed (permessage-deflate), for the connections that negotiated it.
    deflated: [OnceLock<Bytes>; LANES],
    /// The previous publication's data on the channel, when the hub kept it for
    /// subscriptions that take deltas (see [`Form`]).
    base: Option<Bytes>,
    /// Its other forms and codecs, made when a connection first takes one (boxed: a
    /// publication that only goes plain in Herald's JSON pays one word).
    made: OnceLock<Box<Made>>,
    /// When the hub got it: the start of its delivery latency.
    pub at: Instant,
}

/// How a publication goes to one subscription (see [`crate::queue::Position::form`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Form {
    /// As every subscription that takes no deltas gets it ([`Delivery::json`]).
    Plain,
    /// Its data as text, which the client keeps to apply the next delta to.
    Whole,
    /// The delta from the previous publication's data.
    Delta,
}

/// What a delivery is in the forms and codecs other than Herald's plain JSON, each made
/// once, by the first connection that takes it.
#[derive(Debug, Default)]
struct Made {
    /// The Fossil delta from the previous publication's data, when it is worth sending.
    delta: OnceLock<Option<Bytes>>,
    /// The push per codec and [`Form`] (Herald's plain JSON is [`Delivery::json`]).
    pushes: [[OnceLock<Bytes>; 3]; CODECS],
    /// [`Form::Whole`] and [`Form::Delta`] framed per lane, and compressed.
    framed: [[OnceLock<Bytes>; 2]; LANES],
    deflated: [[OnceLock<Bytes>; 2]; LANES],
}

impl Delivery {
    /// A delivery of an encoded push.
    pub fn new(channel: ChannelName, epoch: Epoch, offset: u64, json: Bytes) -> Self {
        let size = json.len();
        Self::with_json(channel, epoch, offset, OnceLock::from(json), size)
    }

    /// A delivery of its push in Herald's JSON if made already, counted in queues as
    /// `size` bytes.
    fn with_json(
        channel: ChannelName,
        epoch: Epoch,
        offset: u64,
        json: OnceLock<Bytes>,
        size: usize,
    ) -> Self {
        Self {
            channel,
            epoch,
            offset,
            json,
            size,
            record: Bytes::new(),
            encoded: Default::default(),
            framed: Default::default(),
            deflated: Default::default(),
            base: None,
            made: OnceLock::new(),
            at: Instant::now(),
        }
    }

    /// A delivery of `publication`, encoded in each codec when a connection first takes it.
    pub fn of_publication(channel: ChannelName, epoch: Epoch, publication: &Publication) -> Self {
        // `{"pub":{"channel":"","offset":,"data":}}` and an offset's digits.
        const PUSH_BYTES: usize = 48;
        let size = publication.record.len() + channel.as_str().len() + PUSH_BYTES;
        Self::with_json(channel, epoch, publication.offset, OnceLock::new(), size)
            .carrying(publication.record.clone())
    }

    /// Whether its push in Herald's JSON is made yet.
    #[cfg(test)]
    pub fn json_made(&self) -> bool {
        self.json.get().is_some()
    }

    /// Its push in Herald's JSON, made the first time it is asked for.
    pub fn json(&self) -> &Bytes {
        self.json.get_or_init(|| {
            let publication = self.publication();
            let push = Push::Pub {
                channel: &self.channel,
                publication: &publication,
            };
            Codec::Json.codec().push(&push).into()
        })
    }

    /// This delivery, with the previous publication's data on its channel, for deltas.
    pub fn after(mut self, base: Bytes) -> Self {
        self.base = Some(base);
        self
    }

    fn publication(&self) -> Publication {
        Publication {
            offset: self.offset,
            record: self.record.clone(),
        }
    }

    fn made(&self) -> &Made {
        self.made.get_or_init(Box::default)
    }

    /// The delta from the previous publication's data, made the first time it is asked
    /// for; `None` when there is no previous one or the delta is not worth sending.
    pub fn delta(&self) -> Option<&Bytes> {
        let base = self.base.as_ref()?;
        let made = self.made().delta.get_or_init(|| {
            herald_protocol::delta::fossil(base, self.publication().data()).map(Bytes::from)
        });
        made.as_ref()
    }

    /// The push in Herald's protocol (JSON) in `form`, made once.
    pub fn json_as(&self, form: Form) -> &Bytes {
        self.push(Codec::Json, form)
    }

    /// The push in `codec`'s words and `form`, made once for every connection of that
    /// codec. A presence push (offset 0), which the hub writes in Herald's JSON, is said
    /// again in `codec`'s words.
    pub fn push(&self, codec: Codec, form: Form) -> &Bytes {
        if codec == Codec::Json && form == Form::Plain {
            return self.json();
        }
        let slot = &self.made().pushes[codec.index()][form as usize];
        slot.get_or_init(|| {
            if self.offset == 0 {
                return herald_protocol::json::presence_in(codec.codec(), self.json())
                    .unwrap_or_default()
                    .into();
            }
            let publication = self.publication();
            let push = match form {
                Form::Plain => Push::Pub {
                    channel: &self.channel,
                    publication: &publication,
                },
                Form::Whole | Form::Delta => Push::PubDelta {
                    channel: &self.channel,
                    publication: &publication,
                    delta: (form == Form::Delta)
                        .then(|| self.delta())
                        .flatten()
                        .map(|d| &d[..]),
                },
            };
            codec.codec().push(&push).into()
        })
    }

    /// Its publication's conflation key, if it has one (see
    /// [`herald_protocol::Publication::conflation_key`]).
    pub fn conflation_key(&self) -> Option<&[u8]> {
        herald_protocol::conflation_key(&self.record)
    }

    /// This delivery, carrying its publication's record.
    pub fn carrying(mut self, record: Bytes) -> Self {
        self.record = record;
        self
    }

    /// What `encoding` makes of the publication (by `make`, the first time), shared by
    /// every connection of that encoding.
    ///
    /// # Panics
    /// When two encodings share a slot with values of different types (see [`Encoding`]).
    pub fn encoded<T: Any + Send + Sync>(
        &self,
        encoding: Encoding,
        make: impl FnOnce(&Self) -> T,
    ) -> &T {
        let made = self.encoded[encoding.0].get_or_init(|| Box::new(make(self)));
        made.downcast_ref().expect("one type per encoding slot")
    }
}

/// A way of encoding publications of its own (a front's), with a slot in every
/// [`Delivery`] for what it makes of one. Each front registers its own, a slot apiece,
/// beside the others' (`fronts::ENCODINGS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding(usize);

/// How many encodings a delivery has room for.
pub const ENCODINGS: usize = 4;

impl Encoding {
    /// The encoding in slot `slot`, below [`ENCODINGS`].
    pub const fn new(slot: usize) -> Self {
        assert!(slot < ENCODINGS, "an encoding slot past ENCODINGS");
        Self(slot)
    }
}

/// A kind of socket the hub writes to directly, each with its framing of a push: Herald's
/// own four, and those its fronts register (`fronts::LANES`), a slot apiece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane(usize);

impl Lane {
    /// A WebSocket text frame.
    pub const WEBSOCKET: Lane = Lane(0);
    /// An NDJSON line in an HTTP chunk.
    pub const NDJSON: Lane = Lane(1);
    /// An SSE event (id: the channel's position) in an HTTP chunk.
    pub const SSE: Lane = Lane(2);
    /// A WebSocket binary frame of Herald's Protobuf codec.
    pub const WEBSOCKET_PROTOBUF: Lane = Lane(3);

    /// A front's lane, in slot `slot`: past Herald's own four, below [`LANES`].
    pub const fn new(slot: usize) -> Self {
        assert!(
            slot >= 4 && slot < LANES,
            "a lane slot past LANES or one of Herald's own"
        );
        Self(slot)
    }
}

/// How many kinds of [`Lane`] there are room for.
pub const LANES: usize = 9;

impl Delivery {
    /// The delivery framed for `lane`, made by `make` the first time.
    pub fn framed(&self, lane: Lane, make: impl FnOnce(&Self) -> Bytes) -> &Bytes {
        self.framed[lane.0].get_or_init(|| make(self))
    }

    /// The delivery framed and compressed for `lane`, made by `make` the first time.
    pub fn deflated(&self, lane: Lane, make: impl FnOnce(&Self) -> Bytes) -> &Bytes {
        self.deflated[lane.0].get_or_init(|| make(self))
    }

    /// The delivery in `form` framed for `lane`, made by `make` the first time.
    pub fn framed_as(&self, lane: Lane, form: Form, make: impl FnOnce(&Self) -> Bytes) -> &Bytes {
        match form {
            Form::Plain => self.framed(lane, make),
            Form::Whole => self.made().framed[lane.0][0].get_or_init(|| make(self)),
            Form::Delta => self.made().framed[lane.0][1].get_or_init(|| make(self)),
        }
    }

    /// The delivery in `form` framed and compressed for `lane`, made by `make` the first
    /// time.
    pub fn deflated_as(&self, lane: Lane, form: Form, make: impl FnOnce(&Self) -> Bytes) -> &Bytes {
        match form {
            Form::Plain => self.deflated(lane, make),
            Form::Whole => self.made().deflated[lane.0][0].get_or_init(|| make(self)),
            Form::Delta => self.made().deflated[lane.0][1].get_or_init(|| make(self)),
        }
    }
}

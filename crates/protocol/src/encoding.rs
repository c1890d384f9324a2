//! Which codec a connection speaks.

use crate::{
    centrifugo::{Centrifugo, CentrifugoProtobuf},
    codec::Codec,
    json::Json,
    protobuf::Protobuf,
};

/// Which codec a connection speaks. One byte in a session (nothing while there is one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Encoding {
    /// Herald's JSON, one object per line ([`Json`]).
    #[default]
    Json,
    /// Herald's Protobuf ([`Protobuf`]), length-delimited messages in binary frames.
    Protobuf,
    /// Centrifugo's client protocol, JSON ([`Centrifugo`]): the Centrifugo front.
    Centrifugo,
    /// Centrifugo's client protocol, Protobuf ([`CentrifugoProtobuf`]).
    CentrifugoProtobuf,
}

impl Encoding {
    /// Every encoding, in [`Encoding::index`] order.
    pub const ALL: [Encoding; 4] = [
        Encoding::Json,
        Encoding::Protobuf,
        Encoding::Centrifugo,
        Encoding::CentrifugoProtobuf,
    ];

    /// The codec.
    pub fn codec(self) -> &'static dyn Codec {
        match self {
            Encoding::Json => &Json,
            Encoding::Protobuf => &Protobuf,
            Encoding::Centrifugo => &Centrifugo,
            Encoding::CentrifugoProtobuf => &CentrifugoProtobuf,
        }
    }

    /// Its place in [`Encoding::ALL`], for tables kept per encoding.
    pub const fn index(self) -> usize {
        self as usize
    }
}

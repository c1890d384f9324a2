//! Which codec a connection speaks.

use crate::{centrifugo::Centrifugo, codec::Codec, json::Json};

/// Which codec a connection speaks. One byte in a session (nothing while there is one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Encoding {
    /// Herald's JSON, one object per line ([`Json`]).
    #[default]
    Json,
    /// Centrifugo's client protocol, JSON ([`Centrifugo`]): the Centrifugo front.
    Centrifugo,
}

impl Encoding {
    /// Every encoding, in [`Encoding::index`] order.
    pub const ALL: [Encoding; 2] = [Encoding::Json, Encoding::Centrifugo];

    /// The codec.
    pub fn codec(self) -> &'static dyn Codec {
        match self {
            Encoding::Json => &Json,
            Encoding::Centrifugo => &Centrifugo,
        }
    }

    /// Its place in [`Encoding::ALL`], for tables kept per encoding.
    pub const fn index(self) -> usize {
        self as usize
    }
}

//! Which codec a connection speaks.

use crate::{codec::Codec, json::Json};

/// Which codec a connection speaks. One byte in a session (nothing while there is one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Encoding {
    /// JSON, one object per line ([`Json`]).
    #[default]
    Json,
}

impl Encoding {
    /// The codec.
    pub fn codec(self) -> &'static dyn Codec {
        match self {
            Encoding::Json => &Json,
        }
    }
}

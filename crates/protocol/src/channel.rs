use std::{fmt, sync::Arc};

/// Longest channel name accepted, in bytes.
pub const MAX_CHANNEL_LEN: usize = 255;

/// A validated channel name, cheap to clone.
///
/// Names are 1..=255 bytes of `A-Z a-z 0-9 _ - . : @ / = + , ~ !`. The part before the
/// first `:` is the namespace (`chat:lobby` is in namespace `chat`; `lobby` is in the
/// default namespace ""). The character set needs no escaping in JSON, URLs, SSE ids
/// or HTML, which keeps every transport encoder simple and safe.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelName(Arc<str>);

/// Why a string is not a channel name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The name is empty.
    #[error("channel name is empty")]
    Empty,
    /// The name is longer than [`MAX_CHANNEL_LEN`].
    #[error("channel name is longer than {MAX_CHANNEL_LEN} bytes")]
    TooLong,
    /// The name holds a character outside the allowed set.
    #[error("channel name has a character outside A-Z a-z 0-9 _ - . : @ / = + , ~ ! ({0:?})")]
    BadCharacter(char),
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-.:@/=+,~!".contains(c)
}

impl ChannelName {
    /// Checks `name` and wraps it.
    pub fn new(name: &str) -> Result<Self, ChannelError> {
        if name.is_empty() {
            return Err(ChannelError::Empty);
        }
        if name.len() > MAX_CHANNEL_LEN {
            return Err(ChannelError::TooLong);
        }
        if let Some(bad) = name.chars().find(|c| !allowed(*c)) {
            return Err(ChannelError::BadCharacter(bad));
        }
        Ok(Self(Arc::from(name)))
    }

    /// A name outside the alphabet clients may use (such as `$herald:events`), for the
    /// server's own streams: no client and no API call can name it.
    pub fn internal(name: &str) -> Self {
        debug_assert!(Self::new(name).is_err(), "{name} is a name clients can use");
        Self(Arc::from(name))
    }

    /// A name read back from a store: a client's name, or an internal one (`$` then a
    /// client's name).
    pub fn stored(name: &str) -> Result<Self, ChannelError> {
        match name.strip_prefix('$') {
            Some(rest) => Self::new(rest).map(|_| Self(Arc::from(name))),
            None => Self::new(name),
        }
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The namespace: the part before the first `:`, or "" when there is none.
    pub fn namespace(&self) -> &str {
        self.0.split_once(':').map_or("", |(ns, _)| ns)
    }
}

impl fmt::Display for ChannelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ChannelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::str::FromStr for ChannelName {
    type Err = ChannelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl serde::Serialize for ChannelName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for ChannelName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_is_the_part_before_the_first_colon() {
        assert_eq!(
            ChannelName::new("chat:lobby:x").unwrap().namespace(),
            "chat"
        );
        assert_eq!(ChannelName::new("lobby").unwrap().namespace(), "");
        assert_eq!(ChannelName::new(":x").unwrap().namespace(), "");
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!(ChannelName::new(""), Err(ChannelError::Empty));
        assert_eq!(
            ChannelName::new(&"a".repeat(256)),
            Err(ChannelError::TooLong)
        );
        assert_eq!(
            ChannelName::new("a b"),
            Err(ChannelError::BadCharacter(' '))
        );
        assert_eq!(
            ChannelName::new("<x>"),
            Err(ChannelError::BadCharacter('<'))
        );
        assert_eq!(ChannelName::new("é"), Err(ChannelError::BadCharacter('é')));
        assert!(ChannelName::new(&"a".repeat(255)).is_ok());
    }
}

//! Channel patterns a token grants: exact names, or names with `*` standing for any run of
//! characters (`chat:*`, `user:42:*`, `*`).

use herald_protocol::ChannelName;

/// Most patterns one token may carry in each of its grant claims: a token is read at every
/// connect, and each subscribe compares the channel against its patterns.
pub const MAX_PATTERNS: usize = 256;

/// A token's channel patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants(Box<[Box<str>]>);

impl Grants {
    /// Patterns as a token lists them; refuses more than [`MAX_PATTERNS`], and patterns
    /// longer than a channel name may be.
    pub fn new(patterns: Vec<String>) -> Result<Self, String> {
        if patterns.len() > MAX_PATTERNS {
            return Err(format!("more than {MAX_PATTERNS} channel patterns"));
        }
        if let Some(p) = patterns
            .iter()
            .find(|p| p.is_empty() || p.len() > herald_protocol::MAX_CHANNEL_LEN)
        {
            return Err(format!("channel pattern {p:?} is empty or too long"));
        }
        Ok(Self(patterns.into_iter().map(Into::into).collect()))
    }

    /// Whether any pattern matches `channel`.
    pub fn allow(&self, channel: &ChannelName) -> bool {
        self.0
            .iter()
            .any(|p| matches(p.as_bytes(), channel.as_str().as_bytes()))
    }

    /// Whether there are no patterns.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Glob matching with `*` only, in time linear in the pattern times the name at worst
/// (the usual backtrack-to-the-last-star walk; both are bounded by the channel-name limit).
fn matches(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if p < pattern.len() && pattern[p] == name[n] {
            p += 1;
            n += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|b| *b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(patterns: &[&str], channel: &str) -> bool {
        Grants::new(patterns.iter().map(|s| s.to_string()).collect())
            .unwrap()
            .allow(&ChannelName::new(channel).unwrap())
    }

    #[test]
    fn patterns_match_names_and_stars() {
        assert!(allows(&["news"], "news"));
        assert!(!allows(&["news"], "news2"));
        assert!(allows(&["chat:*"], "chat:lobby"));
        assert!(allows(&["chat:*"], "chat:"));
        assert!(!allows(&["chat:*"], "chats:x"));
        assert!(allows(&["*"], "anything:at:all"));
        assert!(allows(&["user:*:inbox"], "user:42:inbox"));
        assert!(!allows(&["user:*:inbox"], "user:42:outbox"));
        assert!(allows(&["a*b*c"], "aXXbYYc"));
        assert!(!allows(&["a*b*c"], "aXXbYY"));
        assert!(!allows(&[], "news"));
    }

    #[test]
    fn too_many_or_empty_patterns_are_refused() {
        assert!(Grants::new(vec!["x".into(); MAX_PATTERNS + 1]).is_err());
        assert!(Grants::new(vec![String::new()]).is_err());
    }
}

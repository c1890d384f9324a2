//! A session's subscriptions: a vector sorted by channel name. Most connections hold one or
//! a few, so a vector costs a fraction of a map's memory per idle connection (a `BTreeMap`
//! node holds room for eleven entries, a `HashMap` for three), finds a channel by binary
//! search without hashing, and iterates in name order, so a cursor lists the same
//! positions the same way every time (a poll's ETag is the cursor's hash).

use std::sync::Arc;

use herald_protocol::ChannelName;

use crate::queue::Position;

#[derive(Debug, Default)]
pub struct Subscriptions(Vec<(ChannelName, Arc<Position>)>);

impl Subscriptions {
    fn find(&self, channel: &ChannelName) -> Result<usize, usize> {
        self.0.binary_search_by(|(c, _)| c.cmp(channel))
    }

    pub fn get(&self, channel: &ChannelName) -> Option<&Arc<Position>> {
        self.find(channel).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, channel: &ChannelName) -> bool {
        self.find(channel).is_ok()
    }

    /// Adds or replaces a channel's position.
    pub fn insert(&mut self, channel: ChannelName, position: Arc<Position>) {
        match self.find(&channel) {
            Ok(i) => self.0[i].1 = position,
            Err(i) => self.0.insert(i, (channel, position)),
        }
    }

    pub fn remove(&mut self, channel: &ChannelName) -> Option<Arc<Position>> {
        let i = self.find(channel).ok()?;
        let (_, position) = self.0.remove(i);
        if self.0.is_empty() {
            self.0 = Vec::new(); // give the allocation back
        }
        Some(position)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Channels in name order.
    pub fn keys(&self) -> impl Iterator<Item = &ChannelName> {
        self.0.iter().map(|(c, _)| c)
    }

    /// Channels and positions in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&ChannelName, &Arc<Position>)> {
        self.0.iter().map(|(c, p)| (c, p))
    }

    /// Empties the set, returning its channels.
    pub fn take_channels(&mut self) -> Vec<ChannelName> {
        std::mem::take(&mut self.0)
            .into_iter()
            .map(|(c, _)| c)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_name_order_and_finds_what_it_holds() {
        let mut s = Subscriptions::default();
        for name in ["b", "a", "c", "a"] {
            s.insert(ChannelName::new(name).unwrap(), Arc::default());
        }
        assert_eq!(
            s.keys().map(|c| c.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        let b = ChannelName::new("b").unwrap();
        assert!(s.contains_key(&b) && s.get(&b).is_some());
        assert!(s.remove(&b).is_some());
        assert!(s.remove(&b).is_none());
        assert_eq!(s.len(), 2);
        assert_eq!(s.take_channels().len(), 2);
        assert!(s.is_empty());
    }
}

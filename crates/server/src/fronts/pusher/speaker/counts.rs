//! Subscription counts (`pusher:subscription_count`): the subscribers of a channel hear
//! how many they are, on every node, when an app counts them (`subscription_count`).
//!
//! A subscription count is a presence count. Each subscription of a channel `NAME` also
//! holds a member of its own (its socket id's) of the app's channel `!subs-NAME`, which
//! no Pusher client can name, and follows it: the store counts the members across the
//! cluster, and the presence push that gathers a window's joins and leaves carries that
//! count (`clients`), which becomes `pusher_internal:subscription_count` on `NAME`. So a
//! count changes at most once per `presence.join_leave_window`, on presence's clock (a
//! subscriber that unsubscribes or closes its tab at once, a dropped connection after
//! `presence.grace`), and nothing is stored. Presence channels count members instead, as
//! Pusher's do.

use herald_protocol::{
    pusher::{self, Kind, SUBSCRIPTIONS_CHANNEL_INSIDE},
    ChannelName,
};

use super::Pusher;
use crate::{fronts::members::Changes, queue::Delivery, session::GrantedMember};

impl Pusher {
    /// Counts the connection in the subscriptions of `channel` (Pusher channel `name`),
    /// when its app counts them.
    pub(super) async fn count_in_subscriptions(&mut self, channel: &ChannelName, name: &str) {
        if !self.app().subscription_count
            || !matches!(
                Kind::of(name),
                Kind::Public | Kind::Private | Kind::Encrypted
            )
        {
            return;
        }
        let Some(count) = subscriptions_of(channel) else {
            return;
        };
        let member = GrantedMember {
            user: self.socket_id.to_string().into(),
            info: bytes::Bytes::from_static(b"null"),
            typed_id: None,
        };
        self.session.grant_channel(count.clone(), Some(member));
        if let Err(f) = self.session.open(&count, None, None).await {
            tracing::warn!(%channel, error = %f.message, "pusher: could not count a subscription");
        }
    }

    /// Counts the connection out of `channel`'s subscriptions.
    pub(super) async fn count_out_of_subscriptions(&mut self, channel: &ChannelName) {
        if let Some(count) = subscriptions_of(channel) {
            self.session.close(&count).await;
        }
    }
}

/// The channel counting `channel`'s subscriptions; none for a name too long to have one.
fn subscriptions_of(channel: &ChannelName) -> Option<ChannelName> {
    let (namespace, name) = channel.as_str().split_once(':')?;
    ChannelName::new(&format!("{namespace}:{SUBSCRIPTIONS_CHANNEL_INSIDE}{name}")).ok()
}

/// The Pusher channel whose subscriptions `count` counts, if it is such a count.
pub(super) fn counted(count: &ChannelName) -> Option<&str> {
    let (_, name) = count.as_str().split_once(':')?;
    name.strip_prefix(SUBSCRIPTIONS_CHANNEL_INSIDE)
}

/// One of the hub's presence pushes `d` on a count of subscriptions, as
/// `pusher_internal:subscription_count` on the channel counted: made once for every
/// subscriber (the push lists who joined and left, which none of them needs).
pub(super) fn changed(d: &Delivery) -> Option<&[u8]> {
    let made = d.encoded(crate::fronts::slots::PUSHER_COUNT, |d| {
        let name = counted(&d.channel)?;
        let n = Changes::of(d.json()).and_then(|c| c.clients);
        if n.is_none() {
            tracing::warn!(channel = %d.channel, "a count's presence push without its count");
        }
        Some(pusher::subscription_count(name, n?))
    });
    made.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channels_count_is_hidden_and_names_it_back() {
        let channel = ChannelName::new("1001:private-orders").unwrap();
        let count = subscriptions_of(&channel).unwrap();
        assert_eq!(count.as_str(), "1001:!subs-private-orders");
        assert!(pusher::hidden("!subs-private-orders"));
        assert_eq!(counted(&count), Some("private-orders"));
        assert_eq!(counted(&channel), None);
    }
}

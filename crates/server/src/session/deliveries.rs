//! What a session hands its transport: queued publications checked against each
//! subscription's position (duplicates skipped, a gap or an epoch change refused), an
//! operator's orders, and the positions as a cursor.

use std::sync::Arc;

use herald_protocol::{ChannelName, DisconnectCode, ErrorCode, Push};

use super::{subscriptions::Subscriptions, Session};
use crate::{
    error::Disconnect,
    queue::{Delivery, Form, Step},
};

impl Session {
    /// Moves queued publications into `out` (one JSON line each, about `max_bytes` at
    /// most), skipping duplicates. Fails when the queue overflowed or a gap appeared.
    pub fn write_deliveries(
        &mut self,
        out: &mut Vec<u8>,
        max_bytes: usize,
    ) -> Result<(), Disconnect> {
        let codec = self.codec();
        self.drain(max_bytes, |push, _, _| codec.join(out, push))
    }

    /// Takes queued publications (about `max_bytes`), skips duplicates, and calls `emit`
    /// with each publication's encoded push, the delivery it carries (none for a notice),
    /// and the session's positions right after it. Fails when the queue overflowed or a
    /// publication is missing.
    pub fn drain(
        &mut self,
        max_bytes: usize,
        mut emit: impl FnMut(&[u8], Option<&Delivery>, Positions<'_>),
    ) -> Result<(), Disconnect> {
        let encoding = self.encoding;
        self.drain_in_forms(max_bytes, |drained, form, at| match drained {
            // A codec may have no words for a push (Centrifugo's for a presence push
            // without joins or leaves, which says only a count): nothing is sent.
            Drained::Delivery(d) => {
                let push = d.push(encoding, form);
                if !push.is_empty() {
                    emit(push, Some(d), at)
                }
            }
            Drained::Notice(push) | Drained::Unsubscribed(_, push) => emit(push, None, at),
        })
    }

    /// [`Session::drain`], handing over each delivery itself, for a front that writes
    /// publications in its own words.
    pub fn drain_deliveries(
        &mut self,
        max_bytes: usize,
        mut emit: impl FnMut(Drained<'_>, Positions<'_>),
    ) -> Result<(), Disconnect> {
        self.drain_in_forms(max_bytes, |drained, _, at| emit(drained, at))
    }

    /// [`Session::drain_deliveries`], with the form each publication goes in to its
    /// subscription (a delta, where it asked for them).
    fn drain_in_forms(
        &mut self,
        max_bytes: usize,
        mut emit: impl FnMut(Drained<'_>, Form, Positions<'_>),
    ) -> Result<(), Disconnect> {
        self.obey(&mut |channel, push, at| {
            emit(Drained::Unsubscribed(channel, push), Form::Plain, at)
        })?;
        // The batch's vector is the thread's, reused: a session keeps none of its own.
        let mut batch = SCRATCH.with_borrow_mut(std::mem::take);
        let result = match self.queue.take(max_bytes, &mut batch) {
            Err(_) => Err(Disconnect::because(
                DisconnectCode::Slow,
                "client did not read fast enough; reconnect and resume",
            )),
            Ok(()) => batch.drain(..).try_for_each(|d| {
                let Some((form, skipped)) = self.advance(&d)? else {
                    return Ok(());
                };
                if skipped {
                    // Told at the position it skips to (an SSE event's id), then moved
                    // over the publication.
                    let push = self.codec().push(&Push::Conflated {
                        channel: &d.channel,
                        offset: d.offset - 1,
                    });
                    emit(
                        Drained::Notice(&push),
                        Form::Plain,
                        Positions(&self.subscriptions),
                    );
                    if let Some(position) = self.subscriptions.get(&d.channel) {
                        position.sent(&d);
                    }
                }
                emit(Drained::Delivery(&d), form, Positions(&self.subscriptions));
                Ok(())
            }),
        };
        batch.clear();
        SCRATCH.with_borrow_mut(|scratch| {
            if batch.capacity() > scratch.capacity() {
                *scratch = batch;
            }
        });
        result
    }

    /// Moves a subscription's position over a delivery, and says in which form it goes;
    /// `None` for duplicates and publications of channels no longer subscribed. `true`
    /// with it when the publications before it were replaced (see
    /// [`crate::queue::Position::conflates`]): the position is then moved only to the one
    /// before it, for the caller to tell the client so first.
    fn advance(&mut self, d: &Delivery) -> Result<Option<(Form, bool)>, Disconnect> {
        let Some(position) = self.subscriptions.get(&d.channel) else {
            return Ok(None);
        };
        if d.offset == 0 {
            // A presence push: no offset, nothing to check or move.
            return Ok(Some((Form::Plain, false)));
        }
        match position.step(d) {
            Step::Next => {
                let form = position.form(d);
                position.sent(d);
                Ok(Some((form, false)))
            }
            Step::Duplicate => Ok(None),
            // Offsets missing in the same epoch: none lost if each was replaced by a later
            // publication of its conflation key while it waited.
            Step::Broken(_)
                if position.conflates()
                    && position.get().is_some_and(|(epoch, offset)| {
                        *epoch == d.epoch && self.queue.superseded(&d.channel, offset, d.offset)
                    }) =>
            {
                position.skip_to(d.offset - 1);
                Ok(Some((position.form(d), true)))
            }
            Step::Broken(why) => Err(insufficient(&d.channel, why)),
            Step::Unset => unreachable!("a session's subscriptions have started positions"),
        }
    }

    /// Every subscription's position.
    pub fn positions(&self) -> Positions<'_> {
        Positions(&self.subscriptions)
    }

    /// Whether a request for `channels` continues this session exactly: the same channels
    /// (those its token subscribes it to may go unnamed), each from the session's position.
    /// (A parked long-poll's session is taken up only then.)
    pub fn continued_by(&self, channels: &[(ChannelName, Option<herald_protocol::Since>)]) -> bool {
        let granted: &[ChannelName] = self.identity().map_or(&[], |i| &i.channels);
        let named_here =
            |c: &ChannelName| channels.iter().any(|(n, _)| n == c) || granted.contains(c);
        self.subscriptions.keys().all(named_here)
            && channels.iter().all(|(channel, since)| {
                let Some(position) = self.subscriptions.get(channel) else {
                    return false;
                };
                match (position.get(), since) {
                    (Some((epoch, offset)), Some(since)) => {
                        since.epoch.as_ref() == Some(epoch) && offset == since.offset
                    }
                    (None, None) => true,
                    _ => false,
                }
            })
    }

    /// How many channels it is subscribed to.
    pub fn subscription_count(&self) -> usize {
        self.subscriptions.len()
    }

    pub(super) fn set_offset(&mut self, channel: &ChannelName, offset: u64) {
        if let Some(p) = self.subscriptions.get(channel) {
            p.set(offset);
        }
    }

    /// Carries out what an operator ordered (see [`crate::admin`]): subscriptions ended
    /// with an `unsubscribe` push (code 120) through `emit`, or the connection's end.
    fn obey(
        &mut self,
        emit: &mut dyn FnMut(&ChannelName, &[u8], Positions<'_>),
    ) -> Result<(), Disconnect> {
        let Some(orders) = self.queue.take_orders() else {
            return Ok(());
        };
        for channel in orders.unsubscribe {
            let Some(position) = self.subscriptions.remove(&channel) else {
                continue;
            };
            self.queue.forget_superseded(&channel);
            // Until the hub lets go (in the background), the direct lane would still
            // write the channel's publications: past the last offset, each is a duplicate.
            position.set(u64::MAX);
            self.event("unsubscribe", Some(&channel), None);
            self.drop_grant(&channel);
            self.leave_later(vec![channel.clone()], std::time::Duration::ZERO);
            let push = self.codec().push(&Push::Unsubscribe {
                channel: &channel,
                code: ErrorCode::Unsubscribed,
                reason: "unsubscribed by the server",
            });
            emit(&channel, &push, Positions(&self.subscriptions));
        }
        orders.end.map_or(Ok(()), Err)
    }
}

/// What [`Session::drain_deliveries`] hands over.
#[derive(Debug, Clone, Copy)]
pub enum Drained<'a> {
    /// A publication in order (or a presence change: offset 0).
    Delivery(&'a Delivery),
    /// A push of the session's own, in Herald's protocol (a conflated run skipped).
    Notice(&'a [u8]),
    /// An operator unsubscribed the session from the channel (its push in Herald's
    /// protocol): a front says it in its own words.
    Unsubscribed(&'a ChannelName, &'a [u8]),
}

thread_local! {
    /// The vector `Session::drain` takes a batch into, one per thread.
    static SCRATCH: std::cell::RefCell<Vec<Arc<Delivery>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A view of a session's positions, encodable as a [`Cursor`](herald_protocol::Cursor).
#[derive(Debug, Clone, Copy)]
pub struct Positions<'a>(&'a Subscriptions);

impl Positions<'_> {
    /// The cursor string: `CHANNEL;EPOCH;OFFSET|…`.
    pub fn cursor(&self) -> String {
        // Room for the usual one entry: made once per long-poll answer.
        let mut out = String::with_capacity(64);
        for (channel, p) in self.0.iter() {
            if let Some((epoch, offset)) = p.get() {
                herald_protocol::cursor::write_entry(&mut out, channel, epoch, offset);
            }
        }
        out
    }
}

pub(super) fn insufficient(channel: &ChannelName, why: &str) -> Disconnect {
    Disconnect::because(
        DisconnectCode::InsufficientState,
        format!("{channel}: {why}; reconnect and resume"),
    )
}

//! A request as the driver sees it ([`Wire`]), for every transport made of requests
//! (Herald's long-poll, the Phoenix front's): what it pushes is collected into the
//! request's answer, in the transport's form ([`Collect`]), and it is done as soon as it
//! has something to say, or its hold is over.

use std::{future::Future, pin::Pin, time::Duration};

use tokio::time::Instant;

use super::item;
use crate::{
    error::Disconnect,
    queue::Delivery,
    session::Positions,
    transport::driver::{Heard, Unwritten, Wire},
};

/// What a request's answer collects, in its transport's form.
pub trait Collect: Send {
    /// Adds one push; false when it does not fit (the session then ends).
    fn add(&mut self, push: &[u8]) -> bool;

    /// Whether nothing is collected yet.
    fn is_empty(&self) -> bool;
}

/// Herald's long-poll: pushes comma-separated, as the answer's `messages` carries them
/// (bounded by the answer, not here).
impl Collect for Vec<u8> {
    fn add(&mut self, push: &[u8]) -> bool {
        item(self, push);
        true
    }

    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
}

/// A request held until `until`, collecting into `answer`; `left` resolves if its client
/// leaves meanwhile (where the connection can tell: Herald's long-poll on the lean path).
pub struct Answering<'a, C, F> {
    answer: &'a mut C,
    until: Instant,
    left: Pin<&'a mut F>,
    /// A push did not fit the answer: the session ends.
    pub overflowed: bool,
}

impl<'a, C: Collect, F: Future<Output = ()> + Send> Answering<'a, C, F> {
    pub fn new(answer: &'a mut C, until: Instant, left: Pin<&'a mut F>) -> Self {
        Self {
            answer,
            until,
            left,
            overflowed: false,
        }
    }
}

impl<C: Collect, F: Future<Output = ()> + Send> Wire for Answering<'_, C, F> {
    fn push(&mut self, json: &[u8], _: Option<&Delivery>, _: Positions<'_>, _: &mut Vec<u8>) {
        if !self.answer.add(json) {
            self.overflowed = true;
        }
    }

    /// Everything went into the answer as it was pushed.
    fn send(
        &mut self,
        _bytes: Vec<u8>,
        _timeout: Duration,
    ) -> impl Future<Output = Result<(), Unwritten>> + Send {
        std::future::ready(Ok(()))
    }

    /// A request's client says nothing on it, but may leave; what was collected before the
    /// request came (a Phoenix `POST`'s replies) is answered at once, as if heard.
    fn heard(&mut self) -> impl Future<Output = Heard> + Send {
        let waiting = !self.answer.is_empty();
        let left = self.left.as_mut();
        async move {
            if waiting {
                return Heard::Alive;
            }
            left.await;
            Heard::Left
        }
    }

    /// A request has no keepalive of its own: its answer is the next thing it says.
    fn keepalive(
        &mut self,
        _timeout: Duration,
    ) -> impl Future<Output = Result<(), Unwritten>> + Send {
        std::future::ready(Ok(()))
    }

    fn bounds(&self) -> (usize, Option<Instant>) {
        (usize::MAX, Some(self.until))
    }

    fn is_request(&self) -> bool {
        true
    }

    fn answered(&self) -> bool {
        !self.answer.is_empty() || self.overflowed
    }

    fn farewell(self, _ended: Option<Disconnect>) -> impl Future<Output = bool> + Send {
        // A request's session ends in its answer, which its transport writes.
        std::future::ready(false)
    }
}

//! A held long-poll as the driver sees it ([`Wire`]): what it pushes are the items of the
//! request's answer, and it is done as soon as it has one (or its hold is over).

use std::{future::Future, pin::Pin, time::Duration};

use tokio::time::Instant;

use super::item;
use crate::{
    error::Disconnect,
    queue::Delivery,
    session::Positions,
    transport::driver::{Heard, Unwritten, Wire},
};

/// The answer of a long-poll held until `until`; `left` resolves if its client leaves
/// meanwhile (where the connection can tell: on the lean path).
pub struct Answering<'a, F> {
    /// Pushes, comma-separated, as the answer's `messages` carries them.
    pub messages: &'a mut Vec<u8>,
    pub until: Instant,
    pub left: Pin<&'a mut F>,
}

impl<F: Future<Output = ()> + Send> Wire for Answering<'_, F> {
    fn push(&mut self, json: &[u8], _: Option<&Delivery>, _: Positions<'_>, out: &mut Vec<u8>) {
        item(out, json);
    }

    fn send(
        &mut self,
        bytes: Vec<u8>,
        _timeout: Duration,
    ) -> impl Future<Output = Result<(), Unwritten>> + Send {
        if !bytes.is_empty() {
            item(self.messages, &bytes);
        }
        std::future::ready(Ok(()))
    }

    fn heard(&mut self) -> impl Future<Output = Heard> + Send {
        let left = self.left.as_mut();
        async move {
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
        !self.messages.is_empty()
    }

    fn farewell(self, _ended: Option<Disconnect>) -> impl Future<Output = bool> + Send {
        // A request's session ends in its answer (see `super::compose`).
        std::future::ready(false)
    }
}

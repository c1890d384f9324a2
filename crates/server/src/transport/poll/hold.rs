//! How a poll with nothing to say waits: the same for every polling transport (Herald's
//! long-poll, the Phoenix front's), and what expires while it waits is ended by its
//! speaker's [`Speaker::expire`], the path the driver's connections take too.
//! (Herald's long-poll on the lean path waits on its socket as well: see [`super::lane`].)

use std::future::Future;

use tokio::time::Instant;

use crate::{error::Disconnect, queue::Queue, session::ExpiryTimer, transport::driver::Speaker};

/// What ended a poll's wait.
#[derive(Debug, PartialEq, Eq)]
pub enum Waited {
    /// Something is queued for it.
    Queued,
    /// Its hold is over (or what the caller also waits for came).
    Over,
    /// Something its tokens granted expired: see [`expired`].
    Expired,
}

/// Waits until something is queued on `queue`, `until` passes, `also` resolves, or
/// `expiry` (following the session's tokens) fires. A wake-up left over from before the
/// last answer finds nothing queued and is waited past.
pub async fn wait(
    queue: &Queue,
    expiry: &mut ExpiryTimer,
    until: Instant,
    also: impl Future,
) -> Waited {
    let mut also = std::pin::pin!(also);
    loop {
        tokio::select! {
            _ = queue.ready() => if queue.has_work() {
                return Waited::Queued;
            },
            () = tokio::time::sleep_until(until) => return Waited::Over,
            _ = &mut also => return Waited::Over,
            () = expiry.wait() => return Waited::Expired,
        }
    }
}

/// What a wait that ended [`Waited::Expired`] comes to: `Err` when the session ended (its
/// connection token), `Ok(None)` when the refresh hook extended it (wait on), otherwise
/// what to tell the client, in its speaker's words, of the subscriptions that ended.
pub async fn expired<S: Speaker>(speaker: &mut S) -> Result<Option<Vec<Vec<u8>>>, Disconnect> {
    let expiring = Box::pin(speaker.expire());
    let told = expiring.await?;
    // Nothing to tell, yet something was due: the hook refreshed it, or a subscription
    // the client had already left expired.
    Ok((!told.is_empty()).then_some(told))
}

//! What a session held outside the driver does when something its tokens granted expires:
//! Herald's long-poll held on its socket for the hub to answer ([`super::lane`]), and a
//! Phoenix long-poll `POST` that finds no `GET` holding its session. The same path as
//! every transport's: its speaker's [`Speaker::expire`].

use crate::{error::Disconnect, transport::driver::Speaker};

/// What an expiry comes to: `Err` when the session ended (its connection token),
/// `Ok(None)` when the refresh hook extended it (wait on), otherwise what to tell the
/// client, in its speaker's words, of the subscriptions that ended.
pub async fn expired<S: Speaker>(speaker: &mut S) -> Result<Option<Vec<Vec<u8>>>, Disconnect> {
    let expiring = Box::pin(speaker.expire());
    let told = expiring.await?;
    // Nothing to tell, yet something was due: the hook refreshed it, or a subscription
    // the client had already left expired.
    Ok((!told.is_empty()).then_some(told))
}

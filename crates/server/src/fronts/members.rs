//! Herald's presence members as the fronts read them: a page's member records and the
//! join and leave pushes the hub queues, turned by each front into its own words (Pusher's
//! member events, Phoenix's presence diffs).

use serde::Deserialize;
use serde_json::value::RawValue;

/// A member as Herald writes it: `{"client"?, "user"?, "info"?}` (`client`, its id, is in
/// pushes; a page gives the id apart).
#[derive(Deserialize)]
pub struct Member<'a> {
    #[serde(default)]
    pub client: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default, borrow)]
    pub info: Option<&'a RawValue>,
    /// The user's id as its client wrote it, when not a string (a Pusher `user_id` number).
    #[serde(default, borrow)]
    pub user_id: Option<&'a RawValue>,
    /// Its info in this channel (a subscription token's or the subscribe hook's `info`).
    #[serde(default, borrow)]
    pub channel_info: Option<&'a RawValue>,
}

impl<'a> Member<'a> {
    /// A page's member record (`herald_broker::Member::info`), if it reads as one.
    pub fn of(record: &'a [u8]) -> Option<Self> {
        serde_json::from_slice(record).ok()
    }
}

/// Who joined and who left, from one presence push.
#[derive(Deserialize)]
pub struct Changes<'a> {
    #[serde(borrow)]
    pub join: Vec<Member<'a>>,
    #[serde(borrow)]
    pub leave: Vec<Member<'a>>,
    /// How many members the channel has with these changes.
    #[serde(default)]
    pub clients: Option<u64>,
}

impl<'a> Changes<'a> {
    /// The changes a presence push (`{"presence": {…}}`) carries, if it reads as one.
    pub fn of(push: &'a [u8]) -> Option<Self> {
        #[derive(Deserialize)]
        struct Push<'a> {
            #[serde(borrow)]
            presence: Changes<'a>,
        }
        serde_json::from_slice::<Push>(push)
            .ok()
            .map(|p| p.presence)
    }
}

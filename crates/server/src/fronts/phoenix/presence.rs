//! Phoenix Presence over Herald's presence: `presence_state` when a topic is joined, and
//! `presence_diff` for each of Herald's join and leave pushes, keyed as phoenix.js's
//! `Presence` keys them: by user (a member without a user by its member id), one meta per
//! connection (`phx_ref`: the member's id), whose other fields are the app's metas: the
//! member's `info` (from its token or the connect hook) and its `channel_info` (from the
//! subscribe hook or a subscription token: per topic, as `Presence.track` in a join).

use std::collections::HashMap;

use herald_protocol::ChannelName;
use serde_json::{json, value::RawValue, Map, Value};

use crate::fronts::members::{Changes, Member};

/// One joined topic's members, as a connection follows them: each member's key.
#[derive(Debug)]
pub struct Tracked {
    pub channel: ChannelName,
    keys: HashMap<String, String>,
}

impl Tracked {
    /// The state of `channel` with `members` in it (`presence_state`'s payload).
    pub fn start(channel: ChannelName, members: &[herald_broker::Member]) -> (Self, Value) {
        let mut tracked = Self {
            channel,
            keys: HashMap::new(),
        };
        let mut state = Map::new();
        for m in members {
            let id = format!("{:016x}", m.id);
            let parsed = Member::of(&m.info);
            let (key, meta) = tracked.add(&id, parsed.as_ref());
            push_meta(&mut state, key, meta);
        }
        (tracked, Value::Object(state))
    }

    fn add(&mut self, id: &str, m: Option<&Member>) -> (String, Value) {
        let key = m
            .and_then(|m| m.user.clone())
            .unwrap_or_else(|| id.to_owned());
        self.keys.insert(id.to_owned(), key.clone());
        let read = |raw: Option<&RawValue>| -> Value {
            serde_json::from_str(raw.map_or("null", RawValue::get)).unwrap_or(Value::Null)
        };
        // The app's own metas, as `Presence.track(socket, key, metas)` gives them: the
        // member's info (from its token or the connect hook), then its info in this topic
        // (from the subscribe hook or a subscription token), beside the `phx_ref` Phoenix
        // reserves.
        let mut meta = Map::new();
        for (name, value) in [
            ("info", read(m.and_then(|m| m.info))),
            ("channel_info", read(m.and_then(|m| m.channel_info))),
        ] {
            match value {
                Value::Object(fields) => meta.extend(fields),
                Value::Null => {}
                other => {
                    meta.insert(name.into(), other);
                }
            }
        }
        meta.insert("phx_ref".into(), id.into());
        (key, Value::Object(meta))
    }

    /// `presence_diff`'s payload for one of Herald's presence pushes, if it changes
    /// anything this connection follows.
    pub fn diff(&mut self, push: &[u8]) -> Option<Value> {
        let changes = Changes::of(push)?;
        let (mut joins, mut leaves) = (Map::new(), Map::new());
        for m in &changes.join {
            let Some(id) = m.client.as_deref() else {
                continue;
            };
            if self.keys.contains_key(id) {
                continue;
            }
            let (key, meta) = self.add(id, Some(m));
            push_meta(&mut joins, key, meta);
        }
        for m in &changes.leave {
            let Some(id) = m.client.as_deref() else {
                continue;
            };
            let Some(key) = self.keys.remove(id) else {
                continue;
            };
            push_meta(&mut leaves, key, json!({ "phx_ref": id }));
        }
        if joins.is_empty() && leaves.is_empty() {
            return None;
        }
        Some(json!({ "joins": joins, "leaves": leaves }))
    }
}

fn push_meta(into: &mut Map<String, Value>, key: String, meta: Value) {
    let entry = into.entry(key).or_insert_with(|| json!({ "metas": [] }));
    if let Some(metas) = entry["metas"].as_array_mut() {
        metas.push(meta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_by_user_with_a_meta_per_connection() {
        let channel = ChannelName::new("chat:a").unwrap();
        let member = |id, info: &str| herald_broker::Member {
            id,
            info: bytes::Bytes::copy_from_slice(info.as_bytes()),
        };
        let (mut t, state) = Tracked::start(
            channel,
            &[
                member(1, r#"{"user":"ann","info":{"n":1}}"#),
                member(
                    2,
                    r#"{"user":"ann","info":{"n":2},"channel_info":{"typing":true}}"#,
                ),
                member(4, r#"{"channel_info":"guest"}"#),
            ],
        );
        assert_eq!(state["ann"]["metas"].as_array().unwrap().len(), 2);
        assert_eq!(
            state["ann"]["metas"][0],
            json!({ "n": 1, "phx_ref": "0000000000000001" }),
            "the app's metas"
        );
        assert_eq!(
            state["ann"]["metas"][1],
            json!({ "n": 2, "typing": true, "phx_ref": "0000000000000002" }),
            "the connection's metas in this topic beside its own"
        );
        assert_eq!(
            state["0000000000000004"]["metas"][0],
            json!({ "channel_info": "guest", "phx_ref": "0000000000000004" }),
            "an anonymous member's, not an object"
        );
        let diff = t
            .diff(br#"{"presence":{"channel":"chat:a","join":[{"client":"0000000000000003","user":"bob"}],"leave":[{"client":"0000000000000001"}]}}"#)
            .unwrap();
        assert_eq!(
            diff["joins"]["bob"]["metas"][0]["phx_ref"],
            "0000000000000003"
        );
        assert_eq!(
            diff["leaves"]["ann"]["metas"][0]["phx_ref"],
            "0000000000000001"
        );
        // A member already known joins again: nothing to say.
        assert!(t
            .diff(br#"{"presence":{"channel":"chat:a","join":[{"client":"0000000000000002","user":"ann"}],"leave":[]}}"#)
            .is_none());
    }
}

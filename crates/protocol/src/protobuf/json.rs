//! A Protobuf server message written as the JSON codec writes the same message, key for
//! key and in its order: what `herald sub` prints and the bench's clients read, and how
//! the golden test holds the two codecs to one meaning.

use super::wire::{self, Body};

/// A JSON object being written: `{"key":value,…}`.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Object<'a> {
    fn open(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Object { out, first: true }
    }

    fn key(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        string(self.out, key);
        self.out.push(b':');
        self.out
    }

    fn raw(&mut self, key: &str, json: &[u8]) {
        self.key(key).extend_from_slice(json);
    }

    fn text(&mut self, key: &str, text: &str) {
        string(self.key(key), text);
    }

    fn number(&mut self, key: &str, n: u64) {
        let mut digits = itoa::Buffer::new();
        self.key(key).extend_from_slice(digits.format(n).as_bytes());
    }

    fn boolean(&mut self, key: &str, b: bool) {
        self.raw(key, if b { b"true" } else { b"false" });
    }

    fn object(&mut self, key: &str, write: impl FnOnce(&mut Object<'_>)) {
        let out = self.key(key);
        let mut inner = Object::open(out);
        write(&mut inner);
        inner.close();
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

fn string(out: &mut Vec<u8>, text: &str) {
    serde_json::to_writer(out, text).expect("strings serialise");
}

/// The message as the JSON codec writes it.
pub(super) fn of(message: wire::ServerMessage) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    let mut o = Object::open(&mut out);
    if let Some(id) = message.id {
        o.number("id", id);
    }
    match message.body {
        None => {}
        Some(Body::Error(e)) => o.object("error", |o| {
            o.number("code", e.code.into());
            o.text("message", &e.message);
            if let Some(c) = &e.channel {
                o.text("channel", c);
            }
        }),
        Some(Body::Connect(c)) => o.object("connect", |o| {
            o.text("client", &c.client);
            o.text("version", &c.version);
            o.number("ping", c.ping);
            if let Some(u) = &c.user {
                o.text("user", u);
            }
            expiry(o, c.expires, c.ttl);
        }),
        Some(Body::Subscribe(s)) => o.object("subscribe", |o| stream(o, s)),
        Some(Body::History(s)) => o.object("history", |o| stream(o, s)),
        Some(Body::Unsubscribe(u)) => o.object("unsubscribe", |o| {
            if let Some(c) = &u.channel {
                o.text("channel", c);
            }
            if let Some(code) = u.code {
                o.number("code", code.into());
            }
            if let Some(r) = &u.reason {
                o.text("reason", r);
            }
        }),
        Some(Body::Publish(p)) => o.object("publish", |o| {
            o.number("offset", p.offset);
            o.text("epoch", &p.epoch);
            if p.repeat == Some(true) {
                o.boolean("repeat", true);
            }
        }),
        Some(Body::Refresh(e)) => o.object("refresh", |o| expiry(o, e.expires, e.ttl)),
        Some(Body::Rpc(r)) => o.object("rpc", |o| o.raw("data", &r.data)),
        Some(Body::Presence(p)) => o.object("presence", |o| {
            if let Some(c) = &p.channel {
                // The push: who joined and left.
                o.text("channel", c);
                members(o, "join", &p.join);
                members(o, "leave", &p.leave);
                if p.missed == Some(true) {
                    o.boolean("missed", true);
                }
                if let Some(n) = p.clients {
                    o.number("clients", n);
                }
            } else {
                members(o, "members", &p.members);
                if let Some(c) = &p.cursor {
                    o.text("cursor", c);
                }
            }
        }),
        Some(Body::PresenceStats(s)) => o.object("presence_stats", |o| {
            o.number("clients", s.clients);
            o.number("users", s.users);
        }),
        Some(Body::Ping(_)) => o.raw("ping", b"{}"),
        Some(Body::Pub(p)) => o.object("pub", |o| {
            o.text("channel", &p.channel);
            o.number("offset", p.offset);
            if let Some(d) = &p.data {
                o.raw("data", d);
            }
            if let Some(f) = &p.full {
                o.text("full", &String::from_utf8_lossy(f));
            }
            if let Some(d) = &p.delta {
                o.text("delta", &String::from_utf8_lossy(d));
            }
            if let Some(f) = &p.from {
                o.raw("from", f);
            }
        }),
        Some(Body::Disconnect(d)) => o.object("disconnect", |o| {
            o.number("code", d.code.into());
            o.text("reason", &d.reason);
            o.boolean("reconnect", d.reconnect);
        }),
        Some(Body::Conflated(c)) => o.object("conflated", |o| {
            o.text("channel", &c.channel);
            o.number("offset", c.offset);
        }),
    }
    o.close();
    out
}

fn expiry(o: &mut Object<'_>, expires: Option<u64>, ttl: Option<u64>) {
    if let Some(e) = expires {
        o.number("expires", e);
    }
    if let Some(t) = ttl {
        o.number("ttl", t);
    }
}

fn stream(o: &mut Object<'_>, s: wire::Stream) {
    if let Some(c) = &s.channel {
        o.text("channel", c);
    }
    o.text("epoch", &s.epoch);
    o.number("offset", s.offset);
    if let Some(r) = s.recovered {
        o.boolean("recovered", r);
    }
    if !s.publications.is_empty() {
        let out = o.key("publications");
        out.push(b'[');
        for (i, p) in s.publications.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let mut po = Object::open(out);
            po.number("offset", p.offset);
            po.raw("data", &p.data);
            if let Some(f) = &p.from {
                po.raw("from", f);
            }
            po.close();
        }
        out.push(b']');
    }
    if let Some(d) = &s.data {
        o.raw("data", d);
    }
    if let Some(d) = &s.delta {
        o.text("delta", d);
    }
}

/// Members as the JSON codec writes them: `{"client":ID,…its other fields}`.
fn members(o: &mut Object<'_>, key: &str, list: &[wire::Member]) {
    let out = o.key(key);
    out.push(b'[');
    for (i, m) in list.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"client\":");
        string(out, &m.client);
        match m.fields.as_deref().and_then(|f| f.strip_prefix(b"{")) {
            Some(rest) if rest.len() > 1 => {
                out.push(b',');
                out.extend_from_slice(rest);
            }
            _ => out.push(b'}'),
        }
    }
    out.push(b']');
}

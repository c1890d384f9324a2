//! A Pusher client that reconnects gets what it missed, when its page opts in.
//!
//! `pusher-js` sends no position when it subscribes again, so the page opts in with its
//! socket's path, `wsPath: "/resume/" + id` (an id it makes once per page load, 16 to 64 of
//! `A-Z a-z 0-9 - _`, which routes it back to the same node), and proves who it is with a
//! secret: each connection of such a page is sent `herald:page` with a proof (128 random
//! bits) right after `connection_established`, and the page's next connection sends it back
//! (`herald:resume`) before anything else, which pusher-js lets a page do from its
//! `state_change` to `connected` (emitted before pusher-js subscribes again). Herald keeps,
//! by app and proof, where each of the connection's channels stood when it ended, for the
//! app's `resume_window`; the connection that proves it is that page's, subscribing to a
//! channel again, is sent what it missed, from Herald's history, right after
//! `subscription_succeeded` (or the event `herald:gap` when history no longer holds all of
//! it). The page id is in the path, so in access logs: it proves nothing, and a connection
//! without the proof (or with a wrong one) is a new page, closes nothing and is told
//! nothing.
//!
//! Where a channel stood is what the client is known to have read, not merely what was
//! written: after each write Herald sends a WebSocket ping carrying a number, and keeps the
//! positions written so far under it; the pong (which every WebSocket client sends by
//! itself, after reading everything before the ping) confirms them. So what was in flight
//! when the line dropped is sent again, and at most what arrived in the last round trip
//! comes twice. A page's connection that Herald still holds open when the page is back (a
//! dropped line Herald has not noticed yet) is closed, and its positions taken over.
//!
//! What a page left is state any client can make the server keep, so it is bounded three
//! ways: it is dropped at the app's `resume_window` (swept every few seconds, whether or
//! not the page comes back), its bytes count against its address's
//! `limits.held_bytes_per_address` (over it, nothing is kept), and past [`MAX_PAGES`]
//! pages or [`MAX_BYTES`] bytes on a node the oldest are forgotten.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use herald_protocol::{ChannelName, Since};
use parking_lot::Mutex;

use super::socket::SocketId;
use crate::{admin, limits::HeldBytes, node::Node, registry::Who};

/// Most pages whose positions a node keeps; past it, the oldest are forgotten.
const MAX_PAGES: usize = 100_000;

/// Most bytes of positions a node keeps for pages; past it, the oldest are forgotten.
const MAX_BYTES: usize = 256 << 20;

/// How often pages kept past their window are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Most pings awaiting their pong; past it, the oldest is forgotten (its positions are
/// confirmed by a later pong anyway).
const MAX_UNCONFIRMED: usize = 8;

/// How long a page's next connection waits for the positions of the connection it
/// replaces to be kept.
const TAKEOVER_WAIT: Duration = Duration::from_secs(2);

/// A page's connection: its app and the proof it was given.
type PageKey = (u16, Box<str>);

/// Where a page's channels stood when its connection ended.
#[derive(Debug)]
pub struct Bookmark {
    /// When it is dropped unless taken back (its app's `resume_window` after it was kept).
    until: Instant,
    /// The connection's socket id: what it sent itself is not sent back.
    pub socket_id: SocketId,
    channels: Vec<(ChannelName, Since)>,
    /// Its bytes, counted against the page's address while kept.
    held: Option<HeldBytes>,
}

impl Bookmark {
    /// About the memory it takes: each channel's name and epoch, and what holds them.
    fn bytes(&self) -> usize {
        let each = |(c, s): &(ChannelName, Since)| {
            c.as_str().len() + s.epoch.as_ref().map_or(0, |e| e.as_str().len()) + 64
        };
        128 + self.channels.iter().map(each).sum::<usize>()
    }
}

/// The positions a node keeps, by page.
#[derive(Debug, Default)]
pub struct Bookmarks {
    pages: Mutex<Pages>,
    kept: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Pages {
    kept: HashMap<PageKey, Bookmark>,
    /// The bytes of what is kept.
    bytes: usize,
    /// Pages in the order they were kept, to forget the oldest.
    order: VecDeque<PageKey>,
    /// Each page connection still open (its Herald client id), by its proof.
    open: HashMap<PageKey, Arc<str>>,
}

/// A new proof (see the module's doc): 128 bits from the operating system's generator.
pub fn proof() -> Box<str> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random generator works");
    hex::encode(bytes).into()
}

/// Whether `id` may name a page.
pub fn page_id_ok(id: &str) -> bool {
    (16..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Bookmarks {
    /// The node's bookmarks, swept of those past their window every few seconds while
    /// they live (inside a runtime).
    pub fn start() -> Arc<Self> {
        let bookmarks = Arc::<Self>::default();
        if tokio::runtime::Handle::try_current().is_ok() {
            let weak = Arc::downgrade(&bookmarks);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_EVERY);
                loop {
                    tick.tick().await;
                    match weak.upgrade() {
                        Some(bookmarks) => bookmarks.sweep(Instant::now()),
                        None => return,
                    }
                }
            });
        }
        bookmarks
    }

    /// Drops what was kept past its window by `now`.
    fn sweep(&self, now: Instant) {
        let mut pages = self.pages.lock();
        let Pages {
            kept, order, bytes, ..
        } = &mut *pages;
        kept.retain(|_, b| {
            let live = b.until > now;
            if !live {
                *bytes -= b.bytes();
            }
            live
        });
        order.retain(|k| kept.contains_key(k));
    }

    /// Pages kept, and their bytes.
    #[cfg(test)]
    fn footprint(&self) -> (usize, usize) {
        let pages = self.pages.lock();
        (pages.kept.len(), pages.bytes)
    }

    /// A connection of a page of app `app` opened (as Herald client `client`) and was
    /// given `proof`.
    pub fn opened(&self, app: u16, proof: &str, client: &str) {
        let key: PageKey = (app, proof.into());
        self.pages.lock().open.insert(key, client.into());
    }

    /// A connection of a page of app `app` proved it is the page whose connection was
    /// given `proof`: what that connection left, if within its window. If it is still
    /// open, it is closed first, and its positions waited for. A proof nobody was given
    /// finds nothing and closes nothing.
    pub async fn resume(&self, node: &Node, app: u16, proof: &str) -> Option<Bookmark> {
        let key: PageKey = (app, proof.into());
        let before = self.pages.lock().open.get(&key).cloned();
        if let Some(before) = before {
            let kept = self.kept.notified();
            tokio::pin!(kept);
            kept.as_mut().enable();
            let action = admin::Action::Disconnect {
                who: Who::Client(before.to_string()),
                code: herald_protocol::pusher::codes::RECONNECT,
                reason: "the page connected again".into(),
            };
            admin::here(node, &action);
            let deadline = tokio::time::Instant::now() + TAKEOVER_WAIT;
            while !self.pages.lock().kept.contains_key(&key) {
                if tokio::time::timeout_at(deadline, kept.as_mut())
                    .await
                    .is_err()
                {
                    break;
                }
                kept.set(self.kept.notified());
                kept.as_mut().enable();
            }
        }
        let mut pages = self.pages.lock();
        let found = pages.kept.remove(&key)?;
        pages.bytes -= found.bytes();
        (found.until >= Instant::now()).then_some(found)
    }

    /// The connection of a page (its app and proof) ended where `bookmark` says: kept for
    /// `window`, its bytes charged to `account` (the page's address) when given; nothing
    /// is kept when the address holds its limit.
    pub fn keep(
        &self,
        (app, proof): (u16, &str),
        client: &str,
        mut bookmark: Bookmark,
        window: Duration,
        account: Option<HeldBytes>,
    ) {
        let key: PageKey = (app, proof.into());
        let size = bookmark.bytes();
        bookmark.until = Instant::now() + window;
        bookmark.held = account;
        let affordable = bookmark.held.as_mut().is_none_or(|h| h.grow(size));
        let mut pages = self.pages.lock();
        if pages.open.get(&key).is_some_and(|c| &**c == client) {
            pages.open.remove(&key);
        }
        if affordable {
            pages.bytes += size;
            match pages.kept.insert(key.clone(), bookmark) {
                Some(before) => pages.bytes -= before.bytes(),
                None => pages.order.push_back(key),
            }
        }
        while pages.kept.len() > MAX_PAGES || pages.bytes > MAX_BYTES {
            let Some(oldest) = pages.order.pop_front() else {
                break;
            };
            if let Some(dropped) = pages.kept.remove(&oldest) {
                pages.bytes -= dropped.bytes();
            }
        }
        // Keys of pages taken back since they were kept stay in `order` until they come
        // round; bounded by the pages kept meanwhile.
        if pages.order.len() > 2 * MAX_PAGES {
            let Pages { kept, order, .. } = &mut *pages;
            order.retain(|k| kept.contains_key(k));
        }
        drop(pages);
        self.kept.notify_waiters();
    }
}

/// One connection's page: what its last connection left, and what this one's client has
/// confirmed reading.
#[derive(Debug)]
pub struct Page {
    /// The proof this connection was given.
    pub proof: Box<str>,
    /// Whether the page may still prove it resumes (nothing else was sent yet).
    pub resumable: bool,
    /// What the page's last connection left, channel by channel as it subscribes again.
    pub found: Option<Bookmark>,
    /// Confirmed positions, by channel.
    confirmed: Vec<(ChannelName, Since)>,
    /// Positions written before each ping still unanswered, by the ping's number.
    unconfirmed: VecDeque<(u64, Vec<(ChannelName, Since)>)>,
    pings: u64,
}

impl Page {
    pub fn new(proof: Box<str>) -> Self {
        Self {
            proof,
            resumable: true,
            found: None,
            confirmed: Vec::new(),
            unconfirmed: VecDeque::new(),
            pings: 0,
        }
    }

    /// Where the page's last connection left `channel`, taken (once), and who it was.
    pub fn resume(&mut self, channel: &ChannelName) -> Option<(Since, SocketId)> {
        let found = self.found.as_mut()?;
        let i = found.channels.iter().position(|(c, _)| c == channel)?;
        let (_, since) = found.channels.swap_remove(i);
        Some((since, found.socket_id))
    }

    /// The client is subscribed to `channel` from `since`: it has everything up to there.
    pub fn opened(&mut self, channel: &ChannelName, since: Since) {
        self.closed(channel);
        self.confirmed.push((channel.clone(), since));
    }

    /// The client left `channel`.
    pub fn closed(&mut self, channel: &ChannelName) {
        self.confirmed.retain(|(c, _)| c != channel);
    }

    /// Positions `written`: the payload of the ping that is to confirm them.
    pub fn written(&mut self, written: Vec<(ChannelName, Since)>) -> [u8; 8] {
        self.pings += 1;
        if self.unconfirmed.len() == MAX_UNCONFIRMED {
            self.unconfirmed.pop_front();
        }
        self.unconfirmed.push_back((self.pings, written));
        self.pings.to_be_bytes()
    }

    /// The pong of the ping that carried `payload`: what was written before it is read.
    pub fn pong(&mut self, payload: &[u8]) {
        let Some(number) = payload.try_into().ok().map(u64::from_be_bytes) else {
            return;
        };
        while let Some((n, written)) = self.unconfirmed.pop_front() {
            if n < number {
                continue;
            }
            if n == number {
                for (channel, since) in written {
                    // Only channels still subscribed (and opened before the ping).
                    if let Some(c) = self.confirmed.iter_mut().find(|(c, _)| *c == channel) {
                        c.1 = since;
                    }
                }
            } else {
                self.unconfirmed.push_front((n, written));
            }
            break;
        }
    }

    /// What the connection leaves for the page's next one.
    pub fn bookmark(&mut self, socket_id: SocketId) -> Bookmark {
        Bookmark {
            until: Instant::now(),
            socket_id,
            channels: std::mem::take(&mut self.confirmed),
            held: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_protocol::Epoch;

    fn at(offset: u64) -> Since {
        Since {
            offset,
            epoch: Some(Epoch::checked("e1").unwrap()),
        }
    }

    #[test]
    fn only_a_pong_confirms_what_was_written_before_its_ping() {
        let c = ChannelName::new("app:c").unwrap();
        let mut page = Page::new("page".into());
        page.opened(&c, at(3));
        let first = page.written(vec![(c.clone(), at(5))]);
        let second = page.written(vec![(c.clone(), at(9))]);
        page.pong(b"junk");
        assert_eq!(page.confirmed, vec![(c.clone(), at(3))]);
        page.pong(&first);
        assert_eq!(page.confirmed, vec![(c.clone(), at(5))]);
        page.pong(&second);
        assert_eq!(page.confirmed, vec![(c.clone(), at(9))]);
        // A stale pong confirms nothing older.
        page.pong(&first);
        assert_eq!(page.confirmed, vec![(c.clone(), at(9))]);
        page.closed(&c);
        let third = page.written(vec![(c.clone(), at(12))]);
        page.pong(&third);
        assert!(page.confirmed.is_empty(), "a channel left is not kept");
    }

    /// A bookmark of `n` channels of long names, kept a moment ago.
    fn bookmark(n: usize) -> Bookmark {
        let mut page = Page::new("page".into());
        for i in 0..n {
            page.opened(&ChannelName::new(&format!("app:{i:0>150}")).unwrap(), at(1));
        }
        page.bookmark(SocketId::random())
    }

    /// Issue #56 item 2: pages were dropped only past 100,000 of them, whatever their
    /// age (1,500 closed pages held 181 MB 90 s later). Now what a page left goes at its
    /// window, whether or not it comes back.
    #[test]
    fn a_page_left_is_dropped_at_its_window() {
        let bookmarks = Bookmarks::default();
        let window = Duration::from_secs(60);
        for _ in 0..10 {
            let proof = proof();
            bookmarks.keep((0, &proof), "c", bookmark(100), window, None);
        }
        let (pages, bytes) = bookmarks.footprint();
        assert_eq!(pages, 10);
        assert!(bytes > 10 * 100 * 150, "{bytes}");
        bookmarks.sweep(Instant::now() + window / 2);
        assert_eq!(bookmarks.footprint().0, 10, "within the window, kept");
        bookmarks.sweep(Instant::now() + window + Duration::from_secs(1));
        assert_eq!(bookmarks.footprint(), (0, 0));
    }

    /// Item 2, per address: a page's bytes count against its address; over the limit,
    /// nothing is kept, and what was kept gives its bytes back when it goes.
    #[test]
    fn an_address_keeps_pages_only_within_its_share() {
        let limits = crate::limits::AddressLimits::new(crate::config::LimitsConfig {
            held_bytes_per_address: 100_000,
            ..Default::default()
        });
        let ip = std::net::IpAddr::from([192, 0, 2, 1]);
        let bookmarks = Bookmarks::default();
        let window = Duration::from_secs(60);
        for _ in 0..10 {
            let proof = proof();
            let account = Some(limits.hold(ip));
            bookmarks.keep((0, &proof), "c", bookmark(100), window, account);
        }
        // About 21 KB a page: four fit in 100,000 bytes.
        assert_eq!(bookmarks.footprint().0, 4);
        bookmarks.sweep(Instant::now() + window + Duration::from_secs(1));
        assert!(limits.hold(ip).grow(100_000), "the address's share is back");
    }

    #[test]
    fn page_ids_are_long_and_plain() {
        assert!(page_id_ok("0123456789abcdef"));
        assert!(page_id_ok("f47ac10b-58cc-4372-a567-0e02b2c3d479"));
        assert!(!page_id_ok("short"));
        assert!(!page_id_ok("0123456789abcdef/.."));
    }
}

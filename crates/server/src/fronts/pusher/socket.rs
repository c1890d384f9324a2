//! `GET /app/{key}?protocol=7`: a Pusher client's WebSocket. The connection is admitted
//! as every WebSocket is (origin, limits per address, connection count), then told its
//! socket id, or why it is refused (`pusher:error`, then a close with the same 4xxx code:
//! an unknown key, a disabled app, a protocol version this server does not speak).

use std::sync::Arc;

use axum::{
    extract::{Path, Query, Request, State},
    response::Response,
    Extension,
};
use herald_protocol::{
    pusher::{self, codes},
    DisconnectCode,
};
use serde::Deserialize;

use super::{
    occupancy::Occupancy,
    resume::{self, page_id_ok, Bookmarks, Page},
    speaker::Pusher,
};
use crate::{
    error::Disconnect,
    hooks::Transport,
    node::Node,
    queue::{Delivery, Form, Lane},
    session::Session,
    transport::{
        driver::{self, Wire},
        websocket::{self, Framing, Upgraded, WebSocket, MESSAGE_TOO_BIG},
    },
};

/// The query of a client's WebSocket address.
#[derive(Debug, Default, Deserialize)]
pub struct Params {
    protocol: Option<String>,
}

/// `GET /app/{key}`.
pub async fn connect(
    State(node): State<Arc<Node>>,
    Extension(fronts): Extension<Shared>,
    Path(key): Path<String>,
    Query(params): Query<Params>,
    request: Request,
) -> Response {
    let app = app_of(&node, &key, &params);
    accept(node, request, app, fronts.occupancy, None)
}

/// `GET /resume/{page}/app/{key}`: a connection of a page that opted in to resuming
/// ([`super::resume`]).
pub async fn connect_page(
    State(node): State<Arc<Node>>,
    Extension(fronts): Extension<Shared>,
    Path((page, key)): Path<(String, String)>,
    Query(params): Query<Params>,
    request: Request,
) -> Response {
    let app = app_of(&node, &key, &params).and_then(|app| {
        if page_id_ok(&page) {
            Ok(app)
        } else {
            Err((
                codes::PATH_NOT_FOUND,
                "a page id is 16 to 64 of A-Z a-z 0-9 - _".to_owned(),
            ))
        }
    });
    // The id only routes the page (it is in the path); its proof comes in a message.
    accept(node, request, app, fronts.occupancy, Some(fronts.bookmarks))
}

/// Upgrades to a WebSocket served by [`run`]. What the connection needs is decided before,
/// so that its task keeps neither the key nor the query.
fn accept(
    node: Arc<Node>,
    request: Request,
    app: Result<usize, (u16, String)>,
    occupancy: Option<Arc<Occupancy>>,
    page: Option<Arc<Bookmarks>>,
) -> Response {
    let app = app.map_err(Box::new);
    websocket::accept(node, request, None, move |up| {
        run(Box::new((up, app, occupancy, page)))
    })
}

/// What the front's connections share on a node.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Who occupies channels, when an app posts webhooks about it.
    pub occupancy: Option<Arc<Occupancy>>,
    /// Where pages that opted in to resuming left their channels.
    pub bookmarks: Arc<Bookmarks>,
}

/// Which app a connection is for, or why it is refused.
type Admitted = Result<usize, Box<(u16, String)>>;

/// What opening a connection takes: the socket, the app, the node's counts, and where
/// pages are kept, for a page that opted in to resuming.
type Opening = (
    Upgraded,
    Admitted,
    Option<Arc<Occupancy>>,
    Option<Arc<Bookmarks>>,
);

/// Which app the client asked for, or why it is refused: a code of
/// [`pusher::codes`] and a message.
fn app_of(node: &Node, key: &str, params: &Params) -> Result<usize, (u16, String)> {
    let version = params
        .protocol
        .as_deref()
        .ok_or((codes::NO_VERSION, "no protocol version given".to_owned()))?;
    let version: u32 = version.parse().map_err(|_| {
        (
            codes::INVALID_VERSION,
            format!("invalid protocol version {version:?}"),
        )
    })?;
    if !pusher::VERSIONS.contains(&version) {
        return Err((
            codes::UNSUPPORTED_VERSION,
            format!(
                "unsupported protocol version {version}; this server speaks {} to {}",
                pusher::VERSIONS.start(),
                pusher::VERSIONS.end()
            ),
        ));
    }
    let apps = &node.settings.config.pusher.apps;
    let index = apps.iter().position(|a| a.key == key).ok_or((
        codes::APP_NOT_FOUND,
        format!("app key {key} does not exist"),
    ))?;
    if !apps[index].enabled {
        return Err((codes::APP_DISABLED, "application is disabled".to_owned()));
    }
    Ok(index)
}

/// Serves a connection. What opening it takes comes boxed and opens in a future of its
/// own: an async fn keeps its arguments, and a future it awaits inline, in its task for as
/// long as it runs, so the upgraded socket's parts, the greeting and a refusal would take
/// room in every connection's task for its whole life.
async fn run(opening: Box<Opening>) {
    let node = opening.0.node.clone();
    let Some((mut speaker, mut wire)) = Box::pin(open(opening)).await else {
        return;
    };
    let told = driver::drive(&node, &mut speaker, &mut wire, Ok(()), 0).await;
    // Kept before the client hears the end, so that its next connection finds it.
    speaker.keep_page();
    let counts = speaker.take_counts();
    drop(speaker);
    if let Some((occupancy, counts)) = counts {
        // In a task of its own: nothing of it then stays in the connection's task.
        node.tasks.spawn(Pusher::leave_counts(occupancy, counts));
    }
    Box::pin(wire.farewell(told)).await;
}

/// Greets the client with its socket id, or refuses it and closes.
async fn open(opening: Box<Opening>) -> Option<(Pusher, WebSocket<PusherFrames>)> {
    let (up, app, occupancy, page) = *opening;
    let Upgraded {
        stream,
        early,
        node,
        address,
        facts,
        deflate,
    } = up;
    let mut session = Session::new(&node)
        .at_address(address)
        .came_by(Transport::Pusher, facts);
    session.members_by_grant();
    let socket_id = SocketId::random();
    // A page that resumes is written to by its own task only, which pings after each
    // write to learn what it read (see `resume`); the hub writes to the others directly.
    let framing = PusherFrames {
        socket_id,
        direct: page.is_none(),
    };
    let mut wire = WebSocket::open(stream, early, deflate, &session, &node, framing);
    let timeout = node.settings.config.client.write_timeout;
    let app = match app {
        Ok(app) => app,
        Err(refused) => {
            let (code, message) = *refused;
            let said = wire
                .say(&pusher::error(Some(code), &message), timeout)
                .await;
            let d = Disconnect {
                code: DisconnectCode::Forbidden,
                reason: message,
                chosen: Some(code),
            };
            drop(session);
            if said.is_ok() {
                Box::pin(wire.farewell(Some(d))).await;
            }
            return None;
        }
    };
    let activity = node.settings.config.pusher.apps[app]
        .activity_timeout
        .as_secs();
    let hello = pusher::connection_established(&socket_id.to_string(), activity);
    wire.say(&hello, timeout).await.ok()?;
    session.announce();
    let index = u16::try_from(app).expect("apps are counted in u16");
    let window = node.settings.config.pusher.apps[app].resume_window;
    let mut speaker = Pusher::new(session, index, socket_id, occupancy);
    if let Some(bookmarks) = page.filter(|_| !window.is_zero()) {
        // Its proof, for the page's next connection to send back (see `resume`).
        let proof = resume::proof();
        wire.say(&pusher::page(&proof), timeout).await.ok()?;
        bookmarks.opened(index, &proof, speaker.client());
        speaker.resumes(bookmarks, Page::new(proof));
    }
    Some((speaker, wire))
}

/// A socket id as Pusher writes them (`123.456`): two random numbers, kept as numbers
/// (8 bytes, nothing allocated per connection). It names the connection to the app's
/// backend (signatures, `socket_id` exclusions) and is no capability of its own: Herald's
/// client id, which is one, is never shown to a Pusher client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketId(u32, u32);

impl SocketId {
    pub(super) fn random() -> Self {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the operating system's random generator works");
        let part = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes")) % 1_000_000_000;
        SocketId(part(&bytes[..4]), part(&bytes[4..]))
    }

    /// Whether `text` (a publication's `socket_id`) names this connection.
    pub fn is(self, text: &str) -> bool {
        text.split_once('.').is_some_and(|(a, b)| {
            a.parse() == Ok(self.0) && b.parse() == Ok(self.1) && !a.starts_with('+')
        })
    }
}

impl std::fmt::Display for SocketId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// How a Pusher connection is written to: each event a message of its own; the hub
/// writes publications straight to the socket as Pusher events (made once per
/// publication), except those this connection sent (`socket_id`) and presence changes,
/// which its task turns into member events.
#[derive(Debug)]
pub struct PusherFrames {
    socket_id: SocketId,
    /// Whether the hub may write to the socket itself.
    direct: bool,
}

impl Framing for PusherFrames {
    const MESSAGE_PER_PUSH: bool = true;

    fn message<'d>(&self, delivery: &'d Delivery, _: Form) -> Option<(Lane, &'d [u8])> {
        if delivery.offset == 0 || !self.direct {
            return None;
        }
        let event = super::event_of(delivery);
        if event
            .except
            .as_deref()
            .is_some_and(|e| self.socket_id.is(e))
        {
            return None;
        }
        Some((crate::fronts::slots::PUSHER_LANE, &event.frame))
    }

    /// Every publication's event, for the connection's task (which leaves out the client's
    /// own events itself), whether the hub writes to this connection or not.
    fn message_for_task<'d>(&self, delivery: &'d Delivery) -> Option<(Lane, &'d [u8])> {
        (delivery.offset != 0).then(|| {
            (
                crate::fronts::slots::PUSHER_LANE,
                &super::event_of(delivery).frame[..],
            )
        })
    }

    /// Pusher's own keepalive, `pusher:ping`, on a quiet connection (pusher-js answers
    /// `pusher:pong`): a page cannot see WebSocket pings, and the Pusher servers send
    /// theirs this way.
    fn app_ping(&self) -> Option<Vec<u8>> {
        Some(herald_protocol::pusher::ping())
    }

    fn app_ping_regularly(&self) -> bool {
        false
    }

    /// Herald's reasons in Pusher's codes, so that `pusher-js` does what Herald's SDK
    /// would: 4200 reconnect at once, 4100 after a pause, 4000-4099 not at all.
    fn close(why: &Disconnect) -> (u16, String) {
        let reason = why.short_reason().to_owned();
        // An application's code, or RFC 6455's own (1009: a compressed message too big).
        if let Some(code @ (1000..=1015 | 4000..=4999)) = why.chosen {
            return (code, reason);
        }
        let code = match why.code {
            // RFC 6455's "message too big": Pusher's 4000-4099 would tell pusher-js never
            // to reconnect, and the page would lose its real-time for a message it can
            // simply not send again; on 1009 pusher-js reconnects after a second.
            DisconnectCode::MessageTooLarge => MESSAGE_TOO_BIG,
            DisconnectCode::Stale => codes::PONG_NOT_RECEIVED,
            DisconnectCode::Slow | DisconnectCode::BackendUnavailable => codes::OVER_CAPACITY,
            DisconnectCode::ConnectionLimit => codes::OVER_QUOTA,
            c if c.reconnect() => codes::RECONNECT,
            _ => codes::UNAUTHORIZED,
        };
        (code, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_id_is_written_and_recognised_as_pusher_writes_it() {
        let id = SocketId(123, 456);
        assert_eq!(id.to_string(), "123.456");
        assert!(id.is("123.456"));
        for other in [
            "123.457",
            "124.456",
            "123",
            "+123.456",
            "123.456.7",
            "",
            "a.b",
        ] {
            assert!(!id.is(other), "{other}");
        }
        let random = SocketId::random();
        assert!(random.is(&random.to_string()));
    }

    #[test]
    fn herald_reasons_become_pusher_close_codes() {
        let close = |code| PusherFrames::close(&Disconnect::new(code)).0;
        assert_eq!(close(DisconnectCode::Shutdown), codes::RECONNECT);
        assert_eq!(close(DisconnectCode::Slow), codes::OVER_CAPACITY);
        assert_eq!(close(DisconnectCode::Stale), codes::PONG_NOT_RECEIVED);
        assert_eq!(close(DisconnectCode::ConnectionLimit), codes::OVER_QUOTA);
        assert_eq!(close(DisconnectCode::BadRequest), codes::UNAUTHORIZED);
        assert_eq!(
            close(DisconnectCode::MessageTooLarge),
            1009,
            "pusher-js reconnects"
        );
        let chosen = Disconnect {
            code: DisconnectCode::Forbidden,
            reason: "bye".into(),
            chosen: Some(4001),
        };
        assert_eq!(PusherFrames::close(&chosen).0, 4001);
    }
}

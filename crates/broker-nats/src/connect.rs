//! Where NATS is, how Herald proves itself to it, and what the connection reports.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};

use async_nats::{Client, ConnectOptions, Event, ServerAddr};
use herald_broker::{BrokerError, Reach};
use parking_lot::Mutex;
use tokio::sync::watch;

use herald_broker::redacted;

use crate::names::valid_prefix;

/// How Herald proves itself to NATS (beyond credentials in the URL).
#[derive(Debug, Clone, Default)]
pub enum NatsAuth {
    /// None, or what the URLs carry (`nats://user:password@host`).
    #[default]
    None,
    /// A user and password.
    Password {
        /// The user.
        user: String,
        /// Its password.
        password: String,
    },
    /// A token.
    Token(String),
    /// An NKey seed (`SU…`).
    NKey(String),
    /// A `.creds` file (a user JWT and its NKey seed), as `nsc` writes them.
    CredsFile(PathBuf),
}

/// TLS beyond what the URL says (`tls://` alone uses the system's roots).
#[derive(Debug, Clone, Default)]
pub struct NatsTls {
    /// CA certificate (PEM) to trust for the servers' certificates.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for servers that verify clients.
    pub cert_file: Option<PathBuf>,
    /// Its key.
    pub key_file: Option<PathBuf>,
    /// Speak TLS even when the URL does not say so.
    pub required: bool,
}

/// Where NATS is and how Herald names what it keeps there.
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// `nats://[user:password@]host:port`, one per server of a NATS cluster (any of them
    /// leads to the rest).
    pub urls: Vec<String>,
    /// Put before every stream, subject and bucket, so several Herald clusters (or other
    /// programs) can share one NATS: letters, digits, `-` and `_`.
    pub prefix: String,
    /// Credentials.
    pub auth: NatsAuth,
    /// TLS settings.
    pub tls: NatsTls,
    /// How soon a node that stops reaching NATS says so: the connection pings every third
    /// of it.
    pub unreachable_after: Duration,
    /// Servers of a NATS cluster that keep each of Herald's streams and buckets (JetStream
    /// replicas, at most 5): with 3, a publication is acknowledged once two have it, and
    /// the loss of one server loses nothing. 1 on a single server.
    pub replicas: usize,
}

impl NatsOptions {
    /// One NATS at `url` under `prefix`, with no credentials beyond the URL's and no TLS
    /// settings.
    pub fn at(url: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            prefix: prefix.into(),
            auth: NatsAuth::None,
            tls: NatsTls::default(),
            unreachable_after: Duration::from_secs(3),
            replicas: 1,
        }
    }
}

/// What the connection's events tell: whether NATS is reachable, and each return after a
/// loss (the broker's listeners catch up then).
#[derive(Debug)]
pub(crate) struct Events {
    lost: Mutex<Option<String>>,
    losses: AtomicU64,
    recoveries: AtomicU64,
    reconnected: watch::Sender<u64>,
}

impl Events {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            lost: Mutex::new(None),
            losses: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            reconnected: watch::Sender::new(0),
        })
    }

    fn on(&self, event: Event) {
        match event {
            Event::Disconnected => {
                let mut lost = self.lost.lock();
                if lost.is_none() {
                    self.losses.fetch_add(1, Relaxed);
                }
                *lost = Some("nats: the connection was lost".into());
            }
            Event::Connected => {
                if self.lost.lock().take().is_some() {
                    self.recoveries.fetch_add(1, Relaxed);
                    self.reconnected.send_modify(|n| *n += 1);
                }
            }
            Event::Closed => {
                *self.lost.lock() = Some("nats: the connection was closed".into());
            }
            other => tracing::info!(event = %other, "nats"),
        }
    }

    pub(crate) fn reconnected(&self) -> watch::Receiver<u64> {
        self.reconnected.subscribe()
    }

    pub(crate) fn lost(&self) -> Option<String> {
        self.lost.lock().clone()
    }

    /// Fails at once while the connection is known lost: a call would wait for it in
    /// silence (async-nats holds requests until it reconnects), and a caller that hears
    /// "unavailable" now tries again, or elsewhere.
    pub(crate) fn reachable(&self) -> Result<(), BrokerError> {
        match self.lost() {
            None => Ok(()),
            Some(why) => Err(BrokerError::Unavailable(why)),
        }
    }

    pub(crate) fn reach(&self, topology: &'static str) -> Reach {
        let recoveries = self.recoveries.load(Relaxed);
        Reach {
            lost: self.lost(),
            writes_lost: self.lost(),
            losses: self.losses.load(Relaxed),
            recoveries,
            topology,
            moves: 0,
            resubscriptions: recoveries,
        }
    }
}

/// Connects and checks the options: a bad prefix, an unreachable server or refused
/// credentials fail here, with the reason.
pub(crate) async fn connect(options: &NatsOptions) -> Result<(Client, Arc<Events>), BrokerError> {
    if !valid_prefix(&options.prefix) {
        return Err(BrokerError::Unavailable(format!(
            "nats.prefix {:?} may hold only letters, digits, - and _",
            options.prefix
        )));
    }
    if options.urls.is_empty() {
        return Err(BrokerError::Unavailable("nats.url names no server".into()));
    }
    let addresses = options
        .urls
        .iter()
        .map(|url| {
            url.parse::<ServerAddr>()
                .map_err(|e| BrokerError::Unavailable(format!("nats url {}: {e}", redacted(url))))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Credentials in a URL count when nothing else is given (a user alone is a token).
    let from_url = addresses
        .iter()
        .find_map(|a| match (a.username(), a.password()) {
            (Some(user), Some(password)) => Some(NatsAuth::Password {
                user: user.to_string(),
                password: password.to_string(),
            }),
            (Some(token), None) => Some(NatsAuth::Token(token.to_string())),
            _ => None,
        });
    let auth = match (&options.auth, from_url) {
        (NatsAuth::None, Some(from_url)) => from_url,
        (auth, _) => auth.clone(),
    };
    let connect =
        match &auth {
            NatsAuth::None => ConnectOptions::new(),
            NatsAuth::Password { user, password } => {
                ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            NatsAuth::Token(token) => ConnectOptions::with_token(token.clone()),
            NatsAuth::NKey(seed) => ConnectOptions::with_nkey(seed.clone()),
            NatsAuth::CredsFile(path) => ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| {
                    BrokerError::Unavailable(format!("nats creds file {}: {e}", path.display()))
                })?,
        };
    let mut connect = connect
        .name("herald")
        .connection_timeout(Duration::from_secs(5))
        .ping_interval((options.unreachable_after / 3).max(Duration::from_millis(100)))
        .request_timeout(Some(crate::COMMAND_WAIT))
        // Reconnect forever: a node outlives its NATS's restarts.
        .max_reconnects(None);
    if let Some(ca) = &options.tls.ca_file {
        connect = connect.add_root_certificates(ca.clone());
    }
    match (&options.tls.cert_file, &options.tls.key_file) {
        (Some(cert), Some(key)) => {
            connect = connect.add_client_certificate(cert.clone(), key.clone());
        }
        (None, None) => {}
        _ => {
            return Err(BrokerError::Unavailable(
                "nats.cert_file and nats.key_file go together".into(),
            ))
        }
    }
    if options.tls.required {
        connect = connect.require_tls(true);
    }
    let events = Events::new();
    let heard = events.clone();
    let connect = connect.event_callback(move |event| {
        heard.on(event);
        async {}
    });
    let client = connect
        .connect(addresses)
        .await
        .map_err(|e| BrokerError::Unavailable(format!("nats: {e}")))?;
    Ok((client, events))
}

/// How long [`round_trip`] waits for its echo.
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(10);

/// Returns once the server has read everything `client` sent before the call: a message
/// to an inbox of the client's own comes back only after the server has processed what
/// preceded it on the connection, a subscription included. (`Client::flush` only writes
/// the client's buffer to its socket: a subscription still on its way through a slow link
/// or a proxy misses what is published meanwhile.)
pub(crate) async fn round_trip(client: &Client) -> Result<(), BrokerError> {
    use futures_util::StreamExt;
    let inbox = client.new_inbox();
    let mut echo = client
        .subscribe(inbox.clone())
        .await
        .map_err(crate::unavailable)?;
    client
        .publish(inbox, bytes::Bytes::new())
        .await
        .map_err(crate::unavailable)?;
    match tokio::time::timeout(ROUND_TRIP_TIMEOUT, echo.next()).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(crate::unavailable("the connection closed")),
        Err(_) => Err(crate::unavailable(format!(
            "no answer from the server within {ROUND_TRIP_TIMEOUT:?}"
        ))),
    }
}

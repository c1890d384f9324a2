//! Where the Redis primary is: at a fixed address (the URL's), or wherever Redis Sentinel
//! says it is now. The command connection and the pub/sub connection ask here each time
//! they (re)connect, so after a failover both move to the new primary.

use std::time::Duration;

use herald_broker::BrokerError;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use crate::{tls, RedisOptions, RedisTls};

/// How long one Sentinel (or a primary it names) may take to answer.
const ASK_WAIT: Duration = Duration::from_secs(1);

/// Redis Sentinel settings: who to ask for the primary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisSentinel {
    /// `host:port` of each Sentinel.
    pub addresses: Vec<String>,
    /// The name the Sentinels monitor the primary under (`sentinel monitor NAME …`).
    pub master_name: String,
    /// The Sentinels' own password (`requirepass` in their configuration), if any.
    pub password: Option<String>,
}

/// Where the primary is.
pub(crate) enum Endpoint {
    /// Always the URL's address.
    Fixed(redis::Client),
    /// Wherever the Sentinels say.
    Sentinel(Sentinels),
}

/// The Sentinels, and how to reach a primary they name.
pub(crate) struct Sentinels {
    sentinels: Vec<(String, redis::Client)>,
    master_name: String,
    /// The URL's credentials, database and protocol; its address is replaced by the
    /// primary's.
    primary: ConnectionInfo,
    tls: RedisTls,
}

impl Endpoint {
    /// The endpoint `options` describe; an error (without secrets) if they cannot work.
    pub(crate) fn new(options: &RedisOptions) -> Result<Self, BrokerError> {
        let Some(sentinel) = &options.sentinel else {
            return tls::client(&options.url, &options.tls).map(Endpoint::Fixed);
        };
        if sentinel.addresses.is_empty() || sentinel.master_name.is_empty() {
            return Err(refused("sentinels need their addresses and a master_name"));
        }
        let sentinels = sentinel
            .addresses
            .iter()
            .map(|address| {
                let (host, port) = address
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
                    .ok_or_else(|| refused(&format!("sentinel {address:?} is not host:port")))?;
                let mut info = (host, port)
                    .into_connection_info()
                    .map_err(crate::unavailable)?;
                if let Some(password) = &sentinel.password {
                    info = info.set_redis_settings(
                        redis::RedisConnectionInfo::default().set_password(password),
                    );
                }
                let client = redis::Client::open(info).map_err(crate::unavailable)?;
                Ok((address.clone(), client))
            })
            .collect::<Result<_, BrokerError>>()?;
        let primary = options
            .url
            .as_str()
            .into_connection_info()
            .map_err(crate::unavailable)?;
        Ok(Endpoint::Sentinel(Sentinels {
            sentinels,
            master_name: sentinel.master_name.clone(),
            primary,
            tls: options.tls.clone(),
        }))
    }

    /// Whether the primary can move (so a connection error is worth asking again where it
    /// is).
    pub(crate) fn moves(&self) -> bool {
        matches!(self, Endpoint::Sentinel(_))
    }

    /// A client for the primary as it is now.
    pub(crate) async fn client(&self) -> Result<redis::Client, BrokerError> {
        match self {
            Endpoint::Fixed(client) => Ok(client.clone()),
            Endpoint::Sentinel(sentinels) => sentinels.primary().await,
        }
    }
}

impl Sentinels {
    /// Asks the Sentinels in turn for the primary, and the primary whether it is one (a
    /// Sentinel may name the old primary for a moment after a failover): the first that
    /// answers both ways wins.
    async fn primary(&self) -> Result<redis::Client, BrokerError> {
        let mut failures = Vec::new();
        for (address, sentinel) in &self.sentinels {
            match self.ask(sentinel).await {
                Ok(client) => return Ok(client),
                Err(why) => failures.push(format!("{address}: {why}")),
            }
        }
        Err(refused(&format!(
            "no sentinel named a primary for {:?}: {}",
            self.master_name,
            failures.join("; ")
        )))
    }

    async fn ask(&self, sentinel: &redis::Client) -> Result<redis::Client, String> {
        let asked = async {
            let mut c = sentinel.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name)
                .query_async::<Option<(String, u16)>>(&mut c)
                .await
        };
        let (host, port) = tokio::time::timeout(ASK_WAIT, asked)
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "does not know that master_name".to_string())?;
        let addr = match self.primary.addr() {
            ConnectionAddr::TcpTls { .. } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port,
                insecure: false,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.clone(), port),
        };
        let client = tls::client_for(self.primary.clone().set_addr(addr), &self.tls)
            .map_err(|e| e.to_string())?;
        let role = async {
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("ROLE").query_async::<redis::Value>(&mut c).await
        };
        let role = tokio::time::timeout(ASK_WAIT, role)
            .await
            .map_err(|_| format!("{host}:{port} did not answer"))?
            .map_err(|e| format!("{host}:{port}: {e}"))?;
        match role {
            redis::Value::Array(parts) if is_master(parts.first()) => Ok(client),
            _ => Err(format!("{host}:{port} is not a primary (yet)")),
        }
    }
}

fn is_master(role: Option<&redis::Value>) -> bool {
    match role {
        Some(redis::Value::BulkString(b)) => b == b"master",
        Some(redis::Value::SimpleString(s)) => s == "master",
        _ => false,
    }
}

fn refused(why: &str) -> BrokerError {
    BrokerError::Unavailable(format!("redis: {why}"))
}

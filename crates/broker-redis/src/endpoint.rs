//! Where Redis is: one primary at a fixed address (the URL's), the primary Redis Sentinel
//! names now, or a Redis Cluster. The command connection and the pub/sub connection ask
//! here each time they (re)connect, so after a failover both move to the new primary (a
//! cluster's connection follows its slots by itself).

use std::time::Duration;

use herald_broker::BrokerError;
use redis::{
    aio::{ConnectionLike, ConnectionManager},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
    ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
};

use crate::{command_config, tls, unavailable, RedisOptions, RedisTls, COMMAND_WAIT};

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
    /// A Redis Cluster: each key's slot decides which primary serves it.
    Cluster(ClusterNodes),
}

/// A cluster's nodes (any of them leads to the rest), reached with the URL's credentials
/// and scheme.
pub(crate) struct ClusterNodes {
    nodes: Vec<ConnectionInfo>,
    tls: RedisTls,
}

/// A command connection, whatever the topology: one primary's (redis-rs reconnects it
/// when it is reset), or a cluster's (which sends each command to its slot's primary and
/// follows slots that move).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Where a (re)connected pub/sub connection's messages arrive, for a cluster's: what each
/// node pushes (messages, subscription changes, and a connection that dropped).
pub(crate) type Pushes = tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>;

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
        if !options.cluster.is_empty() {
            if options.sentinel.is_some() {
                return Err(refused("cluster and sentinels do not go together"));
            }
            return ClusterNodes::new(options).map(Endpoint::Cluster);
        }
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
                let (host, port) = host_port(address)
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

    /// Whether it is a cluster: publications then travel on sharded pub/sub, and every
    /// script and pipeline keeps to one slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Endpoint::Cluster(_))
    }

    /// A client for the primary as it is now (not for a cluster: see
    /// [`Endpoint::commands`] and [`Endpoint::cluster_pubsub`]).
    pub(crate) async fn client(&self) -> Result<redis::Client, BrokerError> {
        match self {
            Endpoint::Fixed(client) => Ok(client.clone()),
            Endpoint::Sentinel(sentinels) => sentinels.primary().await,
            Endpoint::Cluster(_) => Err(refused("a cluster has no single primary")),
        }
    }

    /// A command connection; with `lazy`, one primary's connects on its first command
    /// (a cluster's always connects now, to learn the slots).
    pub(crate) async fn commands(&self, lazy: bool) -> Result<Conn, BrokerError> {
        if let Endpoint::Cluster(nodes) = self {
            let client = nodes.builder()?.build().map_err(unavailable)?;
            let connection = client.get_async_connection().await.map_err(unavailable)?;
            return Ok(Conn::Cluster(connection));
        }
        let client = self.client().await?;
        let connection = if lazy {
            ConnectionManager::new_lazy_with_config(client, command_config())
        } else {
            ConnectionManager::new_with_config(client, command_config()).await
        };
        connection.map(Conn::Single).map_err(unavailable)
    }

    /// A cluster connection for pub/sub (RESP3), and where its pushes arrive.
    pub(crate) async fn cluster_pubsub(&self) -> Result<(ClusterConnection, Pushes), BrokerError> {
        let Endpoint::Cluster(nodes) = self else {
            return Err(refused("not a cluster"));
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = nodes
            .builder()?
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx)
            .build()
            .map_err(unavailable)?;
        let connection = client.get_async_connection().await.map_err(unavailable)?;
        Ok((connection, rx))
    }
}

impl ClusterNodes {
    fn new(options: &RedisOptions) -> Result<Self, BrokerError> {
        let url = options
            .url
            .as_str()
            .into_connection_info()
            .map_err(unavailable)?;
        let nodes = options
            .cluster
            .iter()
            .map(|address| {
                let (host, port) = host_port(address).ok_or_else(|| {
                    refused(&format!("cluster node {address:?} is not host:port"))
                })?;
                let addr = match url.addr() {
                    ConnectionAddr::TcpTls { .. } => ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: options.tls.insecure,
                        tls_params: None,
                    },
                    _ => ConnectionAddr::Tcp(host, port),
                };
                Ok(url.clone().set_addr(addr))
            })
            .collect::<Result<_, BrokerError>>()?;
        let is_tls = matches!(url.addr(), ConnectionAddr::TcpTls { .. });
        if !is_tls && options.tls.is_set() {
            return Err(refused(
                "TLS settings (ca_file, cert_file, key_file, tls_insecure) need a rediss:// URL",
            ));
        }
        Ok(Self {
            nodes,
            tls: options.tls.clone(),
        })
    }

    /// A client builder for the cluster, with the command limits and TLS.
    fn builder(&self) -> Result<ClusterClientBuilder, BrokerError> {
        let mut builder = ClusterClientBuilder::new(self.nodes.clone())
            .connection_timeout(COMMAND_WAIT)
            .response_timeout(COMMAND_WAIT)
            .retries(2);
        if self.tls.insecure {
            builder = builder.tls(redis::TlsMode::Insecure);
        }
        if let Some(certificates) = tls::certificates(&self.tls)? {
            builder = builder.certs(certificates);
        }
        Ok(builder)
    }
}

/// `host:port` split, or `None` if it is not that.
fn host_port(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    Some((host.to_string(), port.parse().ok()?))
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

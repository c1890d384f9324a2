//! The `[nats]` section: how a node reaches NATS JetStream.

use std::path::PathBuf;

use herald_broker_nats::{valid_prefix, NatsAuth, NatsOptions, NatsTls};
use herald_server::config::{bad, ConfigError};
use serde::{Deserialize, Serialize};

/// How a node reaches NATS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// `nats://[user:password@]host:port`, or `tls://…`; several servers of one NATS
    /// cluster separated by commas (any of them leads to the rest). Default
    /// `nats://127.0.0.1:4222`.
    pub url: String,
    /// Put before every stream, subject and bucket Herald uses, so several Herald clusters
    /// can share one NATS: letters, digits, `-` and `_`. Default `herald`.
    pub prefix: String,
    /// A user, with `password`. Default none.
    pub user: Option<String>,
    /// The user's password. Default none.
    pub password: Option<String>,
    /// A token, instead of a user. Default none.
    pub token: Option<String>,
    /// An NKey seed (`SU…`), instead of a user. Default none.
    pub nkey_seed: Option<String>,
    /// A `.creds` file (user JWT and NKey seed, as `nsc` writes them). Default none.
    pub creds_file: Option<PathBuf>,
    /// A PEM file of the CA(s) to trust for the servers' certificates instead of the
    /// system's roots. Default none.
    pub ca_file: Option<PathBuf>,
    /// For servers that verify clients: a PEM file of this node's certificate, with
    /// `key_file`. Default none.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM). Default none.
    pub key_file: Option<PathBuf>,
    /// Speak TLS even when the URL says `nats://`. Default false.
    pub tls: bool,
    /// Servers of the NATS cluster that keep each of Herald's streams and buckets
    /// (JetStream replicas, 1 to 5): 3 keeps every acknowledged publication through the
    /// loss of a server. Default 1 (a single server). Set when Herald first makes its
    /// streams; changing it later needs the streams changed too (`nats stream edit`).
    pub replicas: usize,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            prefix: "herald".into(),
            user: None,
            password: None,
            token: None,
            nkey_seed: None,
            creds_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls: false,
            replicas: 1,
        }
    }
}

impl NatsConfig {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if !valid_prefix(&self.prefix) {
            return Err(bad(
                "nats.prefix",
                "may hold only letters, digits, - and _ (it starts stream and subject names)",
            ));
        }
        if self.urls().is_empty() {
            return Err(bad("nats.url", "names no server"));
        }
        let ways = [
            self.user.is_some(),
            self.token.is_some(),
            self.nkey_seed.is_some(),
            self.creds_file.is_some(),
        ];
        if ways.iter().filter(|w| **w).count() > 1 {
            return Err(bad(
                "nats.user",
                "nats.token, nats.nkey_seed and nats.creds_file are ways to sign in: give one",
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(bad("nats.password", "needs nats.user"));
        }
        if !(1..=5).contains(&self.replicas) {
            return Err(bad("nats.replicas", "must be 1 to 5 (JetStream's range)"));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(bad("nats.cert_file", "and nats.key_file go together"));
        }
        Ok(())
    }

    fn urls(&self) -> Vec<String> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The broker's options, for a node whose connection is declared lost after
    /// `unreachable_after`.
    pub fn options(&self, unreachable_after: std::time::Duration) -> NatsOptions {
        let auth = if let Some(user) = &self.user {
            NatsAuth::Password {
                user: user.clone(),
                password: self.password.clone().unwrap_or_default(),
            }
        } else if let Some(token) = &self.token {
            NatsAuth::Token(token.clone())
        } else if let Some(seed) = &self.nkey_seed {
            NatsAuth::NKey(seed.clone())
        } else if let Some(path) = &self.creds_file {
            NatsAuth::CredsFile(path.clone())
        } else {
            NatsAuth::None
        };
        NatsOptions {
            urls: self.urls(),
            prefix: self.prefix.clone(),
            auth,
            tls: NatsTls {
                ca_file: self.ca_file.clone(),
                cert_file: self.cert_file.clone(),
                key_file: self.key_file.clone(),
                required: self.tls,
            },
            unreachable_after,
            replicas: self.replicas,
        }
    }

    /// Where publications are kept, for the start-up line (no secret in it).
    pub fn describe(&self) -> String {
        let urls: Vec<String> = self
            .urls()
            .iter()
            .map(|u| herald_broker_nats::redacted(u))
            .collect();
        format!("nats at {} (prefix {})", urls.join(", "), self.prefix)
    }
}

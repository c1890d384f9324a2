//! How a node reaches Redis over TLS: a `rediss://` URL, with the system's roots, or a CA of
//! the operator's (a private CA, as managed Redis offerings give), a client certificate
//! (mutual TLS), or, only when asked in so many words, no verification at all.

use std::path::{Path, PathBuf};

use herald_broker::BrokerError;
use redis::{ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, TlsCertificates};

/// TLS beyond what the URL says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM file of the CA(s) to trust instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM file of this node's client certificate (mutual TLS), with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key_file: Option<PathBuf>,
    /// Accept any certificate, for any name: a man in the middle reads everything. For
    /// tests against a self-signed server only.
    pub insecure: bool,
}

impl RedisTls {
    /// Whether any of it is set.
    pub fn is_set(&self) -> bool {
        *self != Self::default()
    }
}

/// A client for `url` with `tls`; the error says what is wrong, without the URL's secrets.
pub(crate) fn client(url: &str, tls: &RedisTls) -> Result<redis::Client, BrokerError> {
    client_for(url.into_connection_info().map_err(super::unavailable)?, tls)
}

/// A client for `info` with `tls`.
pub(crate) fn client_for(
    info: redis::ConnectionInfo,
    tls: &RedisTls,
) -> Result<redis::Client, BrokerError> {
    let ConnectionAddr::TcpTls { host, port, .. } = info.addr().clone() else {
        if tls.is_set() {
            return Err(refused(
                "TLS settings (ca_file, cert_file, key_file, tls_insecure) need a rediss:// URL",
            ));
        }
        return redis::Client::open(info).map_err(super::unavailable);
    };
    let info = if tls.insecure {
        info.set_addr(ConnectionAddr::TcpTls {
            host,
            port,
            insecure: true,
            tls_params: None,
        })
    } else {
        info
    };
    match certificates(tls)? {
        None => redis::Client::open(info).map_err(super::unavailable),
        Some(certificates) => {
            redis::Client::build_with_tls(info, certificates).map_err(super::unavailable)
        }
    }
}

/// The CA and client certificate `tls` names, read; `None` when it names neither.
pub(crate) fn certificates(tls: &RedisTls) -> Result<Option<TlsCertificates>, BrokerError> {
    let client_tls = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read(cert)?,
            client_key: read(key)?,
        }),
        (None, None) => None,
        _ => return Err(refused("cert_file and key_file go together")),
    };
    let root_cert = tls.ca_file.as_deref().map(read).transpose()?;
    if client_tls.is_none() && root_cert.is_none() {
        return Ok(None);
    }
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

fn read(path: &Path) -> Result<Vec<u8>, BrokerError> {
    std::fs::read(path).map_err(|e| refused(&format!("cannot read {}: {e}", path.display())))
}

fn refused(why: &str) -> BrokerError {
    BrokerError::Unavailable(format!("redis: {why}"))
}

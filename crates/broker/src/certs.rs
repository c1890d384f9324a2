//! Certificates for tests of remote stores that speak TLS (Redis, NATS), made by
//! `openssl`: a CA, a server certificate for `127.0.0.1` and `localhost` signed by it, a
//! client certificate signed by it (for mutual TLS), and a stranger's, signed by no one
//! the server trusts.

use std::process::{Command, Stdio};

/// The certificates a test server that speaks TLS uses, made by `openssl` in its
/// directory: a CA, the server's certificate for `127.0.0.1` and `localhost` signed by it,
/// and a client certificate signed by it (for mutual TLS).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA's certificate (PEM): what a client trusts.
    pub ca: std::path::PathBuf,
    /// A client certificate signed by the CA, and its key.
    pub client_cert: std::path::PathBuf,
    /// The client certificate's key.
    pub client_key: std::path::PathBuf,
    /// A certificate and key of another CA, which the server does not trust.
    pub stranger_cert: std::path::PathBuf,
    /// The stranger's key.
    pub stranger_key: std::path::PathBuf,
}

/// A CA, a server certificate it signs for loopback, a client certificate it signs, and a
/// stranger's self-signed pair, made in `dir` by the `openssl` command.
pub fn make_certificates(dir: &std::path::Path) -> TlsFiles {
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl must be installed");
        assert!(status.success(), "openssl {args:?} failed");
    };
    let self_signed = |name: &str, subject: &str| {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-subj",
            subject,
        ]);
    };
    self_signed("ca", "/CN=herald-test-ca");
    self_signed("stranger", "/CN=stranger");
    // Version 3 certificates (rustls takes no other), with what each is for.
    for (name, extensions) in [
        (
            "server",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(dir.join(format!("{name}.cnf")), extensions).expect("writable directory");
        let (key, csr, crt, cnf) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.cnf"),
        );
        let subject = format!("/CN={name}");
        openssl(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
            &subject,
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &crt,
            "-extfile",
            &cnf,
        ]);
    }
    TlsFiles {
        ca: dir.join("ca.crt"),
        client_cert: dir.join("client.crt"),
        client_key: dir.join("client.key"),
        stranger_cert: dir.join("stranger.crt"),
        stranger_key: dir.join("stranger.key"),
    }
}

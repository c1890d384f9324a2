//! nginx started from the repository's `deploy/nginx.conf` (and the locations file it
//! includes), changed only where a test machine must differ: its ports, the nodes' ports,
//! the certificate, and where it keeps its pid, logs and temporary files.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The public name in the deploy files: the test sends it as `Host`, as a browser would.
pub const HOST_NAME: &str = "chat.example.com";

/// nginx from `deploy/`, in front of the given nodes; stopped when dropped.
pub struct Nginx {
    child: Child,
    pub http: u16,
    pub https: u16,
    pub dir: tempfile::TempDir,
}

impl Nginx {
    /// Starts it in front of nodes listening on `nodes` (two ports, as the file has two).
    pub fn start(nodes: [u16; 2]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Workers may run as another user (nginx run as root switches to `nobody`).
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let (http, https) = (free_port(), free_port());
        let cert = d.join("cert.pem");
        let key = d.join("key.pem");
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", &format!("/CN={HOST_NAME}")])
            .args(["-addext", &format!("subjectAltName=DNS:{HOST_NAME}")])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl must be installed");
        assert!(made.success(), "openssl could not make a certificate");
        let ds = d.display().to_string();
        let changes: Vec<(String, String)> = vec![
            ("listen 80;".into(), format!("listen 127.0.0.1:{http};")),
            ("listen [::]:80;".into(), String::new()),
            (
                "listen 443 ssl http2;".into(),
                format!("listen 127.0.0.1:{https} ssl http2;"),
            ),
            ("listen [::]:443 ssl http2;".into(), String::new()),
            ("127.0.0.1:8080".into(), format!("127.0.0.1:{}", nodes[0])),
            ("127.0.0.1:8081".into(), format!("127.0.0.1:{}", nodes[1])),
            (
                format!("/etc/letsencrypt/live/{HOST_NAME}/fullchain.pem"),
                cert.display().to_string(),
            ),
            (
                format!("/etc/letsencrypt/live/{HOST_NAME}/privkey.pem"),
                key.display().to_string(),
            ),
            ("/run/nginx.pid".into(), format!("{ds}/nginx.pid")),
            ("/var/log/nginx/".into(), format!("{ds}/")),
            ("/var/lib/nginx/".into(), format!("{ds}/")),
        ];
        for file in ["nginx.conf", "herald-locations.conf"] {
            let mut text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
            for (from, to) in &changes {
                text = text.replace(from, to);
            }
            std::fs::write(d.join(file), text).unwrap();
        }
        for (from, _) in &changes[..4] {
            let text = std::fs::read_to_string(deploy_dir().join("nginx.conf")).unwrap();
            assert!(
                text.contains(from.as_str()),
                "deploy/nginx.conf has no {from:?}"
            );
        }
        let child = Command::new("nginx")
            .args(["-g", "daemon off;"])
            .arg("-e")
            .arg(d.join("error.log"))
            .arg("-p")
            .arg(d)
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx must be installed (Debian: nginx; .ci/run installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", https)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not listen: {}",
                std::fs::read_to_string(d.join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            http,
            https,
            dir,
        }
    }

    /// nginx's error log so far.
    pub fn errors(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers, then exits.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

//! The floor of a long-polling server on tokio: raw HTTP/1.1 on kept-alive connections,
//! one message per answer, with Nchan's protocol (the answer's `ETag` comes back as
//! `If-None-Match` and names the next message), and nothing else: no routing, no
//! admission, no sessions, no cursor, one channel whatever the path names. What it costs
//! per delivery is what any server on tokio pays for a long-poll before doing its job.
//!
//! `longpoll-floor ADDRESS [WORKERS]` (WORKERS 0: a current-thread runtime; default 2).
//! `POST /pub/…` appends its body; `GET /lp/…` answers the message its `If-None-Match`
//! names (the first without one), held until it exists. Restart it between runs: it keeps
//! every message.

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::{Arc, Mutex};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};

struct Log {
    messages: Mutex<Vec<Arc<[u8]>>>,
    /// How many there are, for the held requests to wait on.
    len: watch::Sender<usize>,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let address = args.next().expect("usage: longpoll-floor ADDRESS [WORKERS]");
    let workers: usize = args.next().map_or(2, |w| w.parse().expect("WORKERS"));
    let runtime = if workers == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    }
    .enable_all()
    .build()
    .expect("a runtime");
    runtime.block_on(async {
        let listener = TcpListener::bind(address).await.expect("bind");
        let log = Arc::new(Log {
            messages: Mutex::default(),
            len: watch::channel(0).0,
        });
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(connection(socket, log.clone()));
        }
    });
}

async fn connection(mut socket: TcpStream, log: Arc<Log>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut len = log.len.subscribe();
    loop {
        let end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 1024];
            let n = socket.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let (publish, wanted, body_len) = {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut request = httparse::Request::new(&mut headers);
            if request.parse(&buf[..end]).is_err() {
                return Ok(());
            }
            let (mut wanted, mut body_len) = (0usize, 0usize);
            for h in request.headers.iter() {
                let value = std::str::from_utf8(h.value).unwrap_or("");
                if h.name.eq_ignore_ascii_case("if-none-match") {
                    wanted = value.trim_matches('"').parse().unwrap_or(0);
                } else if h.name.eq_ignore_ascii_case("content-length") {
                    body_len = value.parse().unwrap_or(0);
                }
            }
            (request.path.unwrap_or("").starts_with("/pub/"), wanted, body_len)
        };
        buf.drain(..end);
        if publish {
            while buf.len() < body_len {
                let mut chunk = [0u8; 4096];
                let n = socket.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body: Arc<[u8]> = buf.drain(..body_len).collect::<Vec<u8>>().into();
            let n = {
                let mut messages = log.messages.lock().expect("not poisoned");
                messages.push(body);
                messages.len()
            };
            log.len.send_replace(n);
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await?;
            continue;
        }
        let message = loop {
            // Marked seen before looking, so a message appended after the look wakes us.
            len.borrow_and_update();
            if let Some(m) = log.messages.lock().expect("not poisoned").get(wanted) {
                break m.clone();
            }
            if len.changed().await.is_err() {
                return Ok(());
            }
        };
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\
             last-modified: Thu, 01 Jan 2026 00:00:00 GMT\r\netag: \"{}\"\r\n\
             content-length: {}\r\n\r\n",
            wanted + 1,
            message.len()
        )
        .into_bytes();
        answer.extend_from_slice(&message);
        socket.write_all(&answer).await?;
    }
}

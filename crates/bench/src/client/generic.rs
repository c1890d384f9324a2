//! The generic adapter's clients: a server that is not Herald (Nchan, Socket.IO, Phoenix,
//! ...) measured through its own WebSocket, SSE or long-poll endpoint, with the frames it
//! wants to subscribe ([`super::Generic`]).

use super::*;

/// The scheme prefix of a generic long-polling endpoint.
const LONGPOLL: &str = "longpoll+";

/// Long-polling as Nchan (and HTTP caches) speak it, on one kept-alive connection: each
/// answer is one message, and its `Last-Modified` and `ETag` go back as `If-Modified-Since`
/// and `If-None-Match`, so the next answer is the message after it (held until there is
/// one). The first request names no position: the server's configuration decides where it
/// starts (Nchan: `nchan_subscriber_first_message oldest`, so that a publication made before
/// the request is registered is not missed).
async fn generic_longpoll(url: &str, tcp: Tcp, rec: &Tracker) -> anyhow::Result<()> {
    let target = address(url)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    let _conn = Abort(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let mut since: Option<(hyper::header::HeaderValue, hyper::header::HeaderValue)> = None;
    let mut first = true;
    loop {
        let mut req = Request::get(path_of(url)).header("host", target.to_string());
        if let Some((modified, etag)) = &since {
            req = req
                .header("if-modified-since", modified)
                .header("if-none-match", etag);
        }
        sender.ready().await?;
        let answer = sender.send_request(req.body(Full::new(Bytes::new()))?);
        if first {
            // Counted as subscribed once asked: see above for why nothing is missed.
            rec.connected();
            first = false;
        }
        let res = answer.await?;
        let status = res.status();
        let headers = res.headers().clone();
        let body = res.into_body().collect().await?.to_bytes();
        if status == hyper::StatusCode::NOT_MODIFIED || status == hyper::StatusCode::REQUEST_TIMEOUT
        {
            continue;
        }
        if !status.is_success() {
            bail!("HTTP {status}");
        }
        if let Some((t, seq)) = stamp(&String::from_utf8_lossy(&body)) {
            rec.received(now_ns().saturating_sub(t), seq);
        }
        since = match (headers.get("last-modified"), headers.get("etag")) {
            (Some(m), Some(e)) => Some((m.clone(), e.clone())),
            _ => bail!("a long-poll answer without Last-Modified and ETag"),
        };
    }
}

pub(super) async fn generic_session(
    spec: &ClientSpec,
    g: &Generic,
    rec: &Tracker,
) -> anyhow::Result<()> {
    // `{random}`: an id of this connection's own (a Pusher page id, say).
    let url = g.url.replace("{channel}", &spec.channel).replace(
        "{random}",
        &format!(
            "{:016x}",
            std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                spec.channel.as_str()
            )
        ),
    );
    let target = address(url.strip_prefix(LONGPOLL).unwrap_or(&url))?;
    let tcp = connect_tcp(spec, target, rec).await?;
    if url.starts_with("ws") {
        let mut ws = handshake(&url, tcp, spec.deflate, false).await?;
        for (i, frame) in g.subscribe.iter().enumerate() {
            if let Some(wanted) = g.wait_for.get(i).filter(|w| !w.is_empty()) {
                loop {
                    match ws
                        .next()
                        .await
                        .ok_or_else(|| anyhow!("closed by server"))??
                    {
                        Message::Text(t) if t.as_str().contains(wanted.as_str()) => break,
                        Message::Close(c) => bail!("closed by server: {c:?}"),
                        _ => {}
                    }
                }
            }
            let frame = frame
                .replace("{channel_dashed}", &spec.channel.replace(':', "-"))
                .replace("{channel}", &spec.channel);
            ws.send(Message::text(frame)).await?;
        }
        rec.connected();
        let mut beat = (g.heartbeat.is_some() && g.heartbeat_ms > 0)
            .then(|| tokio::time::interval(Duration::from_millis(g.heartbeat_ms)));
        loop {
            tokio::select! {
                frame = ws.next() => {
                    match frame.ok_or_else(|| anyhow!("closed by server"))?? {
                        Message::Text(text) => {
                            for (t, seq) in stamps(text.as_str()) {
                                rec.received(now_ns().saturating_sub(t), seq);
                            }
                            // A ping may come joined with publications (Centrifugo's do).
                            if let Some((_, pong)) = g.ping_pong.as_ref().filter(|(ping, _)| {
                                text.as_str().split('\n').any(|line| line == ping)
                            }) {
                                ws.send(Message::text(pong.clone())).await?;
                            }
                        }
                        Message::Close(c) => bail!("closed by server: {c:?}"),
                        _ => {}
                    }
                }
                _ = tick(&mut beat) => {
                    ws.send(Message::text(g.heartbeat.clone().unwrap_or_default())).await?;
                }
            }
        }
    } else if let Some(url) = url.strip_prefix(LONGPOLL) {
        generic_longpoll(url, tcp, rec).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        let _conn = Abort(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let res = sender
            .send_request(
                Request::get(path_of(&url))
                    .header("host", target.to_string())
                    .header("accept", "text/event-stream")
                    .body(Full::new(Bytes::new()))?,
            )
            .await?;
        if !res.status().is_success() {
            bail!("HTTP {}", res.status());
        }
        rec.connected();
        let mut body = res.into_body();
        let mut pending = String::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            pending.push_str(&String::from_utf8_lossy(&data));
            while let Some(end) = pending.find('\n') {
                let line: String = pending.drain(..=end).collect();
                if let Some((t, seq)) = stamp(&line) {
                    rec.received(now_ns().saturating_sub(t), seq);
                }
            }
        }
        bail!("stream ended")
    }
}

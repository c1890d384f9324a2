#!/usr/bin/env python3
"""What one hostile client address can make the Pusher and Phoenix fronts cost
(docs/security.md, issue #56).

    python3 tools/fronts_probe.py ./target/release/herald [probe ...]

Starts the given binary on 127.0.0.1:18098 (a fresh one per probe) with its defaults plus
a Pusher app (resume_window 30s) and a namespace `open` clients may publish to, then, from
this one address:
  outbox:    Phoenix long-poll: POSTs of 64 KiB of heartbeats for 8 s, never a GET (a
             session that answers 410 is replaced by a new one): the server's RSS after
             the 8 s and 40 s later, and its CPU;
  bookmarks: 600 Pusher pages (`/resume/ID`) each subscribed to 300 channels of 160-byte
             names, then closed: RSS after them, and 45 s later (past the window);
  rate:      one Phoenix WebSocket: 5,000 heartbeats in a burst (how many answered), then
             5 s of 1 KB events on a joined topic (how many stored);
  deflate:   one WebSocket with permessage-deflate sends ~100-byte messages that inflate
             to 60 KB, flat out for 5 s, on Herald's protocol and on Phoenix's: the CPU;
  idempotency: an anonymous client publishes with key order-42, then the backend: whether
             the backend's was stored;
  fragments: 900 WebSockets each send the first 60 KB fragment of a compressed message and
             never the rest: RSS after 2 s and after 15 s;
  webhooks:  8 Pusher connections subscribe to new channels for 5 s in an app that posts
             webhooks: how many subscribes (each a channel_occupied, then a vacated) pass.
Loopback only; it stops by itself. Every probe by default.
"""
import base64, http.client, json, os, socket, struct, subprocess, sys, tempfile, threading, time
import urllib.request, zlib

BIN = sys.argv[1]
PROBES = sys.argv[2:] or ["outbox", "bookmarks", "rate", "deflate", "idempotency", "fragments",
                          "webhooks"]
PORT = 18098
HOST = f"127.0.0.1:{PORT}"
KEY = "probe-api-key-16b"
CONFIG = """
[[pusher.apps]]
id = "1"
key = "probe-key"
secret = "probe-secret-0123456789"
resume_window = "30s"
webhook_url = "http://127.0.0.1:9/"
webhook_events = ["channel_occupied", "channel_vacated"]

[namespaces.open]
publish = "anyone"
"""


def start():
    d = tempfile.mkdtemp()
    path = os.path.join(d, "herald.toml")
    with open(path, "w") as f:
        f.write(CONFIG)
    srv = subprocess.Popen([BIN, "serve", "--config", path, "--listen", HOST, "--api-key", KEY,
                            "--data-dir", os.path.join(d, "data"), "--log-level", "error"],
                           stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://{HOST}/healthz").read()
            return srv
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the server did not start")


def rss(srv):
    with open(f"/proc/{srv.pid}/status") as f:
        return next(int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS"))


def cpu(srv):
    s = open(f"/proc/{srv.pid}/stat").read()
    f = s[s.rfind(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def ws_open(path, extra=""):
    s = socket.create_connection(("127.0.0.1", PORT))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    assert b" 101 " in buf.split(b"\r\n")[0], buf
    return s, buf.split(b"\r\n\r\n", 1)[1]


def frame(data, compressed=False):
    data = data.encode() if isinstance(data, str) else data
    n, mask = len(data), os.urandom(4)
    first = 0xC1 if compressed else 0x81
    hdr = bytes([first]) + (bytes([0x80 | n]) if n < 126 else
                            bytes([0xFE]) + struct.pack(">H", n) if n < 65536 else
                            bytes([0xFF]) + struct.pack(">Q", n))
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return hdr + mask + masked


class Reader:
    """Text messages of a socket, in order (pings and the rest skipped)."""

    def __init__(self, s, early=b""):
        self.s, self.buf = s, early

    def _rd(self, k):
        while len(self.buf) < k:
            c = self.s.recv(65536)
            if not c:
                raise EOFError("closed")
            self.buf += c
        out, self.buf = self.buf[:k], self.buf[k:]
        return out

    def next(self):
        while True:
            h = self._rd(2)
            n = h[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._rd(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._rd(8))[0]
            body = self._rd(n)
            if h[0] & 0x0F == 1:
                return json.loads(body)
            if h[0] & 0x0F == 8:
                raise EOFError("closed by the server")


def api(path, body):
    r = urllib.request.Request(f"http://{HOST}{path}", json.dumps(body).encode(),
                               {"Authorization": f"apikey {KEY}", "Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r).read())


def heartbeats(n):
    return "\n".join(f'[null,"{i}","phoenix","heartbeat",{{}}]' for i in range(n))


def outbox(srv):
    before, c0 = rss(srv), cpu(srv)
    conn = http.client.HTTPConnection("127.0.0.1", PORT)
    body = heartbeats(64 * 1024 // 38)[: 64 * 1024 - 100]
    body = body[: body.rfind("\n")]

    def session():
        conn.request("GET", "/socket/longpoll?vsn=2.0.0")
        return json.loads(conn.getresponse().read())["token"]

    token, statuses, sessions = session(), {}, 1
    until = time.time() + 8
    while time.time() < until:
        conn.request("POST", f"/socket/longpoll?vsn=2.0.0&token={token}", body)
        status = json.loads(conn.getresponse().read())["status"]
        statuses[status] = statuses.get(status, 0) + 1
        if status != 200:
            token, sessions = session(), sessions + 1
    after, used = rss(srv), cpu(srv) - c0
    time.sleep(40)
    print(f"outbox: POST answers {statuses} over {sessions} session(s); RSS +{after - before:.0f} MB "
          f"after 8 s (CPU {used / 8 * 100:.0f} % of a core), +{rss(srv) - before:.0f} MB 40 s later")


def bookmarks(srv):
    before = rss(srv)
    names = [f"{i:0>160}" for i in range(300)]

    def pages(k):
        for p in range(k, 600, 4):
            s, early = ws_open(f"/resume/page-{p:0>20}/app/probe-key?protocol=7")
            r = Reader(s, early)
            r.next()
            s.sendall(b"".join(frame(json.dumps({"event": "pusher:subscribe", "data": {"channel": n}}))
                               for n in names))
            s.sendall(frame(json.dumps({"event": "pusher:ping", "data": {}})))
            while r.next().get("event") != "pusher:pong":
                pass
            s.close()

    started = time.time()
    threads = [threading.Thread(target=pages, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - started
    time.sleep(2)
    after = rss(srv)
    time.sleep(45)
    print(f"bookmarks: 600 pages in {took:.0f} s; RSS +{after - before:.0f} MB after them, "
          f"+{rss(srv) - before:.0f} MB 45 s later")


def rate(srv):
    s, early = ws_open("/socket/websocket?vsn=2.0.0")
    r = Reader(s, early)
    s.sendall(b"".join(frame(f'[null,"{i}","phoenix","heartbeat",{{}}]') for i in range(5000)))
    ok = 0
    for _ in range(5000):
        ok += r.next()[4]["status"] == "ok"
    s.sendall(frame('["1","j","open:flood","phx_join",{}]'))
    while r.next()[1] != "j":
        pass
    payload = json.dumps({"text": "x" * 1000})
    stop = time.time() + 5
    def drain():
        try:
            while True:
                r.next()
        except (EOFError, OSError):
            pass

    threading.Thread(target=drain, daemon=True).start()
    while time.time() < stop:
        s.sendall(b"".join(frame(f'["1",null,"open:flood","shout",{payload}]') for _ in range(50)))
    time.sleep(1)
    top = api("/api/publish", {"channel": "open:flood", "data": "last"})["offset"] - 1
    print(f"rate: {ok} of 5,000 heartbeats answered; {top} publications of 1 KB stored in 5 s")


def deflate(srv):
    for path, message in [("/connection/websocket", b"\n" * 60000),
                          ("/socket/websocket?vsn=2.0.0",
                           b'[null,"1","phoenix","heartbeat",{}' + b" " * 60000 + b"]")]:
        z = zlib.compressobj(9, zlib.DEFLATED, -15)
        bomb = (z.compress(message) + z.flush(zlib.Z_SYNC_FLUSH))[:-4]
        s, _ = ws_open(path, "Sec-WebSocket-Extensions: permessage-deflate\r\n")
        s.setblocking(False)
        frames = frame(bomb, True) * 100
        c0, t0, sent = cpu(srv), time.time(), 0
        while time.time() - t0 < 5:
            try:
                sent += s.send(frames)
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                break
        used = cpu(srv) - c0
        print(f"deflate {path}: {len(bomb)}-byte messages, {sent / 5 / 1e6:.2f} MB/s sent; "
              f"server CPU {used / (time.time() - t0) * 100:.0f} % of a core")
        s.close()


def idempotency(srv):
    s, early = ws_open("/connection/websocket")
    r = Reader(s, early)
    s.sendall(frame('{"id":1,"publish":{"channel":"open:orders","data":"forged","idempotency_key":"order-42"}}'))
    forged = r.next()
    real = api("/api/publish", {"channel": "open:orders", "data": "real", "idempotency_key": "order-42"})
    print(f"idempotency: the client's {forged.get('publish')}; the backend's {real}")


def fragments(srv):
    before = rss(srv)
    piece = os.urandom(60000)
    socks = []
    for _ in range(900):
        s, _ = ws_open("/connection/websocket", "Sec-WebSocket-Extensions: permessage-deflate\r\n")
        f = bytearray(frame(piece, True))
        f[0] = 0x41  # RSV1 and text, FIN clear: the first of several fragments
        s.sendall(bytes(f))
        socks.append(s)
    time.sleep(2)
    after = rss(srv)
    time.sleep(13)
    print(f"fragments: 900 unfinished messages: RSS +{after - before:.0f} MB after 2 s, "
          f"+{rss(srv) - before:.0f} MB after 15 s")
    for s in socks:
        s.close()


def webhooks(srv):
    counts = {"ok": 0, "refused": 0}

    def connection(c):
        s, early = ws_open("/app/probe-key?protocol=7")
        r = Reader(s, early)
        r.next()
        stop, i = time.time() + 5, 0
        while time.time() < stop:
            names = [f"new-{c}-{i + k}" for k in range(100)]
            s.sendall(b"".join(frame(json.dumps({"event": "pusher:subscribe", "data": {"channel": n}}))
                               for n in names))
            s.sendall(b"".join(frame(json.dumps({"event": "pusher:unsubscribe", "data": {"channel": n}}))
                               for n in names))
            for _ in range(100):
                m = r.next()
                if m["event"] == "pusher_internal:subscription_succeeded":
                    counts["ok"] += 1
                elif m["event"] == "pusher:subscription_error":
                    counts["refused"] += 1
            i += 100
            time.sleep(0.5)

    threads = [threading.Thread(target=connection, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"webhooks: 8 connections, 5 s: {counts['ok']} subscribes to new channels passed (each a "
          f"channel_occupied, then a channel_vacated), {counts['refused']} refused")


for probe in PROBES:
    srv = start()
    try:
        globals()[probe](srv)
    finally:
        srv.kill()
        srv.wait()

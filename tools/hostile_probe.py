#!/usr/bin/env python3
"""What one client address can make a `herald serve` cost (docs/security.md, issue #38).

    python3 tools/hostile_probe.py ./target/release/herald   # N=12 by default

Starts the given binary on 127.0.0.1:18099 with its defaults, then, from this one address:
  1. 950 sockets each send 23 KiB of a request head on a held route and never finish it:
     the server's CPU over 5 s, and /healthz's latency meanwhile;
  2. 300 sockets (4 KiB receive buffers) each POST N history reads of a ~1 MiB channel to
     /connection/send and never read the answer: the server's RSS and the machine's memory
     in use before, 3 s after, and after the write deadline (15 s, 25 s);
  3. FLOOD seconds (60 by default; 0 skips it) of polls naming 512 new channels each, over 4
     kept-alive connections, in a namespace with presence (`chat:`) and in one without: the
     server's RSS during the flood, and 5 s and 90 s after it (streams nobody wrote to are
     forgotten a minute after their last reader).
Run it with `ulimit -n 8192`. Loopback only; it stops by itself.
"""
import json, os, socket, statistics, subprocess, sys, tempfile, threading, time, urllib.request

BIN = sys.argv[1]
N = int(os.environ.get("N", "12"))
FLOOD = int(os.environ.get("FLOOD", "60"))
PORT = 18099
HOST = f"127.0.0.1:{PORT}"
B = f"http://{HOST}"
srv = subprocess.Popen([BIN, "serve", "--listen", HOST, "--api-key", "probe-api-key-16b", "--data-dir",
                        tempfile.mkdtemp(), "--log-level", "warn"], stderr=subprocess.DEVNULL)
try:
    for _ in range(100):
        try:
            urllib.request.urlopen(B + "/healthz").read()
            break
        except OSError:
            time.sleep(0.1)

    def rss():
        with open(f"/proc/{srv.pid}/status") as f:
            return next(int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS"))

    def in_use():
        with open("/proc/meminfo") as f:
            return -next(int(l.split()[1]) // 1024 for l in f if l.startswith("MemAvailable"))

    def cpu():
        s = open(f"/proc/{srv.pid}/stat").read()
        f = s[s.rfind(")") + 2:].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def healthz():
        t = time.perf_counter()
        urllib.request.urlopen(B + "/healthz").read()
        return (time.perf_counter() - t) * 1000

    idle = [healthz() for _ in range(20)]
    print(f"idle: /healthz p50 {statistics.median(idle):.2f} ms")

    socks = []
    pad = "a" * (23 * 1024)
    for _ in range(950):
        s = socket.create_connection(("127.0.0.1", PORT))
        s.sendall(f"GET /connection/sse?channel=chat:a&_={pad} HTTP/1.1\r\nHost: {HOST}\r\n".encode())
        socks.append(s)
    time.sleep(0.5)
    c0, t0, lat = cpu(), time.time(), []
    while time.time() - t0 < 5:
        lat.append(healthz())
        time.sleep(0.05)
    c1, t1 = cpu(), time.time()
    print(f"950 unfinished heads: CPU {100 * (c1 - c0) / (t1 - t0):.1f} % of one core; "
          f"/healthz p50 {statistics.median(lat):.2f} ms, max {max(lat):.2f} ms")
    for s in socks:
        s.close()
    time.sleep(0.5)

    big = "h" * (60 * 1024)
    for _ in range(18):
        req = urllib.request.Request(B + "/api/publish", data=json.dumps({"channel": "chat:big", "data": big}).encode(),
                                     headers={"Authorization": "apikey probe-api-key-16b"})
        urllib.request.urlopen(req).read()
    time.sleep(1)
    r0, m0 = rss(), in_use()
    body = "".join(json.dumps({"id": i, "history": {"channel": "chat:big", "limit": 1000}}) + "\n" for i in range(N)).encode()
    socks = []
    for _ in range(300):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", PORT))
        s.sendall(b"POST /connection/send HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n" % (HOST.encode(), len(body)) + body)
        socks.append(s)
    waited = 0
    for at in (3, 15, 25):
        time.sleep(at - waited)
        waited = at
        print(f"300 unread answers ({N} history reads each), {at} s: server RSS {rss() - r0:+.0f} MB, "
              f"machine memory in use {in_use() - m0:+d} MB")
    for s in socks:
        s.close()
    time.sleep(15)

    def poll_flood(prefix, until, counts):
        s = socket.create_connection(("127.0.0.1", PORT))
        f = s.makefile("rb")
        n = 0
        while time.time() < until:
            q = "&".join(f"channel={prefix}{n}y{i}" for i in range(512))
            n += 1
            s.sendall(f"GET /connection/poll?{q} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
            status = f.readline().split()[1].decode()
            counts[status] = counts.get(status, 0) + 1
            length = 0
            while (h := f.readline()) not in (b"\r\n", b""):
                if h.lower().startswith(b"content-length"):
                    length = int(h.split(b":")[1])
            f.read(length)
        s.close()

    for ns in ("chat:", "") if FLOOD else ():
        r0, counts, peak = rss(), {}, 0
        until = time.time() + FLOOD
        workers = [threading.Thread(target=poll_flood, args=(f"{ns}flood{w}x", until, counts)) for w in range(4)]
        for w in workers:
            w.start()
        while time.time() < until:
            time.sleep(1)
            peak = max(peak, rss() - r0)
        for w in workers:
            w.join()
        time.sleep(5)
        soon = rss() - r0
        time.sleep(85)
        print(f"{FLOOD} s read flood in {ns or 'a namespace without presence'} ({counts}): "
              f"server RSS at most {peak:+.0f} MB during it, {soon:+.0f} MB 5 s after, {rss() - r0:+.0f} MB 90 s after")
finally:
    srv.kill()

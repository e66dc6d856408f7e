#!/usr/bin/python3
"""qkv serve under load and abuse, on loopback only, bounded in count and time (about a minute).

    /usr/bin/python3 tests/serve_abuse_test.py --qkv build/qkv [--keep DIR]

Trains a tiny language model, starts `qkv serve`, and while a prober asks /health every 0.2 s on a
fresh connection (each answer must come within a second, all the time), it:

  * sends invalid UTF-8 everywhere a request has bytes: the path (raw and %-escaped), the query,
    a header's name and value, the body of every JSON route: each gets a 4xx naming the problem,
    never a 5xx, a crash or a hang;
  * opens 40 slow clients that send one header line a second: the server closes them once the
    header deadline passes, and /health keeps answering meanwhile;
  * floods one request with header lines (up to 64 MiB): 431, the connection closed, and the
    server's memory does not grow by more than a few MiB;
  * sends a malformed and a 2 GB Content-Length: 400 and 413 at once, not after a timeout;
  * sends 200 concurrent completions: every answer is 200 or 429, never 5xx;
  * disconnects mid-request and mid-stream;
  * checks that a kept-alive connection answers without the 40 ms Nagle / delayed-ACK stall
    and says nothing of a keep-alive maximum of 5;
  * refuses a Host header that is not the server's name (DNS rebinding) and accepts --allow-host;
  * caps connections per client (--max-client-connections) with a 503;
  * starts a second `qkv serve` and a `qkv explore` on the same port: both exit 2 with "address
    already in use";
  * then sends SIGTERM with slow and idle clients still connected: the server exits 0 within
    seconds.

Prints one line per check and "N passed, M failed"; exit status 1 if any failed.
"""
import argparse
import http.client
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_test import Checks, Server, tiny_lm  # noqa: E402


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def raw(port, data, timeout=5.0, read=True):
    """Sends bytes on a fresh connection; returns (status, body text) of the answer, or (None, why)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return None, ""
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return None, "timeout after %r" % buf[:200]
            except ConnectionResetError:
                break
            if not chunk:
                break
            buf += chunk
            m = re.match(rb"HTTP/1\.1 (\d+)[^\r]*\r\n(.*?)\r\n\r\n", buf, re.S)
            if m:
                length = re.search(rb"(?i)content-length: *(\d+)", m.group(2))
                if length and len(buf) >= m.end() + int(length.group(1)):
                    break
        m = re.match(rb"HTTP/1\.1 (\d+)[^\r]*\r\n.*?\r\n\r\n(.*)", buf, re.S)
        if not m:
            return None, "no answer: %r" % buf[:200]
        return int(m.group(1)), m.group(2).decode("utf-8", "replace")
    finally:
        s.close()


def probe_loop(port, stop, times):
    """GET /health every 0.2 s on a fresh connection until stop is set; appends each answer's time
    (-1: failed). Runs in a process of its own, so the clients' threads cannot delay it."""
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            c.close()
            times.append(time.monotonic() - t0 if r.status == 200 else -1.0)
        except OSError:
            times.append(-1.0)
        stop.wait(max(0.0, 0.2 - (time.monotonic() - t0)))


class Prober:
    def __init__(self, port):
        self.manager = multiprocessing.Manager()
        self.times = self.manager.list()
        self.stop = multiprocessing.Event()
        self.proc = multiprocessing.Process(target=probe_loop, args=(port, self.stop, self.times), daemon=True)

    def start(self):
        self.proc.start()

    def join(self):
        self.proc.join(10)
        out = [None if t < 0 else t for t in self.times]
        self.manager.shutdown()
        return out


def expect_4xx(ck, what, status, body, needle=None):
    ok = status is not None and 400 <= status < 500
    if ok and needle:
        ok = needle in body
    ck.report(ok, what, "%s %s" % (status, body[:200]))


def utf8_checks(ck, port):
    H = b"Host: 127.0.0.1\r\n"
    st, body = raw(port, b"GET /\xff HTTP/1.1\r\n" + H + b"\r\n")
    expect_4xx(ck, "a raw 0xFF byte in the path: 4xx", st, body)
    for path in (b"/%ff", b"/v1/%c3", b"/%ff%fe%00"):
        st, body = raw(port, b"POST " + path + b" HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n\r\n")
        expect_4xx(ck, "the path %s: 404" % path.decode(), st, body, "no route")
    st, body = raw(port, b"GET /v1/claims?seed=%ff HTTP/1.1\r\n" + H + b"\r\n")
    expect_4xx(ck, "/v1/claims?seed=%ff: 400 naming seed", st, body, "seed")
    st, body = raw(port, b"GET /health HTTP/1.1\r\n" + H + b"X-Bad: \xff\xfe\r\n\r\n")
    ck.report(st == 200 or (st is not None and 400 <= st < 500), "a header value with 0xFF: no 5xx", st)
    st, body = raw(port, b"GET /health HTTP/1.1\r\n" + H + b"X-\xff: 1\r\n\r\n")
    expect_4xx(ck, "a header name with 0xFF: 400", st, body)
    st, body = raw(port, b"GET /health HTTP/1.1\r\n" + H + b"Authorization: Bearer \xff\r\n\r\n")
    ck.report(st == 200, "an Authorization header with 0xFF on an open route: 200", st)
    for route, field in (("/v1/completions", "prompt"), ("/v1/next-token", "text"), ("/v1/attend", "q"),
                         ("/v1/attention", "text"), ("/v1/translations", "text")):
        data = b'{"' + field.encode() + b'": "The \xff\xfe"}'
        st, body = raw(port, b"POST " + route.encode() + b" HTTP/1.1\r\n" + H +
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        expect_4xx(ck, "invalid UTF-8 in the body of %s: 400" % route, st, body)
    data = b'{"prompt": "x", "\xff": 1}'
    st, body = raw(port, b"POST /v1/completions HTTP/1.1\r\n" + H + b"Content-Length: %d\r\n\r\n" % len(data) + data)
    expect_4xx(ck, "invalid UTF-8 in a field name: 400 naming the body", st, body, "UTF-8")


def slow_clients(port, n, seconds, out):
    """n connections sending a header line a second; out[i] <- seconds until the server closed it."""
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        s.setblocking(False)
        socks.append(s)
    t0 = time.monotonic()
    closed = [None] * n
    k = 0
    while time.monotonic() - t0 < seconds and any(c is None for c in closed):
        for i, s in enumerate(socks):
            if closed[i] is not None:
                continue
            try:
                if s.recv(4096) == b"":
                    closed[i] = time.monotonic() - t0
                    continue
            except BlockingIOError:
                pass
            except OSError:
                closed[i] = time.monotonic() - t0
                continue
            try:
                s.sendall(b"X-Slow-%d: %d\r\n" % (k, k))
            except OSError:
                closed[i] = time.monotonic() - t0
        k += 1
        time.sleep(1.0)
    for s in socks:
        s.close()
    out.extend(closed)


def header_flood(port, limit_bytes):
    """Sends header lines until the server answers or closes; returns (status, bytes sent)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    line = b"X-Flood: " + b"a" * 1000 + b"\r\n"
    sent = 0
    answer = b""
    try:
        while sent < limit_bytes:
            s.sendall(line * 64)
            sent += len(line) * 64
    except OSError:
        pass
    try:
        s.settimeout(5)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    except OSError:
        pass
    s.close()
    m = re.match(rb"HTTP/1\.1 (\d+)", answer)
    return (int(m.group(1)) if m else None), sent


def concurrent_completions(srv, n):
    statuses = []
    lock = threading.Lock()

    def one(i):
        try:
            st, body = srv.request("POST", "/v1/completions", {"prompt": "And God said", "max_tokens": 4,
                                                                 "temperature": 0, "stream": i % 3 == 0},
                                   key=None, timeout=60)
        except (OSError, http.client.HTTPException, ValueError) as e:
            st = "exception %r" % e
        with lock:
            statuses.append(st)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(90)
    return statuses


def disconnects(port):
    # half a request, then gone
    for i in range(20):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"pro")
        s.close()
    # a streamed completion, closed after its first bytes
    for i in range(10):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        body = json.dumps({"prompt": "And God", "max_tokens": 40, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        s.recv(100)
        s.close()


def keepalive_checks(ck, srv):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
    times, headers = [], []
    for i in range(20):
        t0 = time.monotonic()
        c.request("POST", "/v1/next-token", body=json.dumps({"text": "And God"}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        times.append(time.monotonic() - t0)
        headers.append(r.getheader("Keep-Alive"))
    c.close()
    med = statistics.median(times[1:])
    # Nagle against delayed ACKs shows as 40 ms on every request after the first
    ck.report(med < 0.035, "a kept-alive connection: no 40 ms stall (median of 19 requests %.1f ms)" % (med * 1e3))
    ck.report(all(h is None or "max=5" not in h for h in headers), "no 'Keep-Alive: max=5'", headers[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--keep")
    a = ap.parse_args()
    qkv = os.path.abspath(a.qkv)
    work = a.keep or tempfile.mkdtemp(prefix="serve_abuse.")
    os.makedirs(work, exist_ok=True)
    lm = tiny_lm(qkv, work)
    ck = Checks()
    srv = Server(qkv, lm, "--max-queue", "32", "--slots", "4")
    pid = srv.proc.pid
    prober = Prober(srv.port)
    prober.start()
    try:
        utf8_checks(ck, srv.port)
        ck.report(srv.proc.poll() is None, "the server is alive after the invalid UTF-8", srv.proc.poll())

        # slow clients, in the background while the rest goes on
        slow = []
        slow_t = threading.Thread(target=slow_clients, args=(srv.port, 40, 16, slow))
        slow_t.start()

        rss0 = rss_kib(pid)
        st, sent = header_flood(srv.port, 64 << 20)
        rss1 = rss_kib(pid)
        ck.report(st == 431, "a header flood gets 431 (%d bytes sent before the server closed)" % sent, st)
        ck.report(rss1 - rss0 < 32 << 10, "the flood grew the server by %d KiB (< 32 MiB)" % (rss1 - rss0))

        t0 = time.monotonic()
        st, body = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2000000000\r\n\r\n{")
        ck.report(st == 413 and time.monotonic() - t0 < 2, "a 2 GB Content-Length: 413 at once", (st, body[:100]))
        st, body = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 12x\r\n\r\n{")
        ck.report(st == 400 and "Content-Length" in body, "a malformed Content-Length: 400", (st, body[:100]))
        st, body = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
                       b"Content-Length: 7\r\n\r\n{}")
        ck.report(st == 400, "two different Content-Lengths: 400", (st, body[:100]))

        statuses = concurrent_completions(srv, 200)
        ok = len(statuses) == 200 and all(s in (200, 429) for s in statuses)
        ck.report(ok, "200 concurrent completions: each 200 or 429 (%d answered 200)" % statuses.count(200),
                  sorted(set(map(str, statuses))))
        disconnects(srv.port)
        st, body = srv.request("GET", "/health", key=None)
        ck.report(st == 200, "healthy after the disconnects", (st, body))

        keepalive_checks(ck, srv)

        st, body = raw(srv.port, b"GET /health HTTP/1.1\r\nHost: evil.example:%d\r\n\r\n" % srv.port)
        ck.report(st == 403 and "Host" in body, "Host: evil.example (DNS rebinding): 403", (st, body[:120]))
        for h in (b"localhost", b"127.0.0.1", b"LOCALHOST.", b"127.0.0.1:%d" % srv.port, b"localhost:%d" % srv.port):
            st, body = raw(srv.port, b"GET /health HTTP/1.1\r\nHost: " + h + b"\r\n\r\n")
            ck.report(st == 200, "Host: %s: 200" % h.decode(), st)

        slow_t.join(30)
        closed = [c for c in slow if c is not None]
        ck.report(len(slow) == 40 and len(closed) == 40 and max(closed) < 14,
                  "40 slow clients (a header line a second) closed by the header deadline (10 s): last after %.1f s"
                  % (max(closed) if closed else -1), slow[:5])
    finally:
        prober.stop.set()
        times = prober.join()
    answered = [t for t in times if t is not None]
    ck.report(len(times) > 50 and len(answered) == len(times) and max(answered) < 1.0,
              "/health answered every probe (%d of %d) within a second (slowest %.3f s)"
              % (len(answered), len(times), max(answered) if answered else -1))

    # a second server, and an explorer, on the same port
    for cmd in (["serve"], ["explore", "--no-open"]):
        p = subprocess.run([qkv, "--threads", "1"] + cmd + ["--model", lm, "--port", str(srv.port)],
                           capture_output=True, text=True, timeout=60)
        ck.report(p.returncode == 2 and "address already in use" in p.stderr,
                  "a second qkv %s on the same port exits 2: address already in use" % cmd[0],
                  (p.returncode, p.stderr.strip()[-200:]))

    # SIGTERM with idle and half-sent requests connected
    idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(5)]
    half = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(5)]
    for s in half:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{")
    time.sleep(0.3)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    try:
        rc = srv.proc.wait(10)
    except subprocess.TimeoutExpired:
        rc = None
        srv.proc.kill()
        srv.proc.wait()
    ck.report(rc == 0, "SIGTERM with 10 idle and half-sent connections: exit 0 in %.2f s" % (time.monotonic() - t0), rc)
    for s in idle + half:
        s.close()

    # Host names by flag, and connections per client
    srv2 = Server(qkv, lm, "--allow-host", "qkv.example", "--max-client-connections", "4")
    try:
        st, _ = raw(srv2.port, b"GET /health HTTP/1.1\r\nHost: qkv.example:%d\r\n\r\n" % srv2.port)
        ck.report(st == 200, "--allow-host qkv.example: Host qkv.example answered", st)
        st, _ = raw(srv2.port, b"GET /health HTTP/1.1\r\nHost: other.example\r\n\r\n")
        ck.report(st == 403, "... and other names still 403", st)
        held = [socket.create_connection(("127.0.0.1", srv2.port)) for _ in range(4)]
        time.sleep(0.2)
        st, body = raw(srv2.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        ck.report(st == 503 and "connections" in body, "a fifth connection with --max-client-connections 4: 503",
                  (st, body[:120]))
        for s in held:
            s.close()
        time.sleep(0.2)
        st, _ = raw(srv2.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        ck.report(st == 200, "... and once they close, 200 again", st)
    finally:
        srv2.stop()

    print("%d passed, %d failed" % (ck.passed, ck.failed))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ck.failed == 0 else 1)


if __name__ == "__main__":
    main()

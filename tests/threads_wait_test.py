#!/usr/bin/python3
"""How qkv's OpenMP threads wait on a busy machine (issue 20, part 2).

    /usr/bin/python3 tests/threads_wait_test.py --qkv build/qkv

With another process busy on the machine (a shell loop), a qkv started with neither
OMP_WAIT_POLICY nor GOMP_SPINCOUNT set must run with OMP_WAIT_POLICY=passive (threads that sleep
rather than spin while the thread they wait for queues behind the other process), and say so;
a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT must stand untouched. The running server's
environment is read from /proc/PID/environ. (The idle case, where libgomp's spinning default
stands, is not tested here: other tests run beside this one.)

Prints one line per check and "N passed, M failed"; exit status 1 if any failed.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_test import Checks, tiny_lm  # noqa: E402


def environ_of(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)


def start_serve(qkv, model, env):
    p = subprocess.Popen([qkv, "serve", "--model", model, "--port", "0"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("http://"):
        p.kill()
        sys.exit("threads_wait_test: qkv serve did not start: %r %s" % (line, p.stderr.read()))
    e = environ_of(p.pid)
    p.terminate()
    _, err = p.communicate(timeout=30)
    return e, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", required=True)
    a = ap.parse_args()
    qkv = os.path.abspath(a.qkv)
    work = tempfile.mkdtemp(prefix="threads_wait.")
    lm = tiny_lm(qkv, work, steps=2)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "QKV_NO_REEXEC", "QKV_THREADS_WAIT")}
    ck = Checks()
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(max(1, (os.cpu_count() or 2) // 2))]
    try:
        time.sleep(0.2)
        e, err = start_serve(qkv, lm, clean)
        ck.report(e.get(b"OMP_WAIT_POLICY") == b"passive",
                  "another process busy: qkv serve's threads wait passively (OMP_WAIT_POLICY=passive)",
                  e.get(b"OMP_WAIT_POLICY"))
        ck.report("threads wait passive (other processes kept" in err, "... and it says so", err.strip()[-200:])
        e, err = start_serve(qkv, lm, dict(clean, GOMP_SPINCOUNT="1234"))
        ck.report(e.get(b"GOMP_SPINCOUNT") == b"1234" and b"OMP_WAIT_POLICY" not in e,
                  "the user's GOMP_SPINCOUNT stands, no policy added", (e.get(b"GOMP_SPINCOUNT"), e.get(b"OMP_WAIT_POLICY")))
        e, err = start_serve(qkv, lm, dict(clean, OMP_WAIT_POLICY="active"))
        ck.report(e.get(b"OMP_WAIT_POLICY") == b"active", "the user's OMP_WAIT_POLICY=active stands",
                  e.get(b"OMP_WAIT_POLICY"))
        t0 = time.monotonic()
        p = subprocess.run([qkv, "serve", "--help"], env=clean, capture_output=True, text=True, timeout=30)
        ck.report(p.returncode == 0 and "--allow-host" in p.stdout, "--help answers without looking at the load",
                  "%.3f s" % (time.monotonic() - t0))
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print("%d passed, %d failed" % (ck.passed, ck.failed))
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ck.failed == 0 else 1)


if __name__ == "__main__":
    main()

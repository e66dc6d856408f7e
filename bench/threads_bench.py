#!/usr/bin/python3
"""How OpenMP's wait policy serves an idle machine and a busy one (BENCHMARKS.md, "Threads on a busy
machine").

    /usr/bin/python3 bench/threads_bench.py --qkv build/qkv [--rounds 3] [--spins 300000,passive,default]

Workloads, each a `qkv bench` command that prints JSON:
  decode-tiny   a tiny language model (trained here for 4 steps), 64 tokens at batch 1
  decode-gpt2   GPT-2 small (random weights), 32 tokens at batch 1
  train-tiny    the tiny model, 15 steps of 8 x 64 tokens
  serve-tiny    `qkv serve` on the tiny model: 10 completions of 32 tokens, one after another
Policies (the environment of the run):
  300000        GOMP_SPINCOUNT=300000: libgomp's own default (what qkv ran before it set one)
  passive       OMP_WAIT_POLICY=passive: sleep at once
  default       nothing set: qkv's own default
  N             GOMP_SPINCOUNT=N
Each (workload, policy) runs idle and then beside one busy process (a shell loop), alternating the
policies round by round; the median of the rounds is printed, in tokens/s.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from serve_test import tiny_lm  # noqa: E402


def env_for(policy):
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "passive"
    elif policy != "default":
        env["GOMP_SPINCOUNT"] = policy
    return env


def serve_run(qkv, lm, env):
    """Tokens per second of 10 greedy completions of 32 tokens from a fresh `qkv serve`."""
    p = subprocess.Popen([qkv, "serve", "--model", lm, "--port", "0"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        host, port = p.stdout.readline().strip()[len("http://"):].rstrip("/").split(":")
        body = json.dumps({"prompt": "And God said", "max_tokens": 32, "temperature": 0})
        tokens = 0
        t0 = time.monotonic()
        for i in range(10):
            c = http.client.HTTPConnection(host, int(port), timeout=300)
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            tokens += json.loads(c.getresponse().read())["usage"]["completion_tokens"]
            c.close()
        return tokens / (time.monotonic() - t0)
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spins", default="300000,passive,default")
    ap.add_argument("--workloads", default="decode-tiny,decode-gpt2,train-tiny,serve-tiny")
    a = ap.parse_args()
    qkv = os.path.abspath(a.qkv)
    work = tempfile.mkdtemp(prefix="threads_bench.")
    lm = tiny_lm(qkv, work)
    cmds = {
        "decode-tiny": ["bench", "decode", "--model", lm, "--tokens", "64", "--reps", "3", "--json"],
        "decode-gpt2": ["bench", "decode", "--model", "gpt2-small", "--tokens", "32", "--reps", "2", "--json"],
        "train-tiny": ["bench", "train", "--model", lm, "--steps", "15", "--warmup", "2", "--batch", "8", "--seq", "64",
                       "--json"],
    }
    policies = a.spins.split(",")
    workloads = a.workloads.split(",")
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    print("threads_bench: %s, %d cores, qkv's default threads; %d rounds" % (cpu, os.cpu_count(), a.rounds))
    results = {}
    for busy in (False, True):
        hog = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if busy else None
        try:
            for r in range(a.rounds):
                for w in workloads:
                    order = policies if r % 2 == 0 else list(reversed(policies))
                    for p in order:
                        if w == "serve-tiny":
                            results.setdefault((busy, w, p), []).append(serve_run(qkv, lm, env_for(p)))
                            continue
                        out = subprocess.run([qkv] + cmds[w], env=env_for(p), capture_output=True, text=True,
                                             timeout=600)
                        if out.returncode != 0:
                            sys.exit("threads_bench: %s failed: %s" % (" ".join(cmds[w]), out.stderr))
                        j = json.loads(out.stdout)
                        tps = j.get("tokens_per_s", j.get("throughput_tokens_per_s"))
                        results.setdefault((busy, w, p), []).append(tps)
        finally:
            if hog:
                hog.kill()
                hog.wait()
    print("%-12s %-10s %14s %14s %8s" % ("workload", "policy", "idle tok/s", "busy tok/s", "busy/idle"))
    for w in workloads:
        for p in policies:
            idle = statistics.median(results[(False, w, p)])
            busy = statistics.median(results[(True, w, p)])
            print("%-12s %-10s %14.1f %14.1f %8.2f" % (w, p, idle, busy, busy / idle))


if __name__ == "__main__":
    main()

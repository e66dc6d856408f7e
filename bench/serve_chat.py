#!/usr/bin/python3
"""Chat throughput of qkv serve at several numbers of concurrent clients (figures, not a test).

    bench/serve_chat.py --qkv build/qkv --model MODEL [--chat-template FILE] [--clients 1,4,16]
                        [--tokens 64] [--rounds 2] [--threads 2]

Starts `qkv serve` (--slots as many as the most clients), then for each client count N runs N
clients at once, each streaming /v1/chat/completions (temperature 0.8, its own seed, max_tokens
--tokens, ignoring the end of sequence is not possible: a choice may stop early) for --rounds
requests in a row. Prints per N: generated tokens, wall time, aggregate tokens/s, tokens/s per
client, and the median time to first token. A model without a chat template needs
--chat-template (a ChatML-style file is written when none is given).
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--chat-template")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    counts = [int(x) for x in a.clients.split(",")]
    tpl = a.chat_template
    if not tpl:
        tpl = os.path.join(tempfile.mkdtemp(), "chatml.jinja")
        with open(tpl, "w") as f:
            f.write(CHATML)
    p = subprocess.Popen([a.qkv, "--threads", str(a.threads), "serve", "--model", a.model, "--port", "0",
                          "--slots", str(max(counts)), "--max-queue", str(4 * max(counts)), "--chat-template", tpl],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith("http://"):
        sys.exit("qkv serve did not start: %s %s" % (line, p.stderr.read()))
    host, port = line[len("http://"):].rstrip("/").split(":")

    def chat(seed):
        """One streamed chat request: (generated tokens, seconds to the first content)."""
        c = http.client.HTTPConnection(host, int(port), timeout=600)
        body = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": "Tell me a story about a cat."}],
                "max_tokens": a.tokens, "temperature": 0.8, "seed": seed, "stream": True,
                "stream_options": {"include_usage": True}}
        t0 = time.time()
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        first, tokens, buf = None, 0, b""
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
                if j.get("usage"):
                    tokens = j["usage"]["completion_tokens"]
                for ch in j.get("choices", []):
                    if first is None and ch["delta"].get("content"):
                        first = time.time() - t0
        c.close()
        return tokens, first if first is not None else time.time() - t0

    try:
        chat(0)  # warm up
        print("qkv serve %s, --threads %d, %d new tokens a request at most, %d requests a client" %
              (a.model, a.threads, a.tokens, a.rounds))
        print("%8s %10s %9s %14s %18s %12s" % ("clients", "tokens", "wall s", "tokens/s", "tokens/s/client", "TTFT ms"))
        for n in counts:
            results = []
            lock = threading.Lock()

            def client(i):
                for k in range(a.rounds):
                    got = chat(1000 * i + k)
                    with lock:
                        results.append(got)

            t0 = time.time()
            threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.time() - t0
            tokens = sum(r[0] for r in results)
            print("%8d %10d %9.2f %14.1f %18.1f %12.1f" % (n, tokens, wall, tokens / wall, tokens / wall / n,
                                                          1000 * statistics.median(r[1] for r in results)))
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""qkv serve end to end, from real HTTP clients on loopback (Python's http.client, threads).

    /usr/bin/python3 tests/serve_test.py --qkv build/qkv [--keep DIR]

Trains three tiny models (a language model, a translator, a classifier; a few steps each), starts
`qkv serve` on free ports, and checks:

  * CORS (--cors-origin): preflights and Access-Control-Allow-Origin for the origins given only;
    /v1/models/{id} (models.retrieve) and its 404 model_not_found;
  * the routes: /health, /v1/models, /v1/completions (plain and streamed as server-sent events
    ending in [DONE]; n, stop, logprobs, echo, seed), /v1/next-token, /v1/translations,
    /v1/classifications, each answer's JSON checked field by field;
  * continuous batching: greedy completions under load from parallel clients are identical to
    the same request alone; a streamed completion is the plain one, delta by delta; the
    translator and the classifier answer as `qkv translate` and `qkv classify` do;
  * every limit: a bad API key (401), malformed JSON, unknown fields and out-of-range values
    (400 naming the field), an unknown route (404), a body over --max-body (413), a full queue
    (429), prompt + max_tokens over the context (400);
  * a client that disconnects mid-stream frees its slot;
  * a load of a few hundred mixed good and bad requests from 8 threads, every answer checked,
    then the server still healthy;
  * SIGTERM drains: a stream in flight finishes with [DONE], the process exits 0;
  * /v1/attention: every layer and head, rows summing to 1, causal for a language model, equal to
    `qkv forward --attention` on the same ids, encoder / decoder / cross maps for a translator,
    its limits (--max-attention) and bad requests; /v1/attend (the worked example on any numbers),
    /v1/claims, /v1/model and the page at /.

Prints one line per check and "N passed, M failed"; exit status 1 if any failed.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

KEY = "test-key-123"


class Checks:
    def __init__(self):
        self.passed = self.failed = 0
        self.lock = threading.Lock()

    def report(self, ok, what, detail=""):
        with self.lock:
            if ok:
                self.passed += 1
            else:
                self.failed += 1
            # a failure shows more of its detail: it is what the next person has to go on
            print(("PASS " if ok else "FAIL ") + what + ("  " + str(detail)[:300 if ok else 1500] if detail else ""),
                  flush=True)


def run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    if p.returncode != 0:
        sys.exit("serve_test: %s failed (%d):\n%s%s" % (" ".join(map(str, args)), p.returncode, p.stdout, p.stderr))
    return p.stdout


class Server:
    def __init__(self, qkv, model, *extra):
        self.proc = subprocess.Popen([qkv, "--threads", "2", "serve", "--model", model, "--port", "0"] + list(extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            sys.exit("serve_test: qkv serve did not start: %r %s" % (line, self.proc.stderr.read()))
        host, port = line[len("http://"):].rstrip("/").split(":")
        self.host, self.port = host, int(port)

    def request(self, method, path, body=None, key=KEY, raw=None, timeout=120):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = "Bearer " + key
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=headers)
        r = c.getresponse()
        text = r.read().decode("utf-8")
        c.close()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def stream(self, body, key=KEY, stop_after=None, path="/v1/completions"):
        """The SSE events of a streamed completion (parsed JSON, and 'DONE'); stop_after: close
        the connection after that many events."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = "Bearer " + key
        c.request("POST", path, body=json.dumps(dict(body, stream=True)), headers=headers)
        r = c.getresponse()
        events = []
        if r.status != 200:
            return r.status, json.loads(r.read())
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                line = ev.decode("utf-8")
                assert line.startswith("data: "), line
                payload = line[len("data: "):]
                events.append("DONE" if payload == "[DONE]" else json.loads(payload))
                if stop_after and len(events) >= stop_after:
                    c.close()
                    return r.status, events
        c.close()
        return r.status, events

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def headed(s, method, path, headers, body=None):
    """(status, response headers with lower-cased names, body as parsed JSON or text)."""
    c = http.client.HTTPConnection(s.host, s.port, timeout=120)
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    text = r.read().decode("utf-8")
    h = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    try:
        return r.status, h, json.loads(text)
    except ValueError:
        return r.status, h, text


def cors_checks(ck, qkv, lm):
    """--cors-origin: preflights answered without a key for the origins given, their answers (errors
    and streams too) carrying Access-Control-Allow-Origin; other origins get nothing; a bad origin
    is refused at start. And /v1/models/{id} (OpenAI's models.retrieve)."""
    app, other = "http://localhost:3000", "http://evil.example"
    s = Server(qkv, lm, "--api-key", KEY, "--cors-origin", app, "--cors-origin", "https://app.example:8443")
    try:
        pre = {"Origin": app, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization,content-type"}
        st, h, _ = headed(s, "OPTIONS", "/v1/completions", pre)
        ck.report(st == 204 and h.get("access-control-allow-origin") == app and
                  "POST" in h.get("access-control-allow-methods", "") and
                  h.get("access-control-allow-headers") == "authorization,content-type" and
                  h.get("vary") == "Origin", "CORS preflight from an allowed origin: 204 without a key", (st, h))
        st, h, b = headed(s, "OPTIONS", "/v1/completions", dict(pre, Origin=other))
        ck.report(st == 401 and "access-control-allow-origin" not in h,
                  "CORS preflight from another origin: no CORS headers (the key check answers)", (st, h, b))
        auth = {"Authorization": "Bearer " + KEY}
        st, h, b = headed(s, "GET", "/v1/models", dict(auth, Origin="https://app.example:8443"))
        ck.report(st == 200 and h.get("access-control-allow-origin") == "https://app.example:8443",
                  "an allowed origin's request carries Access-Control-Allow-Origin", (st, h))
        st, h, b = headed(s, "GET", "/v1/models", dict(auth, Origin=other))
        ck.report(st == 200 and "access-control-allow-origin" not in h, "another origin's request: no CORS header", h)
        st, h, b = headed(s, "GET", "/v1/models", {"Origin": app})
        ck.report(st == 401 and h.get("access-control-allow-origin") == app,
                  "an allowed origin can read its 401", (st, h, b))
        c = http.client.HTTPConnection(s.host, s.port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "And", "max_tokens": 3, "stream": True}),
                  headers=dict(auth, Origin=app, **{"Content-Type": "application/json"}))
        r = c.getresponse()
        h = {k.lower(): v for k, v in r.getheaders()}
        r.read()
        c.close()
        ck.report(r.status == 200 and h.get("access-control-allow-origin") == app, "a stream carries the CORS header", h)
        # models.retrieve
        st, lst = s.request("GET", "/v1/models")
        mid = lst["data"][0]["id"]
        st, b = s.request("GET", "/v1/models/" + urllib.parse.quote(mid, safe=""))
        ck.report(st == 200 and b.get("id") == mid and b.get("object") == "model" and isinstance(b.get("created"), int)
                  and b["created"] > 1000000000 and b == lst["data"][0], "/v1/models/{id}: the listed model", b)
        st, b = s.request("GET", "/v1/models/no-such-model")
        error_of(ck, "/v1/models/{unknown id}: 404", st, b, 404, param="model", needle="no-such-model")
        ck.report(isinstance(b, dict) and b.get("error", {}).get("code") == "model_not_found",
                  "an unknown model's code is model_not_found", b)
    finally:
        s.stop()
    # without --cors-origin no origin is answered
    s = Server(qkv, lm)
    try:
        st, h, b = headed(s, "GET", "/v1/models", {"Origin": app})
        ck.report(st == 200 and "access-control-allow-origin" not in h, "no --cors-origin: no CORS header", h)
        st, h, b = headed(s, "OPTIONS", "/v1/models", {"Origin": app, "Access-Control-Request-Method": "GET"})
        ck.report(st == 404 and "access-control-allow-origin" not in h, "no --cors-origin: no preflight", (st, h))
    finally:
        s.stop()
    for bad in ("localhost:3000", "http://a.example/path", "ftp://a.example", "http://"):
        p = subprocess.run([qkv, "serve", "--model", lm, "--port", "0", "--cors-origin", bad], capture_output=True,
                           text=True, timeout=60)
        ck.report(p.returncode != 0 and "not an origin" in p.stderr and bad in p.stderr,
                  "--cors-origin %s is refused" % bad, p.stderr)


def sentencepiece_checks(ck, qkv, work):
    """A language model with a SentencePiece vocabulary: the logprobs' tokens of a completion
    concatenate to its text (word starts keep their space), and /tokenize's pieces to the content
    with SentencePiece's leading space."""
    lm = os.path.join(work, "lm_spm")
    shutil.rmtree(lm, ignore_errors=True)
    run([qkv, "--threads", "2", "train", "--steps", "30", "--preset", "tiny", "--max-len", "48", "--seed", "1",
         "--task", "lm", "--data", os.path.join(work, "text.txt"), "--out", lm, "--vocab", "300"])
    s = Server(qkv, lm)
    try:
        st, b = s.request("POST", "/v1/completions", {"prompt": "And God said", "max_tokens": 12, "temperature": 0,
                                                      "logprobs": 1})
        c = b["choices"][0] if st == 200 else {}
        toks = c.get("logprobs", {}).get("tokens", [])
        ck.report(st == 200 and len(toks) > 0 and "".join(toks) == c["text"] and any(t.startswith(" ") for t in toks),
                  "SentencePiece logprobs: the tokens concatenate to the text", (toks, c.get("text")))
        st, b = s.request("POST", "/tokenize", {"content": "And God said let", "with_pieces": True})
        pieces = [t["piece"] for t in b.get("tokens", [])] if st == 200 else []
        ck.report(st == 200 and "".join(pieces) == " And God said let", "SentencePiece /tokenize pieces", pieces)
    finally:
        s.stop()


def metrics_checks(ck, qkv, lm):
    """--metrics: GET /metrics in Prometheus' text format; its counters move by what the requests
    in between did; without --metrics the route does not exist."""
    import re
    sample = re.compile(r'^[a-z_]+(\{(route="[a-z0-9/{}._-]+",code="[0-9]{3}|le="[0-9.e+-]+|le="\+Inf)"\})? '
                        r'-?[0-9.e+-]+$')

    def scrape(s):
        c = http.client.HTTPConnection(s.host, s.port, timeout=60)
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode("utf-8")
        ctype = r.getheader("Content-Type")
        c.close()
        values = {}
        ok = r.status == 200 and ctype.startswith("text/plain; version=0.0.4")
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                continue
            ok = ok and bool(sample.match(line))
            name, v = line.rsplit(" ", 1)
            values[name] = float(v)
        return ok, values

    s = Server(qkv, lm, "--metrics", "--slots", "3")
    try:
        ok0, m0 = scrape(s)
        st, b = s.request("POST", "/v1/completions", {"prompt": "And God", "max_tokens": 5, "temperature": 0})
        st2, _ = s.stream({"prompt": "And", "max_tokens": 4, "temperature": 0})
        s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": -1})
        ok1, m1 = scrape(s)
        d = lambda k: m1.get(k, 0) - m0.get(k, 0)
        ck.report(ok0 and ok1 and st == st2 == 200 and d("qkv_completions_total") == 2 and
                  d("qkv_prompt_tokens_total") == b["usage"]["prompt_tokens"] + 3 and
                  d("qkv_generated_tokens_total") == b["usage"]["completion_tokens"] + 4 and
                  d('qkv_http_responses_total{route="/v1/completions",code="400"}') == 1 and
                  d('qkv_http_responses_total{route="/v1/completions",code="200"}') == 2 and
                  d('qkv_http_responses_total{route="/metrics",code="200"}') == 1 and
                  m1["qkv_slots"] == 3 and m1["qkv_requests_waiting"] == 0,
                  "/metrics: Prometheus text; counters move by the requests' usage and answers, by route", (m0, m1))
        # histograms: a first token per request, every later token of every choice; buckets cumulative
        ttft = [k for k in m1 if k.startswith("qkv_time_to_first_token_seconds_bucket")]
        ck.report(d("qkv_time_to_first_token_seconds_count") == 2 and
                  d("qkv_time_per_output_token_seconds_count") == (5 - 1) + (4 - 1) and
                  m1['qkv_time_to_first_token_seconds_bucket{le="+Inf"}'] == m1["qkv_time_to_first_token_seconds_count"]
                  and all(m1[a] <= m1[b] for a, b in zip(ttft, ttft[1:])) and
                  m1["qkv_time_to_first_token_seconds_sum"] > 0,
                  "/metrics: time to first token and per output token histograms count every token", m1)
        ck.report(m1["qkv_prompt_cache_tokens"] >= 0 and "qkv_prompt_tokens_cached_total" in m1 and
                  "qkv_prompt_cache_bytes" in m1, "/metrics: the prompt cache's gauges and counter", m1)
    finally:
        s.stop()
    s = Server(qkv, lm)
    try:
        st, b = s.request("GET", "/metrics")
        ck.report(st == 404, "without --metrics there is no /metrics", (st, b))
    finally:
        s.stop()


def prompt_reuse_checks(ck, qkv, lm):
    """Prompt reuse: a prompt that starts with an earlier one's whole chunks takes them from the
    cache (usage.prompt_tokens_details.cached_tokens says how many), and every answer is bitwise
    the one the same requests get without the cache; /slots; bad values refused."""
    C = 8
    rng = random.Random(5)
    prefix = [rng.randrange(32, 120) for _ in range(37)]
    prompts = [prefix + [rng.randrange(32, 120) for _ in range(5)], prefix + [rng.randrange(32, 120) for _ in range(9)]]
    prompts.append(prompts[1] + [rng.randrange(32, 120) for _ in range(12)])  # a growing chat
    prompts.append(prompts[0][:16])                                           # all cached: the last chunk runs
    kept = set()  # the cache's chunks, each as the prefix it ends (prompts share their common chunks)

    def expect(p):
        most = (len(p) - 1) // C
        k = 0
        while k < most and tuple(p[:(k + 1) * C]) in kept:
            k += 1
        kept.update(tuple(p[:(j + 1) * C]) for j in range(len(p) // C))
        return k * C

    def body(p, cache, **kw):
        return dict({"prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 3, "cache_prompt": cache}, **kw)

    s = Server(qkv, lm, "--prompt-chunk", str(C), "--metrics")
    try:
        got, want = [], []
        for p in prompts:
            st, b = s.request("POST", "/v1/completions", body(p, False))
            want.append((st, b["choices"], b["usage"]["prompt_tokens_details"]["cached_tokens"]))
        for p in prompts:
            st, b = s.request("POST", "/v1/completions", body(p, True))
            got.append((st, b["choices"], b["usage"]["prompt_tokens_details"]["cached_tokens"]))
        expected = [expect(p) for p in prompts]
        ck.report(all(g[0] == 200 and g[1] == w[1] for g, w in zip(got, want)),
                  "prompt reuse: greedy answers with their logprobs are bitwise those without the cache",
                  [(g[1][0]["text"], w[1][0]["text"]) for g, w in zip(got, want)])
        ck.report([g[2] for g in got] == expected and expected[1] == 32 and all(w[2] == 0 for w in want),
                  "prompt reuse: usage.prompt_tokens_details.cached_tokens is the cached prefix of whole chunks",
                  ([g[2] for g in got], expected))
        # sampled, n = 2, streamed: the same chunks either way
        sb = dict(body(prompts[2], True), temperature=0.9, seed=11, n=2, stream_options={"include_usage": True})
        st1, ev1 = s.stream(sb)
        st2, ev2 = s.stream(dict(sb, cache_prompt=False))
        text = lambda evs: ["".join(c["text"] for e in evs if e != "DONE" for c in e["choices"] if c["index"] == i)
                            for i in range(2)]
        usage1 = [e["usage"] for e in ev1 if e != "DONE" and e.get("usage")]
        ck.report(st1 == st2 == 200 and text(ev1) == text(ev2) and usage1 and
                  usage1[0]["prompt_tokens_details"]["cached_tokens"] == (len(prompts[2]) - 1) // C * C,
                  "prompt reuse: sampled streamed choices equal, the stream's usage counts the cached tokens",
                  (text(ev1), text(ev2), usage1))
        st, b = s.request("POST", "/v1/completions", body(prompts[0], "yes"))
        error_of(ck, "cache_prompt not a boolean", st, b, 400, "cache_prompt")
        st, text = s.request("GET", "/metrics")
        m = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        reused = sum(expected) + 2 * ((len(prompts[2]) - 1) // C * C)  # the stream's two choices each
        ck.report(st == 200 and int(m["qkv_prompt_tokens_cached_total"]) == reused and
                  int(m["qkv_prompt_cache_tokens"]) == C * len(kept) and
                  int(m["qkv_prompt_cache_bytes"]) > 0,
                  "/metrics: prompt tokens reused and the cache's tokens (shared chunks once)", (m, reused, len(kept)))
        # a slot is released by the scheduler's loop just after its answer is sent: idle within a second
        deadline = time.time() + 5
        while True:
            st, slots = s.request("GET", "/slots")
            if st != 200 or not isinstance(slots, list) or all(not x["is_processing"] for x in slots) or \
                    time.time() > deadline:
                break
            time.sleep(0.05)
        ck.report(st == 200 and isinstance(slots, list) and len(slots) == 8 and
                  all(x["is_processing"] is False and x["n_ctx"] == 96 for x in slots) and
                  [x["id"] for x in slots] == list(range(8)),
                  "/slots: every slot, idle after the requests, with the context", slots)
    finally:
        s.stop()
    for bad in (["--prompt-chunk", "0"], ["--prompt-cache", "-1"], ["--prompt-cache", "nan"]):
        p = subprocess.run([qkv, "serve", "--model", lm, "--port", "0"] + bad, capture_output=True, text=True,
                           timeout=60)
        ck.report(p.returncode != 0 and bad[0] in p.stderr, "qkv serve %s is refused naming the option" % " ".join(bad),
                  p.stderr[-300:])


def tiny_lm(qkv, work, steps=4):
    """A tiny language model (byte tokenizer) trained for `steps` steps on 300 lines made here:
    work/lm. For the tests and benchmarks that need any language model to serve."""
    rng = random.Random(1)
    words = "zero one two three four five six seven eight nine".split()
    text = os.path.join(work, "tiny_lm.txt")
    with open(text, "w") as f:
        for i in range(300):
            f.write("And God said let there be %s and %s\n" % (rng.choice(words), rng.choice(words)))
    lm = os.path.join(work, "lm")
    shutil.rmtree(lm, ignore_errors=True)
    run([qkv, "--threads", "2", "train", "--steps", str(steps), "--preset", "tiny", "--max-len", "96", "--seed", "1",
         "--task", "lm", "--data", text, "--out", lm, "--tokenizer", "byte"])
    return lm


# a ChatML-like template, short: the test's model reads bytes and 96 of them at most
CHATML = ("{% for message in messages %}{% if message['role'] == 'narrator' %}{{ raise_exception('No narrators, "
          "please') }}{% endif %}{{ '<' + message['role'][0] + '>' + message['content'] + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<a>' }}{% endif %}")


def chat_checks(ck, qkv, lm, work):
    """/v1/chat/completions: the prompt is the chat template's (checked against Jinja2 itself),
    then the completion's; OpenAI's chat shapes, streamed and not; logprobs; the refusals."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    s = Server(qkv, lm, "--api-key", KEY)
    try:
        st, b = s.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        error_of(ck, "chat: a model without a chat template: 400 naming --chat-template", st, b, 400, "messages",
                 "--chat-template")
    finally:
        s.stop()
    tpl = os.path.join(work, "chatml.jinja")
    with open(tpl, "w") as f:
        f.write(CHATML)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    msgs = [{"role": "system", "content": "Count."}, {"role": "user", "content": "And God said"}]
    prompt = env.from_string(CHATML).render(messages=msgs, add_generation_prompt=True)
    s = Server(qkv, lm, "--api-key", KEY, "--chat-template", tpl, "--max-tokens", "64")
    try:
        chat = {"messages": msgs, "max_tokens": 12, "temperature": 0}
        st, b = s.request("POST", "/v1/chat/completions", chat)
        st2, want = s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        ok = st == 200 and b.get("object") == "chat.completion" and b["id"].startswith("chatcmpl-") and \
            len(b["choices"]) == 1 and b["choices"][0]["message"]["role"] == "assistant" and st2 == 200
        ck.report(ok and b["choices"][0]["message"]["content"] == want["choices"][0]["text"] and
                  b["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"] and
                  b["usage"] == want["usage"],
                  "chat: the answer is the completion of the template's prompt (rendered by Jinja2), usage too",
                  (b, want))
        # content as a list of text parts; max_completion_tokens
        parts = [dict(msgs[0]), {"role": "user", "content": [{"type": "text", "text": "And God "},
                                                              {"type": "text", "text": "said"}]}]
        st, b2 = s.request("POST", "/v1/chat/completions", {"messages": parts, "max_completion_tokens": 12,
                                                            "temperature": 0})
        ck.report(st == 200 and b2["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"],
                  "chat: content as text parts and max_completion_tokens", b2)
        # streamed: the role first, then content deltas, an empty delta with the finish, usage, [DONE]
        st, ev = s.stream(dict(chat, stream_options={"include_usage": True}), path="/v1/chat/completions")
        chunks = [e for e in ev if e != "DONE"]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        ok = st == 200 and ev[-1] == "DONE" and chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} \
            and all(c["object"] == "chat.completion.chunk" for c in chunks) and \
            chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == \
            b["choices"][0]["finish_reason"] and chunks[-1]["choices"] == [] and chunks[-1]["usage"] == b["usage"]
        ck.report(ok and text == b["choices"][0]["message"]["content"],
                  "chat: streamed as OpenAI's chunks (role, deltas, finish, usage) with the same text", ev[:3])
        # logprobs: each token with its bytes and top alternatives, the completion's numbers
        st, b3 = s.request("POST", "/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=3))
        st2, w3 = s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                        "logprobs": 3})
        lp = b3["choices"][0]["logprobs"]["content"] if st == 200 else []
        ok = st == 200 and len(lp) == b3["usage"]["completion_tokens"] and \
            [t["logprob"] for t in lp] == w3["choices"][0]["logprobs"]["token_logprobs"][:len(lp)] and \
            all(bytes(t["bytes"]).decode("utf-8", "replace") == t["token"] and len(t["top_logprobs"]) == 3 and
                t["top_logprobs"][0]["logprob"] >= t["top_logprobs"][-1]["logprob"] for t in lp)
        ck.report(ok, "chat: logprobs with top_logprobs 3 (token, logprob, bytes, alternatives)", lp[:1])
        st, b4 = s.request("POST", "/v1/chat/completions", dict(chat, logprobs=True))
        ck.report(st == 200 and all(t["top_logprobs"] == [] for t in b4["choices"][0]["logprobs"]["content"]),
                  "chat: logprobs without top_logprobs: no alternatives", b4)
        # frequency_penalty: each generation of a token lowers its logit by 2, so greedy text spreads
        st, pen = s.request("POST", "/v1/chat/completions", dict(chat, frequency_penalty=2, presence_penalty=0.5))
        plain_text = b["choices"][0]["message"]["content"]
        ck.report(st == 200 and len(set(pen["choices"][0]["message"]["content"])) > len(set(plain_text)),
                  "chat: frequency_penalty and presence_penalty spread a greedy answer over more tokens",
                  (plain_text, pen))
        st, b5 = s.request("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "n": 2, "seed": 3,
                                                            "temperature": 1})
        ck.report(st == 200 and [c["index"] for c in b5["choices"]] == [0, 1], "chat: n = 2 choices", b5)
        for what, body, param, needle in [
            ("no messages", {"max_tokens": 3}, "messages", "required"),
            ("an empty list", {"messages": []}, "messages", "non-empty"),
            ("a message without a role", {"messages": [{"content": "x"}]}, "messages", "role"),
            ("content a number", {"messages": [{"role": "user", "content": 3}]}, "messages", "content"),
            ("an image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
             "messages", "text only"),
            ("a completions field", {"messages": msgs, "prompt": "x"}, "prompt", "/v1/completions"),
            ("response_format of an unknown type", {"messages": msgs, "response_format": {"type": "xml"}},
             "response_format", "not text, json_object or json_schema"),
            ("a schema qkv cannot follow", {"messages": msgs, "response_format": {"type": "json_schema",
             "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"anyOf": []}}}}}},
             "response_format", "anyOf"),
            ("tools", {"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
             "not supported"),
            ("top_logprobs without logprobs", {"messages": msgs, "top_logprobs": 2}, "top_logprobs", "logprobs"),
            ("top_logprobs 21", {"messages": msgs, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
            ("logprobs a number", {"messages": msgs, "logprobs": 2}, "logprobs", "true or false"),
            ("both max_tokens", {"messages": msgs, "max_tokens": 2, "max_completion_tokens": 2},
             "max_completion_tokens", "not both"),
            ("max_completion_tokens over the limit", {"messages": msgs, "max_completion_tokens": 65}, "max_tokens",
             None),
            ("min_p", {"messages": msgs, "min_p": 0.1}, "min_p", "not supported"),
            ("the template refuses", {"messages": [{"role": "narrator", "content": "x"}]}, "messages",
             "the chat template refused: No narrators, please"),
            ("an unknown field", {"messages": msgs, "frobnicate": 1}, "frobnicate", None),
        ]:
            st, b = s.request("POST", "/v1/chat/completions", body)
            error_of(ck, "chat: " + what + " is a 400", st, b, 400, param, needle)
        st, b = s.request("POST", "/v1/chat/completions", raw="{\"messages\": [")
        error_of(ck, "chat: a body that is not JSON is a 400", st, b, 400)
    finally:
        s.stop()
    p = subprocess.run([qkv, "serve", "--model", lm, "--port", "0", "--chat-template", os.path.join(work, "none.jinja")],
                       capture_output=True, text=True, timeout=60)
    ck.report(p.returncode != 0 and "none.jinja" in p.stderr, "chat: a missing --chat-template file stops the server",
              p.stderr[-300:])
    bad = os.path.join(work, "bad.jinja")
    with open(bad, "w") as f:
        f.write("line one\n{% for m in messages %}")
    p = subprocess.run([qkv, "serve", "--model", lm, "--port", "0", "--chat-template", bad], capture_output=True,
                       text=True, timeout=60)
    ck.report(p.returncode != 0 and "bad.jinja:2:" in p.stderr, "chat: a template that does not parse stops the "
              "server, naming its line", p.stderr[-300:])


def embedding_checks(ck, qkv, lm, tr):
    """/v1/embeddings on a decoder: OpenAI's shapes, each input alone (the same vector in any batch),
    base64 as the float32 bytes, the pooling and normalisation flags, the refusals. (Values against
    a PyTorch reference: tests/hf_parity.py, on a sentence-transformers BERT folder.)"""
    import base64
    import struct
    with open(os.path.join(lm, "config.json")) as f:
        D = json.load(f)["d_model"]
    s = Server(qkv, lm, "--api-key", KEY)
    try:
        st, one = s.request("POST", "/v1/embeddings", {"input": "And God said", "model": "lm"})
        e = one["data"][0]["embedding"] if st == 200 else []
        ck.report(st == 200 and one["object"] == "list" and one["data"][0]["object"] == "embedding" and
                  len(e) == D and all(isinstance(v, float) for v in e) and one["usage"]["prompt_tokens"] > 0 and
                  one["usage"]["total_tokens"] == one["usage"]["prompt_tokens"],
                  "embeddings: one text, %d floats" % D, str(one)[:200])
        st, many = s.request("POST", "/v1/embeddings", {"input": ["let there be", "And God said", [65, 66, 67]]})
        ck.report(st == 200 and [d["index"] for d in many["data"]] == [0, 1, 2] and many["data"][1]["embedding"] == e,
                  "embeddings: a batch, each the same vector as alone (bit for bit)", str(many)[:200])
        st, b64 = s.request("POST", "/v1/embeddings", {"input": "And God said", "encoding_format": "base64"})
        raw = base64.b64decode(b64["data"][0]["embedding"]) if st == 200 else b""
        ck.report(st == 200 and list(struct.unpack("<%df" % D, raw)) == e,
                  "embeddings: base64 is the float32 values' little-endian bytes", str(b64)[:200])
        st, same = s.request("POST", "/v1/embeddings", {"input": "And God said", "dimensions": D})
        ck.report(st == 200 and same["data"][0]["embedding"] == e, "embeddings: dimensions equal to the model's", st)
        for what, body, param in [("no input", {}, "input"), ("an empty list", {"input": []}, "input"),
                                  ("an empty text", {"input": ""}, "input"),
                                  ("a token id outside", {"input": [1, 999999]}, "input"),
                                  ("a number in the list", {"input": ["a", 3]}, "input"),
                                  ("dimensions below the model's", {"input": "a", "dimensions": 7}, "dimensions"),
                                  ("encoding_format hex", {"input": "a", "encoding_format": "hex"}, "encoding_format"),
                                  ("encoding_format a list", {"input": "a", "encoding_format": ["base64"]},
                                   "encoding_format"),
                                  ("an input over the context", {"input": "y" * 200}, "input"),
                                  ("an unknown field", {"input": "a", "pooling": "max"}, "pooling")]:
            st, b = s.request("POST", "/v1/embeddings", body)
            error_of(ck, "embeddings: " + what + " is a 400", st, b, 400, param)
    finally:
        s.stop()
    vecs = {}
    for flags in (["--embedding-normalize"], ["--embedding-pooling", "last"], ["--embedding-pooling", "cls"]):
        s = Server(qkv, lm, "--api-key", KEY, *flags)
        try:
            st, b = s.request("POST", "/v1/embeddings", {"input": "And God said"})
            vecs[" ".join(flags)] = b["data"][0]["embedding"] if st == 200 else None
        finally:
            s.stop()
    n = vecs["--embedding-normalize"]
    ck.report(n is not None and abs(sum(v * v for v in n) - 1) < 1e-5 and
              max(abs(a / b - n[0] / e[0]) for a, b in zip(n, e)) < 1e-4,
              "embeddings: --embedding-normalize gives the mean's direction at length 1", n and n[:3])
    ck.report(vecs["--embedding-pooling last"] not in (None, e) and vecs["--embedding-pooling cls"] not in (None, e),
              "embeddings: --embedding-pooling last and cls pool other rows", "")
    p = subprocess.run([qkv, "serve", "--model", lm, "--port", "0", "--embedding-pooling", "max"], capture_output=True,
                       text=True, timeout=60)
    ck.report(p.returncode != 0 and "--embedding-pooling" in p.stderr, "embeddings: --embedding-pooling max is refused",
              p.stderr[-200:])
    s = Server(qkv, tr, "--api-key", KEY)
    try:
        st, b = s.request("POST", "/v1/embeddings", {"input": "x"})
        error_of(ck, "embeddings: a translation model is a 400", st, b, 400, "input", "encoder-decoder")
    finally:
        s.stop()


def random_schema(rng, depth=0):
    """A random schema of the kinds structured output supports, small enough to finish."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "array"] + (["object"] * 2 if depth < 2 else [])
    k = rng.choice(kinds)
    if k == "string":
        return {"type": "string", "maxLength": rng.randint(0, 6)}
    if k == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 7, -1.5, None, True], rng.randint(1, 4))}
    if k == "array":
        return {"type": "array", "items": random_schema(rng, depth + 2), "maxItems": rng.randint(0, 3)}
    if k == "object":
        names = rng.sample(["id", "name", "tags", "ok", "score", "child", "x"], rng.randint(1, 4))
        props = {n: random_schema(rng, depth + 1) for n in names}
        return {"type": "object", "properties": props, "required": rng.sample(names, rng.randint(0, len(names))),
                "additionalProperties": False}
    return {"type": k}


def structured_checks(ck, qkv, work):
    """response_format on /v1/completions and /v1/chat/completions: every answer of random schemas
    (sampled, random seeds) parses and validates (python3-jsonschema); json_object gives an object."""
    import jsonschema
    lm = os.path.join(work, "lm512")
    shutil.rmtree(lm, ignore_errors=True)
    run([qkv, "--threads", "2", "train", "--steps", "2", "--preset", "tiny", "--max-len", "512", "--seed", "1",
         "--task", "lm", "--data", os.path.join(work, "text.txt"), "--out", lm, "--tokenizer", "byte"])
    tpl = os.path.join(work, "chatml.jinja")
    with open(tpl, "w") as f:
        f.write(CHATML)
    s = Server(qkv, lm, "--api-key", KEY, "--max-tokens", "400", "--chat-template", tpl)
    rng = random.Random(5)
    try:
        results = []
        for i in range(30):
            schema = {"type": "object", "properties": {"answer": random_schema(rng, 1), "extra": random_schema(rng, 1)},
                      "required": ["answer"], "additionalProperties": False} if i % 3 else random_schema(rng)
            body = {"prompt": "And God said", "max_tokens": 400, "temperature": 1.0, "seed": i,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}}
            st, b = s.request("POST", "/v1/completions", body)
            ok, why = st == 200, str(b)[:200]
            if ok:
                text = b["choices"][0]["text"]
                try:
                    jsonschema.validate(json.loads(text), schema)
                    ok = b["choices"][0]["finish_reason"] == "stop"
                except Exception as e:  # noqa: BLE001 - any failure is the check's
                    ok, why = False, "%s: %r for %s" % (type(e).__name__, text, json.dumps(schema))
            results.append((ok, why))
        bad = [w for ok, w in results if not ok]
        ck.report(not bad, "structured output: 30 random schemas, every sampled answer parses, validates and ends "
                  "with eos", bad[:2])
        st, b = s.request("POST", "/v1/completions", {"prompt": "And God said", "max_tokens": 400, "temperature": 1.0,
                                                      "seed": 3, "n": 3, "response_format": {"type": "json_object"},
                                                      "logit_bias": {str(3 + ord("}")): 6}})
        objs = []
        for c in (b["choices"] if st == 200 else []):
            try:
                objs.append(isinstance(json.loads(c["text"]), dict))
            except ValueError:
                objs.append(False)
        ck.report(st == 200 and objs == [True] * 3, "structured output: json_object, n = 3: three JSON objects",
                  str(b)[:300])
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                   "days": {"type": "integer"}}, "required": ["city", "days"]}
        st, b = s.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 200, "temperature": 0.8, "seed": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}})
        try:
            jsonschema.validate(json.loads(b["choices"][0]["message"]["content"]), schema)
            ok = True
        except Exception:  # noqa: BLE001
            ok = False
        ck.report(st == 200 and ok, "structured output on chat: the answer validates", str(b)[:300])
        st, ev = s.stream({"prompt": "x", "max_tokens": 200, "temperature": 0.9, "seed": 2,
                           "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}})
        text = "".join(e["choices"][0]["text"] for e in ev if e != "DONE" and e["choices"])
        try:
            jsonschema.validate(json.loads(text), schema)
            ok = True
        except Exception:  # noqa: BLE001
            ok = False
        ck.report(st == 200 and ok, "structured output streamed: the text validates", text[:200])
    finally:
        s.stop()


def error_of(ck, what, status, body, want_status, param=None, needle=None):
    ok = status == want_status and isinstance(body, dict) and "error" in body and \
        isinstance(body["error"].get("message"), str) and "type" in body["error"]
    if ok and param is not None:
        ok = body["error"].get("param") == param
    if ok and needle is not None:
        ok = needle in body["error"]["message"]
    ck.report(ok, what, "%s %s" % (status, body))


def completion_ok(body, n=1):
    return isinstance(body, dict) and body.get("object") == "text_completion" and len(body.get("choices", [])) == n \
        and all(isinstance(c.get("text"), str) and c.get("finish_reason") in ("stop", "length") for c in body["choices"]) \
        and body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def stream_text(events, n=1):
    texts, finish = [""] * n, [None] * n
    for e in events:
        if e == "DONE":
            continue
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
            if c["finish_reason"]:
                finish[c["index"]] = c["finish_reason"]
    return texts, finish


def completions_at_once(s, n, body_of):
    """n clients at once, client i posting body_of(i) to /v1/completions: {i: (status, body)}."""
    results = {}

    def client(i):
        results[i] = s.request("POST", "/v1/completions", body_of(i))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def lm_checks(ck, qkv, lm):
    s = Server(qkv, lm, "--api-key", KEY, "--slots", "4", "--max-queue", "32", "--max-body", "4096",
               "--max-tokens", "64")
    try:
        st, b = s.request("GET", "/health", key=None)
        ck.report(st == 200 and b["status"] == "ok" and b["task"] == "lm", "/health without a key", b)
        st, b = s.request("GET", "/v1/models")
        ck.report(st == 200 and b["object"] == "list" and b["data"][0]["object"] == "model", "/v1/models", b)
        st, b = s.request("GET", "/v1/models", key=None)
        error_of(ck, "no API key: 401", st, b, 401)
        st, b = s.request("GET", "/v1/models", key="wrong")
        error_of(ck, "a wrong API key: 401", st, b, 401)

        base = {"prompt": "And God said", "max_tokens": 24, "temperature": 0}
        st, alone = s.request("POST", "/v1/completions", base)
        ck.report(st == 200 and completion_ok(alone), "a greedy completion", alone)
        st, again = s.request("POST", "/v1/completions", base)
        ck.report(again["choices"][0]["text"] == alone["choices"][0]["text"], "greedy is deterministic")
        st, b = s.request("POST", "/v1/completions", dict(base, suffix=None))
        st2, b2 = s.request("POST", "/v1/completions", dict(base, suffix=""))
        ck.report(st == st2 == 200 and b["choices"][0]["text"] == b2["choices"][0]["text"] == alone["choices"][0]["text"],
                  "a null or empty suffix is accepted", (b, b2))
        # under load: parallel clients, the same request among others
        results = completions_at_once(s, 16, lambda i: dict(base) if i % 3 == 0 else {
            "prompt": "In the beginning %d" % i, "max_tokens": 10 + i % 7, "temperature": 0.9, "seed": i})
        same = all(results[i][1]["choices"][0]["text"] == alone["choices"][0]["text"] for i in range(0, 16, 3))
        ck.report(all(results[i][0] == 200 and completion_ok(results[i][1]) for i in results) and same,
                  "16 parallel clients: all answered; the greedy ones equal the request alone")
        # streaming: the deltas make the plain completion, and [DONE] ends it
        st, ev = s.stream(base)
        texts, finish = stream_text(ev)
        ck.report(st == 200 and ev[-1] == "DONE" and texts[0] == alone["choices"][0]["text"] and
                  finish[0] == alone["choices"][0]["finish_reason"], "a streamed completion is the plain one",
                  (texts, finish))
        # stream_options.include_usage: every chunk's usage null, then one chunk with no choices
        # and the plain completion's usage, then [DONE]; only with stream, and checked
        st, ev = s.stream(dict(base, stream_options={"include_usage": True}))
        last = ev[-2] if len(ev) >= 2 else None
        ck.report(st == 200 and ev[-1] == "DONE" and last["choices"] == [] and last["usage"] == alone["usage"] and
                  all(e["usage"] is None for e in ev[:-2]) and stream_text(ev[:-2] + ["DONE"])[0][0] ==
                  alone["choices"][0]["text"], "stream_options.include_usage: a last chunk with the usage", ev[-3:])
        st, ev = s.stream(dict(base, stream_options={"include_usage": False}))
        ck.report(st == 200 and all("usage" not in e for e in ev[:-1]), "include_usage false: no usage", ev[-2:])
        for so, param in (({"include_usage": 1}, "stream_options.include_usage"), ({"obfuscate": True},
                          "stream_options.obfuscate"), ("yes", "stream_options")):
            st, b = s.stream(dict(base, stream_options=so))
            error_of(ck, "stream_options %s: 400" % json.dumps(so), st, b, 400, param=param)
        st, b = s.request("POST", "/v1/completions", dict(base, stream_options={"include_usage": True}))
        error_of(ck, "stream_options without stream: 400", st, b, 400, param="stream_options",
                 needle="only allowed when 'stream' is true")
        # a batch of prompts: prompt k's choices are k n .. k n + n - 1, each what that prompt gives
        # alone; usage counts every prompt; echo puts each choice's own prompt first; streamed
        # the same; lists of token ids too; mixed or empty entries and too many prompts are 400
        other = dict(base, prompt="In the beginning")
        st, o1 = s.request("POST", "/v1/completions", other)
        # sampled (choice j of any prompt draws from seed + j), so that the prompts' texts differ
        sampled = dict(base, temperature=1.0, seed=5, n=2)
        st, s0 = s.request("POST", "/v1/completions", sampled)
        st, s1 = s.request("POST", "/v1/completions", dict(sampled, prompt=other["prompt"]))
        st, b = s.request("POST", "/v1/completions", dict(sampled, prompt=[base["prompt"], other["prompt"]]))
        want_sampled = [c["text"] for c in s0["choices"] + s1["choices"]]
        ck.report(st == 200 and completion_ok(b, 4) and [c["text"] for c in b["choices"]] == want_sampled and
                  want_sampled[:2] != want_sampled[2:] and [c["index"] for c in b["choices"]] == [0, 1, 2, 3] and
                  b["usage"]["prompt_tokens"] == s0["usage"]["prompt_tokens"] + s1["usage"]["prompt_tokens"] and
                  b["usage"]["completion_tokens"] == s0["usage"]["completion_tokens"] + s1["usage"]["completion_tokens"],
                  "a batch of 2 prompts x n = 2: each choice its prompt's own completion", (want_sampled, b))
        want = [alone["choices"][0]["text"]] * 2 + [o1["choices"][0]["text"]] * 2
        st, b = s.request("POST", "/v1/completions", dict(base, prompt=[base["prompt"], other["prompt"]], echo=True))
        ck.report(st == 200 and [c["text"] for c in b["choices"]] ==
                  [base["prompt"] + want[0], other["prompt"] + want[2]], "a batch with echo", b)
        st, ev = s.stream(dict(base, prompt=[base["prompt"], other["prompt"]]))
        texts, finish = stream_text(ev, 2)
        ck.report(st == 200 and texts == [want[0], want[2]], "a streamed batch", texts)
        ids_of = [ord(ch) + 3 for ch in base["prompt"]]  # the byte tokenizer's ids
        st, b = s.request("POST", "/v1/completions", dict(base, prompt=[ids_of, ids_of]))
        ck.report(st == 200 and [c["text"] for c in b["choices"]] == [want[0]] * 2, "a batch of token-id lists", b)
        for bad_prompt in ([base["prompt"], [5, 6]], [[5, 6], []], ["ok", 5], ["p"] * 65, []):
            st, b = s.request("POST", "/v1/completions", dict(base, prompt=bad_prompt))
            error_of(ck, "prompt %s: 400" % json.dumps(bad_prompt)[:60], st, b, 400, param="prompt")
        # /tokenize and /detokenize (llama.cpp's shapes): ids, pieces (bytes that are not whole
        # characters as lists of byte values), the round trip, and bad fields
        text = "And God said \u00e9"
        st, b = s.request("POST", "/tokenize", {"content": text})
        ck.report(st == 200 and b == {"tokens": [c + 3 for c in text.encode("utf-8")]}, "/tokenize", b)
        st, b = s.request("POST", "/tokenize", {"content": text, "with_pieces": True})
        want = [{"id": c + 3, "piece": chr(c)} for c in text.encode("utf-8")[:-2]] + \
               [{"id": 0xC3 + 3, "piece": [0xC3]}, {"id": 0xA9 + 3, "piece": [0xA9]}]
        ck.report(st == 200 and b == {"tokens": want}, "/tokenize with_pieces: part of a character as bytes", b)
        st, b = s.request("POST", "/tokenize", {"content": "x", "add_special": True})
        ck.report(st == 200 and b == {"tokens": [ord("x") + 3]}, "/tokenize add_special (the byte tokenizer adds none)", b)
        st, d = s.request("POST", "/detokenize", {"tokens": [c + 3 for c in text.encode("utf-8")]})
        ck.report(st == 200 and d == {"content": text}, "/detokenize inverts /tokenize", d)
        st, d = s.request("POST", "/detokenize", {"tokens": [1, 0xC3 + 3]})
        ck.report(st == 200 and d == {"content": "\ufffd"}, "/detokenize: specials dropped, a broken character U+FFFD", d)
        for route, body, param in (("/tokenize", {}, "content"), ("/tokenize", {"content": ["a"]}, "content"),
                                   ("/tokenize", {"content": "a", "with_pieces": 1}, "with_pieces"),
                                   ("/tokenize", {"content": "a", "parse_special": True}, "parse_special"),
                                   ("/detokenize", {"tokens": [5, 999]}, "tokens"), ("/detokenize", {}, "tokens"),
                                   ("/detokenize", {"tokens": "5"}, "tokens")):
            st, b = s.request("POST", route, body)
            error_of(ck, "%s %s: 400" % (route, json.dumps(body)), st, b, 400, param=param)
        st, b = s.request("POST", "/tokenize", {"content": "a"}, key=None)
        error_of(ck, "/tokenize needs the key", st, b, 401)
        # echo with logprobs scores the prompt too (the first token null), max_tokens 0 generates
        # nothing (lm-evaluation-harness's log-likelihood requests), text_offset where each token
        # starts; a generated token's logprob equals the score of the same token echoed back
        prompt = "And God said"
        st, g = s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": 0,
                                                      "logprobs": 2})
        st2, e = s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": 0,
                                                       "logprobs": 2, "echo": True})
        gl, el = g["choices"][0]["logprobs"], e["choices"][0]["logprobs"]
        P = len(prompt)
        ck.report(st == st2 == 200 and el["tokens"] == list(prompt) + gl["tokens"] and el["token_logprobs"][0] is None
                  and el["top_logprobs"][0] is None and el["token_logprobs"][P:] == gl["token_logprobs"] and
                  all(isinstance(v, float) and v <= 0 and len(el["top_logprobs"][t]) == 2 and
                      max(el["top_logprobs"][t].values()) >= v - 1e-9 for t, v in enumerate(el["token_logprobs"]) if t)
                  and el["text_offset"] == list(range(P + 3)) and gl["text_offset"] == [P, P + 1, P + 2] and
                  e["choices"][0]["text"] == prompt + g["choices"][0]["text"],
                  "echo with logprobs: the prompt's tokens scored, then the completion's", el)
        st, z = s.request("POST", "/v1/completions", {"prompt": prompt + g["choices"][0]["text"][:1], "max_tokens": 0,
                                                      "echo": True, "logprobs": 1})
        zl = z["choices"][0]["logprobs"] if st == 200 else {}
        ck.report(st == 200 and z["choices"][0]["text"] == prompt + g["choices"][0]["text"][:1] and
                  z["usage"]["completion_tokens"] == 0 and z["choices"][0]["finish_reason"] == "length" and
                  abs(zl["token_logprobs"][-1] - gl["token_logprobs"][0]) < 1e-4,
                  "max_tokens 0 with echo: the prompt scored as generation scored its token", (zl, gl))
        # streamed echo with logprobs: the prompt's chunk carries the prompt's scores, as the whole answer does
        st, ev = s.stream({"prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 2, "echo": True})
        first = ev[0]["choices"][0] if st == 200 and ev and ev[0] != "DONE" else {}
        fl = first.get("logprobs") or {}
        ck.report(first.get("text") == prompt and fl.get("tokens") == el["tokens"][:P] and
                  fl.get("token_logprobs") == el["token_logprobs"][:P] and fl.get("top_logprobs") == el["top_logprobs"][:P]
                  and fl.get("text_offset") == list(range(P)),
                  "streamed echo with logprobs: the prompt's chunk carries its tokens' scores", first)
        st, b = s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 0})
        error_of(ck, "max_tokens 0 without echo: 400", st, b, 400, param="max_tokens")
        st, b = s.stream({"prompt": prompt, "max_tokens": 0, "echo": True})
        error_of(ck, "max_tokens 0 streamed: 400", st, b, 400, param="max_tokens")
        # logit_bias: +100 on one token makes every greedy choice that token, -100 on the first
        # greedy token moves the first choice; and the field is checked
        z = str(ord("z") + 3)  # the byte tokenizer's id of "z"
        st, b = s.request("POST", "/v1/completions", dict(base, max_tokens=5, logit_bias={z: 100}))
        ck.report(st == 200 and b["choices"][0]["text"] == "zzzzz", "logit_bias +100 forces a token", b)
        first = str(ord(alone["choices"][0]["text"][0]) + 3)
        st, b = s.request("POST", "/v1/completions", dict(base, logit_bias={first: -100}))
        ck.report(st == 200 and b["choices"][0]["text"][:1] != alone["choices"][0]["text"][:1],
                  "logit_bias -100 bans a token", (alone["choices"][0]["text"], b))
        for lb in ({"x": 1}, {"-1": 1}, {"999999": 1}, {"+5": 1}, {z: 100.5}, {z: "1"}, [1]):
            st, b = s.request("POST", "/v1/completions", dict(base, logit_bias=lb))
            error_of(ck, "logit_bias %s: 400" % json.dumps(lb), st, b, 400, param="logit_bias")
        # n, seed, logprobs, echo, stop
        body = {"prompt": "And", "max_tokens": 12, "n": 3, "temperature": 1.0, "seed": 7, "logprobs": 2}
        st, b = s.request("POST", "/v1/completions", body)
        st2, b2 = s.request("POST", "/v1/completions", body)
        lp = b["choices"][0]["logprobs"] if st == 200 else None
        ck.report(st == 200 and completion_ok(b, 3) and b == dict(b2, id=b["id"], created=b["created"]) and
                  len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) and
                  all(len(t) <= 2 for t in lp["top_logprobs"]), "n = 3 with a seed and logprobs: reproducible", b)
        st, b = s.request("POST", "/v1/completions", dict(base, echo=True))
        ck.report(st == 200 and b["choices"][0]["text"] == "And God said" + alone["choices"][0]["text"], "echo", b)
        full = alone["choices"][0]["text"]
        stop = full[5:8] if len(full) >= 8 else None
        if stop:
            st, b = s.request("POST", "/v1/completions", dict(base, stop=[stop, "zzzz"]))
            want = full[:full.find(stop)]
            ck.report(st == 200 and b["choices"][0]["text"] == want and b["choices"][0]["finish_reason"] == "stop",
                      "a stop string ends the text before it", (stop, b))
            st, ev = s.stream(dict(base, stop=stop))
            texts, finish = stream_text(ev)
            ck.report(texts[0] == want and finish[0] == "stop", "a stop string in a stream", (texts, finish))
        st, b = s.request("POST", "/v1/completions", {"prompt": [5, 9, 12], "max_tokens": 3})
        ck.report(st == 200 and b["usage"]["prompt_tokens"] == 3, "a prompt of token ids", b)
        st, b = s.request("POST", "/v1/next-token", {"text": "And God", "top_k": 5, "temperature": 0.7})
        ok = st == 200 and len(b["top"]) == 5 and all(b["top"][i]["logit"] >= b["top"][i + 1]["logit"] for i in range(4))
        ok = ok and abs(sum(x["prob"] for x in b["top"])) <= 1 + 1e-9
        st2, b2 = s.request("POST", "/v1/next-token", {"text": "And God", "top_k": 5, "temperature": 2.0})
        ck.report(ok and st2 == 200 and b2["top"][0]["prob"] < b["top"][0]["prob"],
                  "/v1/next-token: top-k by logit; a higher temperature flattens", (b, b2))

        # bad requests: each one error naming the field
        bad = [
            ("malformed JSON", None, '{"prompt": "x", ', 400, None, "not valid JSON"),
            ("a JSON array", None, "[1, 2]", 400, None, "expected an object"),
            ("no prompt", {"max_tokens": 3}, None, 400, "prompt", "required"),
            ("an unknown field", {"prompt": "x", "frobnicate": 1}, None, 400, "frobnicate", "unknown field"),
            ("max_tokens 0", {"prompt": "x", "max_tokens": 0}, None, 400, "max_tokens", None),
            ("max_tokens -5", {"prompt": "x", "max_tokens": -5}, None, 400, "max_tokens", None),
            ("max_tokens a string", {"prompt": "x", "max_tokens": "9"}, None, 400, "max_tokens", None),
            ("max_tokens over --max-tokens", {"prompt": "x", "max_tokens": 65}, None, 400, "max_tokens", None),
            ("max_tokens 1e30", None, '{"prompt": "x", "max_tokens": 1e30}', 400, "max_tokens", None),
            ("temperature -1", {"prompt": "x", "temperature": -1}, None, 400, "temperature", None),
            ("top_p 0", {"prompt": "x", "top_p": 0}, None, 400, "top_p", None),
            ("n over the slots", {"prompt": "x", "n": 5}, None, 400, "n", None),
            ("stream a string", {"prompt": "x", "stream": "yes"}, None, 400, "stream", None),
            ("stop of 5 strings", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, None, 400, "stop", None),
            ("a suffix (no fill-in-the-middle)", {"prompt": "x", "suffix": "end"}, None, 400, "suffix", None),
            ("a suffix that is a number", {"prompt": "x", "suffix": 3}, None, 400, "suffix", None),
            ("a batch holding a number", {"prompt": ["a", 7]}, None, 400, "prompt", None),
            ("a batch's token id outside", {"prompt": [[1], [1, 999999]]}, None, 400, "prompt", None),
            ("a batch's prompt over the context", {"prompt": ["x", "y" * 60], "max_tokens": 64}, None, 400,
             "max_tokens", None),
            ("a token id outside", {"prompt": [1, 999999]}, None, 400, "prompt", None),
            ("presence_penalty 3", {"prompt": "x", "presence_penalty": 3}, None, 400, "presence_penalty", "[-2, 2]"),
            ("frequency_penalty a string", {"prompt": "x", "frequency_penalty": "1"}, None, 400, "frequency_penalty",
             None),
            ("prompt + max_tokens over the context", {"prompt": "y" * 60, "max_tokens": 64}, None, 400, "max_tokens",
             "context"),
        ]
        for what, body, raw, status, param, needle in bad:
            st, b = s.request("POST", "/v1/completions", body, raw=raw)
            error_of(ck, "400: " + what, st, b, status, param, needle)
        st, b = s.request("POST", "/v1/completions", raw='{"prompt": "' + "x" * 5000 + '"}')
        error_of(ck, "413: a body over --max-body", st, b, 413)
        st, b = s.request("POST", "/v1/nothing", {"prompt": "x"})
        error_of(ck, "404: an unknown route", st, b, 404)
        st, b = s.request("POST", "/v1/translations", {"text": ["x"]})
        error_of(ck, "400: translations on a language model", st, b, 400, None, "translate model")

        # a client that goes away mid-stream frees its slot
        st, ev = s.stream({"prompt": "And", "max_tokens": 64, "temperature": 0}, stop_after=2)
        freed = False
        for _ in range(100):
            st, h = s.request("GET", "/health", key=None)
            if h["decoding"] == 0 and h["waiting"] == 0:
                freed = True
                break
            time.sleep(0.05)
        ck.report(len(ev) == 2 and freed, "a client gone mid-stream frees its slot", h)

        # load: a few hundred mixed requests from 8 threads, every answer checked
        rng = random.Random(3)
        kinds = ["greedy", "sample", "stream", "bad_json", "bad_field", "bad_range", "next", "models", "nokey", "n2"]
        plan = [rng.choice(kinds) for _ in range(240)]
        wrong = []

        def worker(items):
            for i, kind in items:
                try:
                    if kind == "greedy":
                        st, b = s.request("POST", "/v1/completions", base)
                        ok = st == 200 and b["choices"][0]["text"] == alone["choices"][0]["text"]
                    elif kind == "sample":
                        st, b = s.request("POST", "/v1/completions", {"prompt": "Let", "max_tokens": 6, "seed": i,
                                                                      "temperature": 0.8, "top_k": 20})
                        ok = st == 200 and completion_ok(b)
                    elif kind == "n2":
                        st, b = s.request("POST", "/v1/completions", {"prompt": "Let", "max_tokens": 5, "n": 2,
                                                                      "temperature": 1.2, "seed": i})
                        ok = st == 200 and completion_ok(b, 2)
                    elif kind == "stream":
                        st, ev = s.stream(base)
                        ok = st == 200 and ev[-1] == "DONE" and stream_text(ev)[0][0] == alone["choices"][0]["text"]
                    elif kind == "bad_json":
                        st, b = s.request("POST", "/v1/completions", raw="{nope")
                        ok = st == 400 and "not valid JSON" in b["error"]["message"]
                    elif kind == "bad_field":
                        st, b = s.request("POST", "/v1/completions", {"prompt": "x", "bogus": True})
                        ok = st == 400 and b["error"]["param"] == "bogus"
                    elif kind == "bad_range":
                        st, b = s.request("POST", "/v1/completions", {"prompt": "x", "top_k": -1})
                        ok = st == 400 and b["error"]["param"] == "top_k"
                    elif kind == "next":
                        st, b = s.request("POST", "/v1/next-token", {"text": "And", "top_k": 3})
                        ok = st == 200 and len(b["top"]) == 3
                    elif kind == "models":
                        st, b = s.request("GET", "/v1/models")
                        ok = st == 200
                    else:
                        st, b = s.request("POST", "/v1/completions", base, key=None)
                        ok = st == 401
                    if not ok:
                        wrong.append((kind, st, b))
                except Exception as e:  # a dropped connection, a hang: wrong answers too
                    wrong.append((kind, repr(e)))

        items = list(enumerate(plan))
        threads = [threading.Thread(target=worker, args=(items[k::8],)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        st, h = s.request("GET", "/health", key=None)
        ck.report(not wrong and st == 200 and h["status"] == "ok",
                  "load: %d mixed requests from 8 threads, every answer right, still healthy" % len(plan), wrong[:3])
        ck.report(s.proc.poll() is None, "the server is still running")
    finally:
        s.stop()

    # a full queue: 429
    s = Server(qkv, lm, "--slots", "1", "--max-queue", "1")
    try:
        results = []

        def long_request():
            results.append(s.request("POST", "/v1/completions", {"prompt": "And", "max_tokens": 60,
                                                                 "temperature": 0}, key=None))

        threads = [threading.Thread(target=long_request) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r[0] for r in results)
        refused = [r for r in results if r[0] == 429]
        ck.report(200 in codes and refused and all(r[0] in (200, 429) for r in results) and
                  "queue is full" in refused[0][1]["error"]["message"], "a full queue answers 429", codes)
        # SIGTERM drains: a stream in flight ends with [DONE]; the process exits 0
        out = {}

        def streaming():
            out["r"] = s.stream({"prompt": "And", "max_tokens": 60, "temperature": 0}, key="")

        t = threading.Thread(target=streaming)
        t.start()
        time.sleep(0.3)
        s.proc.send_signal(signal.SIGTERM)
        t.join()
        rc = s.proc.wait(30)
        st, ev = out["r"]
        ck.report(st == 200 and ev and ev[-1] == "DONE" and rc == 0, "SIGTERM drains the stream in flight, exit 0",
                  (st, len(ev), rc))
    finally:
        s.stop()


def packed_checks(ck, qkv, lm):
    """--dtype: the projections packed at load; under load a seeded request's answer equals the
    request alone (sampled, so that the text is not one repeated token of a barely trained model)."""
    for dtype in ("int8", "q4", "bf16"):
        s = Server(qkv, lm, "--api-key", KEY, "--slots", "4", "--dtype", dtype)
        try:
            base = {"prompt": "And God said", "max_tokens": 16, "temperature": 1.0, "seed": 7}
            st, alone = s.request("POST", "/v1/completions", base)
            ok = st == 200 and completion_ok(alone)
            results = completions_at_once(s, 8, lambda i: dict(base) if i % 2 == 0 else {
                "prompt": "let there be %d" % i, "max_tokens": 8 + i, "temperature": 0.8, "seed": i})
            same = ok and all(results[i][0] == 200 and results[i][1]["choices"][0]["text"] == alone["choices"][0]["text"]
                              for i in range(0, 8, 2))
            ck.report(same and all(results[i][0] == 200 for i in results),
                      "--dtype %s: 8 parallel clients answered; the seeded ones equal the request alone (%r)" %
                      (dtype, alone["choices"][0]["text"] if ok else None),
                      (alone, results))
        finally:
            s.stop()


def task_checks(ck, qkv, tr, cls, work):
    s = Server(qkv, tr)
    try:
        lines = ["one two three", "nine four", "", "five"]
        st, b = s.request("POST", "/v1/translations", {"text": lines, "beam": 1}, key=None)
        want = run([qkv, "--threads", "2", "translate", "--model", tr, "--beam", "1"], input="\n".join(lines) + "\n")
        ck.report(st == 200 and b["translations"] == want.split("\n")[:len(lines)],
                  "/v1/translations equals qkv translate (greedy)", (b, want))
        ck.report(any(t for t in b["translations"]), "the translator writes something", b)
        # concurrent clients share batches and get what each gets alone
        got = {}

        def client(i):
            got[i] = s.request("POST", "/v1/translations", {"text": [lines[i % 4]], "beam": 1}, key=None)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        alone = want.split("\n")
        ck.report(all(got[i][0] == 200 and got[i][1]["translations"] == [alone[i % 4]] for i in got),
                  "12 concurrent translation clients get what each gets alone", got)
        st, b = s.request("POST", "/v1/translations", {"text": "the cat", "beam": 4}, key=None)
        ck.report(st == 200 and len(b["translations"]) == 1, "/v1/translations with a beam of 4", b)
        st, b = s.request("POST", "/v1/translations", {"text": ["x"], "beam": 0}, key=None)
        error_of(ck, "400: beam 0", st, b, 400, "beam")
        # CTranslate2's options: n best with log-probabilities and scores (the first is the
        # translation, ranked by logprob / length^length_penalty), sampling with a seed
        st, b = s.request("POST", "/v1/translations", {"text": ["one two three", "five"], "beam": 4, "n": 3},
                          key=None)
        nb = b.get("n_best", []) if st == 200 else []
        ck.report(st == 200 and len(nb) == 2 and all(len(h) == 3 for h in nb) and
                  [h[0]["text"] for h in nb] == b["translations"] and
                  [h[0]["logprob"] for h in nb] == b["logprobs"] and
                  all(h[i]["score"] >= h[i + 1]["score"] for h in nb for i in range(2)) and
                  all(len({x["text"] for x in h}) == 3 for h in nb),
                  "/v1/translations n best: distinct, ranked by score, the first the translation", b)
        st, g1 = s.request("POST", "/v1/translations", {"text": ["one two three"], "beam": 1}, key=None)
        ck.report(st == 200 and isinstance(g1["logprobs"][0], float) and g1["logprobs"][0] <= 0,
                  "/v1/translations gives the translation's log-probability", g1)
        # target_prefix (CTranslate2's): forcing the start greedy chose gives greedy's translation;
        # another start is kept and continued
        t0 = g1["translations"][0]
        st, p1 = s.request("POST", "/v1/translations", {"text": ["one two three", "five"], "beam": 1,
                                                        "target_prefix": [t0[:3], "zz"]}, key=None)
        ck.report(st == 200 and p1["translations"][0] == t0 and p1["translations"][1].startswith("zz"),
                  "/v1/translations target_prefix: greedy's own start gives its translation, another is kept",
                  (t0, p1))
        st, p2 = s.request("POST", "/v1/translations", {"text": ["one two three"], "beam": 4,
                                                        "target_prefix": ["zz"]}, key=None)
        ck.report(st == 200 and p2["translations"][0].startswith("zz"), "/v1/translations target_prefix with a beam",
                  p2)
        # streamed (beam 1): each text's pieces, then its last event; the same texts and
        # log-probabilities as the whole answer
        lines3 = ["one two three", "", "nine four"]
        st, whole = s.request("POST", "/v1/translations", {"text": lines3, "beam": 1}, key=None)
        st2, ev = s.stream({"text": lines3, "beam": 1}, key=None, path="/v1/translations")
        texts, lps, fins = [""] * 3, [None] * 3, [None] * 3
        for e in ev:
            if e == "DONE":
                continue
            texts[e["index"]] += e["text"]
            if "finish_reason" in e:
                lps[e["index"]], fins[e["index"]] = e["logprob"], e["finish_reason"]
        ck.report(st == st2 == 200 and ev[-1] == "DONE" and texts == whole["translations"] and
                  lps == whole["logprobs"] and all(f in ("stop", "length") for f in fins) and len(ev) > 4,
                  "/v1/translations streamed: the pieces make the whole answer's texts and log-probabilities",
                  (texts, whole, len(ev)))
        st, ev = s.stream({"text": ["one two three"], "beam": 1, "target_prefix": ["zz"]}, key=None,
                          path="/v1/translations")
        ck.report(st == 200 and "".join(e["text"] for e in ev if e != "DONE").startswith("zz"),
                  "/v1/translations streamed with a target prefix", ev[:3])
        st, b = s.request("POST", "/v1/translations", {"text": ["a"], "beam": 4, "stream": True}, key=None)
        error_of(ck, "400: a streamed translation with a beam of 4", st, b, 400, "stream")
        st, b = s.request("POST", "/v1/translations", {"text": ["a", "b"], "target_prefix": ["x"]}, key=None)
        error_of(ck, "400: a target_prefix per text", st, b, 400, "target_prefix", "one per text")
        samp = {"text": ["one two three", "nine four"], "beam": 1, "temperature": 1.5, "seed": 9}
        st, x1 = s.request("POST", "/v1/translations", samp, key=None)
        st2, x2 = s.request("POST", "/v1/translations", samp, key=None)
        st3, x3 = s.request("POST", "/v1/translations", dict(samp, text=["nine four"]), key=None)
        ck.report(st == st2 == st3 == 200 and x1 == x2 and x3["translations"][0] == x1["translations"][1],
                  "sampled translations: the same seed the same text, alone or beside another", (x1, x3))
        for body, param in (({"text": "x", "beam": 2, "n": 3}, "n"), ({"text": "x", "beam": 4, "temperature": 1}, "temperature"),
                            ({"text": "x", "beam": 1, "top_k": 5}, "top_k"), ({"text": "x", "length_penalty": 11}, "length_penalty")):
            st, b = s.request("POST", "/v1/translations", body, key=None)
            error_of(ck, "/v1/translations %s: 400" % json.dumps(body), st, b, 400, param)
        st, b = s.request("POST", "/v1/completions", {"prompt": "x"}, key=None)
        error_of(ck, "400: completions on a translator", st, b, 400, None, "lm model")
    finally:
        s.stop()
    s = Server(qkv, cls)
    try:
        lines = ["one two three", "seven"]
        st, b = s.request("POST", "/v1/classifications", {"text": lines}, key=None)
        want = [l.split("\t") for l in run([qkv, "--threads", "2", "classify", "--model", cls],
                                           input="\n".join(lines) + "\n").rstrip("\n").split("\n")]
        ok = st == 200 and len(b["classifications"]) == 2
        for got, w in zip(b["classifications"] if ok else [], want):
            ok = ok and got["label"] == w[0] and abs(got["prob"] - float(w[1])) < 1e-3 and \
                abs(sum(got["probs"].values()) - 1) < 1e-9
        ck.report(ok, "/v1/classifications equals qkv classify", (b, want))
    finally:
        s.stop()


def rows_sum_to_one(maps):
    return all(abs(sum(r) - 1) <= 1e-5 for m in maps for r in m["weights"])


def inspect_checks(ck, qkv, lm, tr, work):
    """/v1/attention against `qkv forward --attention`, its limits; /v1/attend, /v1/claims,
    /v1/model and the page."""
    import numpy as np
    s = Server(qkv, lm, "--max-attention", "3000")
    try:
        st, m = s.request("GET", "/v1/model")
        ck.report(st == 200 and m["task"] == "lm" and m["layers"].get("decoder", 0) >= 1 and m["heads"] >= 1,
                  "/v1/model describes the model", m)
        L, H = m["layers"]["decoder"], m["heads"]
        st, a = s.request("POST", "/v1/attention", {"text": "And God said"})
        T = len(a.get("tokens", [])) if st == 200 else 0
        ok = st == 200 and len(a["maps"]) == L * H and a["layers"] == L and a["heads"] == H and \
            all(m_["kind"] == "self" and m_["stack"] == "decoder" and len(m_["weights"]) == T and
                all(len(r) == T for r in m_["weights"]) for m_ in a["maps"])
        ck.report(ok and rows_sum_to_one(a["maps"]), "/v1/attention: %d layers x %d heads of %d x %d, rows sum to 1" %
                  (L, H, T, T), a if not ok else "")
        causal = ok and all(m_["weights"][i][j] == 0 for m_ in a["maps"] for i in range(T) for j in range(i + 1, T))
        ck.report(causal, "/v1/attention: a language model's maps are causal (zero above the diagonal)")
        # the same maps as qkv forward --attention on the same ids
        d = os.path.join(work, "attention_forward")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "ids.npy"), np.array([a["ids"]], np.int64))
        run([qkv, "--threads", "2", "forward", "--model", lm, "--input", os.path.join(d, "ids.npy"), "--attention",
             os.path.join(d, "maps")])
        worst = 0.0
        for m_ in a["maps"]:
            f = np.load(os.path.join(d, "maps", "decoder.%d.self.npy" % m_["layer"]))
            worst = max(worst, float(np.max(np.abs(f[0, m_["head"]] - np.array(m_["weights"])))))
        ck.report(worst <= 1e-6, "/v1/attention equals qkv forward --attention on the same ids (max diff %.2g)" % worst)
        st, b = s.request("POST", "/v1/attention", {"text": "And", "layers": [L - 1], "heads": [0, H - 1]})
        ck.report(st == 200 and [(x["layer"], x["head"]) for x in b["maps"]] == [(L - 1, 0), (L - 1, H - 1)],
                  "/v1/attention: chosen layers and heads", b if st != 200 else "")
        for body, param, needle, what in (
                ({"text": "And God said, Let there be light"}, "text", "--max-attention",
                 "an answer over --max-attention"),
                ({"text": "x", "layers": [L]}, "layers", None, "a layer out of range"),
                ({"text": "x", "heads": [-1]}, "heads", None, "a negative head"),
                ({"text": "x", "heads": [0, 0]}, "heads", "twice", "a head twice"),
                ({"text": "x", "heads": []}, "heads", None, "an empty list of heads"),
                ({"text": "x", "layers": "0"}, "layers", None, "layers as a string"),
                ({"text": "x", "source": "y"}, "source", None, "a source for a language model"),
                ({"text": "x", "bogus": 1}, "bogus", "unknown field", "an unknown field"),
                ({}, "text", None, "no text")):
            st, b = s.request("POST", "/v1/attention", body)
            error_of(ck, "/v1/attention 400: " + what, st, b, 400, param, needle)
        # the worked example
        st, e = s.request("POST", "/v1/attend", {})
        ck.report(st == 200 and [round(x, 6) for x in e["scores"]] == [1, 0, 1] and
                  [round(x, 4) for x in e["qkv"]["weights"]] == [0.4223, 0.1554, 0.4223] and
                  [round(x, 3) for x in e["qkv"]["output"]] == [5.912, 4.088] and
                  [round(x, 4) for x in e["exp"]] == [1, 0.3679, 1] and round(e["sum"], 4) == 2.3679,
                  "/v1/attend: the chapter's example, 0.4223 / 0.1554 / 0.4223 and 5.912 / 4.088", e)
        st, e = s.request("POST", "/v1/attend", {"mask": [True, True, False]})
        ck.report(st == 200 and [round(x, 4) for x in e["qkv"]["weights"]] == [0.7311, 0.2689, 0.0] and
                  round(e["zeroed"]["sum"], 4) == 0.5777, "/v1/attend: masking renormalises; zeroing sums to 0.5777", e)
        st, e = s.request("POST", "/v1/attend", {"mask": [False, False, False]})
        ck.report(st == 200 and e["qkv"]["weights"] == [0, 0, 0] and e["qkv"]["output"] == [0, 0] and
                  e["qkv"]["lse"] is None and e["max"] is None, "/v1/attend: every key masked gives zeros, not NaN", e)
        st, e = s.request("POST", "/v1/attend", {"q": [1, 0, 0], "keys": [[1, 0, 0], [0, 1, 0]],
                                                 "values": [[1], [2]], "scale": 1})
        want = [np.e / (np.e + 1) * 1 + 1 / (np.e + 1) * 2]
        ck.report(st == 200 and abs(e["output"][0] - want[0]) < 1e-12 and abs(e["qkv"]["output"][0] - want[0]) < 1e-6,
                  "/v1/attend: other shapes (Dk 3, Dv 1, 2 keys, scale 1)", e)
        for body, param, what in (({"q": [1, 2, 3]}, "keys", "a query longer than the keys"),
                                  ({"keys": [[1, 0]]}, "values", "keys without values"),
                                  ({"mask": [True]}, "mask", "a mask of the wrong length"),
                                  ({"mask": [1, 0, 1]}, "mask", "a mask of numbers"),
                                  ({"scale": 0}, "scale", "scale 0"),
                                  ({"q": ["x", 1]}, "q", "a string in q"),
                                  ({"keys": [[1, 0]] * 65, "values": [[1]] * 65}, "keys", "65 keys"),
                                  ({"values": [[1, 2], [3]]}, "values", "ragged values"),
                                  ({"bogus": 1}, "bogus", "an unknown field")):
            st, b = s.request("POST", "/v1/attend", body)
            error_of(ck, "/v1/attend 400: " + what, st, b, 400, param)
        st, b = s.request("POST", "/v1/attend", raw="[1, 2]")
        error_of(ck, "/v1/attend 400: a body that is not an object", st, b, 400)
        st, b = s.request("POST", "/v1/attend", raw='{"q": [1e400, 0]}')
        error_of(ck, "/v1/attend 400: a number beyond double (1e400)", st, b, 400)
        st, b = s.request("POST", "/v1/attend", raw='{"q": [NaN, 0]}')
        error_of(ck, "/v1/attend 400: NaN", st, b, 400)
        # the claims
        st, c = s.request("GET", "/v1/claims?seed=5")
        st2, c2 = s.request("GET", "/v1/claims?seed=5")
        ck.report(st == 200 and len(c["claims"]) == 10 and all(x["holds"] for x in c["claims"]) and c == c2,
                  "/v1/claims: ten claims hold, the same for the same seed", [x["id"] for x in c.get("claims", [])])
        causal_line = [l for x in c.get("claims", []) if x["id"] == "causal" for l in x["lines"]]
        ck.report(any(l.startswith("the served model") for l in causal_line),
                  "/v1/claims: parallel = sequential is shown on the served language model", causal_line)
        for q in ("seed=abc", "seed=-1", "seed=", "seed=99999999999999999999"):
            st, b = s.request("GET", "/v1/claims?" + q)
            error_of(ck, "/v1/claims 400: " + q, st, b, 400, "seed")
        c_ = http.client.HTTPConnection(s.host, s.port, timeout=30)
        c_.request("GET", "/")
        r = c_.getresponse()
        page = r.read().decode()
        ck.report(r.status == 200 and "<title>qkv explorer</title>" in page and "http" not in
                  page.replace("http://www.w3.org/2000/svg", "").split("<script>")[0].lower() and "src=" not in page,
                  "GET /: the explorer page, fetching nothing from elsewhere", r.status)
    finally:
        s.stop()
    s = Server(qkv, tr)
    try:
        st, a = s.request("POST", "/v1/attention", {"source": "one two three", "text": "three two one"})
        T, S = len(a.get("tokens", [])), len(a.get("source_tokens", []))
        kinds = sorted(set((m_["stack"], m_["kind"]) for m_ in a.get("maps", [])))
        shapes_ok = st == 200 and all(
            len(m_["weights"]) == (S if m_["stack"] == "encoder" else T) and
            all(len(r) == (T if m_["stack"] == "decoder" and m_["kind"] == "self" else S) for r in m_["weights"])
            for m_ in a["maps"])
        ck.report(shapes_ok and kinds == [("decoder", "cross"), ("decoder", "self"), ("encoder", "self")] and
                  rows_sum_to_one(a["maps"]) and a["tokens"][0] == "<s>",
                  "/v1/attention on a translator: encoder self (S x S), decoder self (T x T), cross (T x S)",
                  a if not shapes_ok else kinds)
        st, b = s.request("POST", "/v1/attention", {"text": "three two one"})
        error_of(ck, "/v1/attention 400: a translator needs a source", st, b, 400, "source")
    finally:
        s.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--keep", help="work directory to keep")
    ap.add_argument("--openai-client", metavar="NODE_MODULES",
                    help="only run tests/openai_client.mjs (OpenAI's Node client, from this node_modules) "
                         "against a tiny language model")
    a = ap.parse_args()
    qkv = os.path.abspath(a.qkv)
    work = a.keep or tempfile.mkdtemp(prefix="serve_test.")
    os.makedirs(work, exist_ok=True)
    if a.openai_client:
        lm = tiny_lm(qkv, work)
        tpl = os.path.join(work, "chatml.jinja")
        with open(tpl, "w") as f:
            f.write(CHATML)
        s = Server(qkv, lm, "--api-key", KEY, "--chat-template", tpl)
        try:
            p = subprocess.run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_client.mjs"),
                                a.openai_client, "http://%s:%d/v1" % (s.host, s.port), KEY],
                               capture_output=True, text=True, timeout=300)
        finally:
            s.stop()
        print(p.stdout + p.stderr, end="")
        sys.exit(p.returncode)
    words = "zero one two three four five six seven eight nine".split()
    rng = random.Random(1)
    with open(os.path.join(work, "text.txt"), "w") as f:
        for i in range(300):
            f.write("And God said let there be %s and %s\n" % (rng.choice(words), rng.choice(words)))
    with open(os.path.join(work, "pairs.tsv"), "w") as f:
        for i in range(200):
            w = rng.sample(words, 3)
            f.write("%s\t%s\n" % (" ".join(w), " ".join(reversed(w))))
    with open(os.path.join(work, "labels.tsv"), "w") as f:
        for i in range(200):
            w = rng.sample(words, 2)
            f.write("%s\t%s\n" % ("odd" if words.index(w[0]) % 2 else "even", " ".join(w)))
    common = ["--threads", "2", "train", "--steps", "6", "--preset", "tiny", "--max-len", "96", "--seed", "1"]
    lm, tr, cls = (os.path.join(work, n) for n in ("lm", "tr", "cls"))
    for d in (lm, tr, cls):
        shutil.rmtree(d, ignore_errors=True)
    run([qkv] + common + ["--task", "lm", "--data", os.path.join(work, "text.txt"), "--out", lm, "--tokenizer", "byte"])
    run([qkv] + common[:3] + ["--steps", "80", "--preset", "tiny", "--max-len", "48", "--seed", "1", "--lr", "3",
                              "--task", "translate", "--data", os.path.join(work, "pairs.tsv"), "--out", tr,
                              "--tokenizer", "byte"])
    run([qkv] + common + ["--task", "classify", "--data", os.path.join(work, "labels.tsv"), "--out", cls, "--tokenizer",
                          "byte"])
    ck = Checks()
    lm_checks(ck, qkv, lm)
    cors_checks(ck, qkv, lm)
    chat_checks(ck, qkv, lm, work)
    sentencepiece_checks(ck, qkv, work)
    metrics_checks(ck, qkv, lm)
    prompt_reuse_checks(ck, qkv, lm)
    packed_checks(ck, qkv, lm)
    task_checks(ck, qkv, tr, cls, work)
    embedding_checks(ck, qkv, lm, tr)
    structured_checks(ck, qkv, work)
    inspect_checks(ck, qkv, lm, tr, work)
    print("%d passed, %d failed" % (ck.passed, ck.failed))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ck.failed == 0 else 1)


if __name__ == "__main__":
    main()

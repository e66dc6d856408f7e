#!/usr/bin/python3
"""The explorer page (qkv serve's GET /) in a real browser: headless Chromium (Debian's chromium)
driven by puppeteer-core from npm (installed at test time into the work directory).

    /usr/bin/python3 tests/explorer_test.py --qkv build/qkv --work DIR [--chromium /usr/bin/chromium]

Trains a tiny language model and a tiny translator, serves each, and runs tests/explorer_browser.js
on the page: the worked example shows 0.4223 / 0.1554 / 0.4223 and 5.912 / 4.088; a changed query
gives what `qkv attend` computes on the same numbers; masking renormalises; the heatmap grid has
layers x heads cells (encoder, decoder and cross-attention for the translator) whose rows sum to 1;
a clicked map is enlarged, named in the URL and restored from it, a hovered cell shows its exact
weight; the temperature slider changes the probabilities and not the logits; the chapter's nine
claims hold; no JavaScript errors. Screenshots of every section are written to DIR/shots (kept).
Also: with --api-key the page itself loads without the key and the API refuses requests without it.

Prints one line per check and "N passed, M failed"; exit status 1 if any failed.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_test  # noqa: E402  (its Server, run and Checks)

NPM_PACKAGES = {"puppeteer-core": "24.43.1"}  # engines: node >= 18 (Debian 12 has 18)


def ensure_npm(work):
    prefix = os.path.join(work, "npm")
    modules = os.path.join(prefix, "node_modules")
    want = [f"{n}@{v}" for n, v in NPM_PACKAGES.items()
            if not os.path.exists(os.path.join(modules, n, "package.json"))
            or json.load(open(os.path.join(modules, n, "package.json"))).get("version") != v]
    if want:
        os.makedirs(prefix, exist_ok=True)
        serve_test.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", prefix] + want)
    return modules


def attend_output(qkv, work, q):
    """`qkv attend` on the chapter's keys and values with query q: its output (Dv)."""
    d = os.path.join(work, "attend")
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "q.npy"), np.array([q], np.float32))
    np.save(os.path.join(d, "k.npy"), np.array([[1, 0], [0, 1], [1, 1]], np.float32))
    np.save(os.path.join(d, "v.npy"), np.array([[10, 0], [0, 10], [4, 6]], np.float32))
    serve_test.run([qkv, "attend", "--q", os.path.join(d, "q.npy"), "--k", os.path.join(d, "k.npy"), "--v",
                    os.path.join(d, "v.npy"), "--out", os.path.join(d, "out.npy")])
    return [float(x) for x in np.load(os.path.join(d, "out.npy"))[0]]


def cli_viridis():
    """The control points of qkv's SVG heatmap palette, read from src/viz/svg.cpp (the page must use the same)."""
    src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "viz", "svg.cpp")).read()
    body = src[src.index("kViridis[] = {"):]
    body = body[:body.index("};")]
    pts = [[int(x, 16) for x in m] for m in re.findall(r"\{0x([0-9a-f]{2}), 0x([0-9a-f]{2}), 0x([0-9a-f]{2})\}", body)]
    if len(pts) != 11:
        sys.exit("explorer_test: expected 11 viridis points in src/viz/svg.cpp, found %d" % len(pts))
    return pts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--work", required=True, help="work directory (npm packages, models, shots/)")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()
    qkv, work = os.path.abspath(a.qkv), os.path.abspath(a.work)
    if not os.path.exists(a.chromium):
        sys.exit(f"explorer_test: {a.chromium} does not exist (apt-get install chromium: scripts/install-deps.sh)")
    os.makedirs(work, exist_ok=True)
    shots = os.path.join(work, "shots")
    shutil.rmtree(shots, ignore_errors=True)
    os.makedirs(shots)
    modules = ensure_npm(work)
    words = "zero one two three four five six seven eight nine".split()
    with open(os.path.join(work, "text.txt"), "w") as f:
        for i in range(200):
            f.write("And God said let there be %s and %s\n" % (words[i % 10], words[(i * 7) % 10]))
    with open(os.path.join(work, "pairs.tsv"), "w") as f:
        for i in range(200):
            w = [words[i % 10], words[(i * 3 + 1) % 10], words[(i * 7 + 2) % 10]]
            f.write("%s\t%s\n" % (" ".join(w), " ".join(reversed(w))))
    lm, tr = os.path.join(work, "lm"), os.path.join(work, "tr")
    common = ["--threads", "2", "train", "--preset", "tiny", "--max-len", "64", "--seed", "1", "--tokenizer", "byte"]
    for d, task, data, steps in ((lm, "lm", "text.txt", "20"), (tr, "translate", "pairs.tsv", "40")):
        shutil.rmtree(d, ignore_errors=True)
        serve_test.run([qkv] + common + ["--steps", steps, "--task", task, "--data", os.path.join(work, data),
                                         "--out", d])
    changed_q = [2.0, 0.5]
    changed = {"q": changed_q, "output": attend_output(qkv, work, changed_q)}
    viridis = cli_viridis()
    ck = serve_test.Checks()
    # the third: a server answering fewer attention weights than the whole model's maps (the page
    # picks fewer layers; the tiny LM's 4 layers x 4 heads on its ~33-token text are ~17,000)
    for name, model, task, extra in (("lm", lm, "lm", []), ("translator", tr, "translate", []),
                                     ("lm-limited", lm, "lm", ["--max-attention", "5000"])):
        s = serve_test.Server(qkv, model, *extra)
        try:
            arg = dict(modules=modules, chromium=a.chromium, url=f"http://{s.host}:{s.port}/", task=task, shots=shots,
                       name=name, changed=changed, viridis=viridis, limited=bool(extra))
            p = subprocess.run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "explorer_browser.js"),
                                json.dumps(arg)], capture_output=True, text=True, timeout=300)
            lines = p.stdout.splitlines()
            for line in lines:
                if line.startswith("PASS ") or line.startswith("FAIL "):
                    ck.report(line.startswith("PASS "), line[5:])
            if p.returncode != 0 and not any(l.startswith("FAIL ") for l in lines):
                ck.report(False, f"{name}: the browser script failed ({p.returncode})", p.stdout[-800:] + p.stderr[-1500:])
        finally:
            s.stop()
    # with --api-key: the page loads, the API wants the key
    s = serve_test.Server(qkv, lm, "--api-key", serve_test.KEY)
    try:
        c = http.client.HTTPConnection(s.host, s.port, timeout=30)
        c.request("GET", "/")
        r = c.getresponse()
        page = r.read().decode()
        ck.report(r.status == 200 and "qkv explorer" in page and r.getheader("Content-Type", "").startswith("text/html"),
                  "with --api-key, GET / serves the page without the key", r.status)
        st, b = s.request("GET", "/v1/model", key=None)
        ck.report(st == 401, "with --api-key, /v1/model without the key is refused (401)", (st, b))
        st, b = s.request("GET", "/v1/model")
        ck.report(st == 200 and b.get("task") == "lm", "with the key, /v1/model answers", (st, b))
    finally:
        s.stop()
    print(f"screenshots: {shots}: " + ", ".join(sorted(os.listdir(shots))))
    print("%d passed, %d failed" % (ck.passed, ck.failed))
    sys.exit(0 if ck.failed == 0 else 1)


if __name__ == "__main__":
    main()

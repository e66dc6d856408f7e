"""Signals while qkv computes from Python. oneDNN's AVX-512 GEMM kernels point the stack pointer
into heap memory while they run, so a signal handler (Python's own C handler included) running on
a computing thread corrupts the heap (qkv/signals.h). The module blocks the asynchronous signals
in its computing threads and takes them when the computation ends, or at qkv.train's callbacks:
a flood of signals with a Python handler leaves training intact, and Ctrl-C stops qkv.train with
its checkpoint saved, raising KeyboardInterrupt. Each run is a child process, so a crash fails the
test instead of ending pytest."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

PYTHONPATH = os.pathsep.join(p for p in sys.path if p)


def run_child(code, tmp_path, **popen):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-c", code], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **popen)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(2)
    path = tmp_path_factory.mktemp("data") / "lm.txt"
    words = "zero one two three four five six seven eight nine".split()
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)) + "\n")
    return str(path)


TRAIN = """
import qkv
qkv.set_num_threads(2)
r = qkv.train(out="run", task="lm", data=%r, preset="tiny", max_len=64, max_tokens=4096, tokenizer="byte",
              eval_every=10, log=False, %s)
"""


def test_a_flood_of_signals_during_training_is_handled_after_the_compute(corpus, tmp_path):
    code = """
import os, signal, threading, time
taken = [0]
signal.signal(signal.SIGUSR1, lambda *a: taken.__setitem__(0, taken[0] + 1))
done = threading.Event()
def pester():  # process-directed signals, as kill(1) sends them, every 2 ms
    sent = 0
    while not done.is_set():
        os.kill(os.getpid(), signal.SIGUSR1)
        sent += 1
        time.sleep(0.002)
threading.Thread(target=pester, daemon=True).start()
""" + TRAIN % (corpus, "steps=40") + """
done.set()
m = qkv.Model.load("run")
for _ in range(20):
    m.forward(m.encode("one two three four five six"))
print("steps", r["steps"], "signals", taken[0])
"""
    p = run_child(code, tmp_path)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    words = out.split()
    assert words[-4] == "steps" and words[-3] == "40", out
    assert int(words[-1]) >= 1, out  # Python's handler ran (pending signals coalesce into one)


def test_ctrl_c_stops_training_with_a_checkpoint_and_raises_keyboard_interrupt(corpus, tmp_path):
    code = """
import os
def progress(p):
    if p["step"] == 3:
        open("started", "w").close()
try:
""" + "\n".join("    " + line for line in (TRAIN % (corpus, "minutes=5, progress=progress")).splitlines()) + """
    print("finished", r["steps"])
except KeyboardInterrupt:
    print("interrupted; checkpoint", os.path.exists("run/checkpoint.safetensors"))
"""
    p = run_child(code, tmp_path)
    t0 = time.time()
    while not (tmp_path / "started").exists():
        assert p.poll() is None and time.time() - t0 < 300, p.stdout.read()
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0 and "interrupted; checkpoint True" in out, out
    assert (tmp_path / "run" / "checkpoint.safetensors").exists()


def test_ctrl_c_stops_a_long_generation_between_tokens(corpus, tmp_path):
    # 32 sampled continuations of up to 1,000 tokens from a model trained for one step (its
    # end-of-text is about 1 token in 260, so some row runs for hundreds of tokens); Ctrl-C is
    # taken between two tokens, not when the whole call returns
    code = """
import time
import qkv
qkv.set_num_threads(2)
qkv.train(out="run", task="lm", data=%r, preset="tiny", max_len=1024, max_tokens=4096, tokenizer="byte",
          steps=1, log=False)
m = qkv.Model.load("run")
def once():
    t0 = time.time()
    m.generate("one two", max_new_tokens=1000, temperature=1.0, seed=1, n=32)
    return time.time() - t0
once()  # warm
t0 = time.time()
open("started", "w").close()
try:
    once()
    print("not interrupted")
except KeyboardInterrupt:
    cut = time.time() - t0
    print("interrupted after %%.2f s; whole %%.2f s" %% (cut, once()))
""" % corpus
    p = run_child(code, tmp_path)
    t0 = time.time()
    while not (tmp_path / "started").exists():
        assert p.poll() is None and time.time() - t0 < 300, p.stdout.read()
        time.sleep(0.01)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and "interrupted after" in out, out
    words = out.split()
    cut, whole = float(words[-5]), float(words[-2])
    assert cut < whole / 2, out

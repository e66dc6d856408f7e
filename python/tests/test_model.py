"""qkv.Model from Python: tiny models trained here by the qkv command (QKV_BIN), loaded from their
directories; generate, translate and classify give what the command line gives; logits are
NumPy arrays over qkv's memory; bad input raises qkv.Error naming the problem."""
import os
import random
import subprocess

import numpy as np
import pytest

import qkv

QKV = os.environ.get("QKV_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "qkv"))
WORDS = "zero one two three four five six seven eight nine".split()


def train(tmp, task, lines, steps, *extra):
    data = os.path.join(tmp, task + ".txt")
    with open(data, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = os.path.join(tmp, task)
    subprocess.run([QKV, "--threads", "2", "train", "--task", task, "--data", data, "--out", out, "--preset", "tiny",
                    "--steps", str(steps), "--max-len", "64", "--seed", "1", "--tokenizer", "byte"] + list(extra),
                   check=True, capture_output=True)
    return out


def cli(*args):
    return subprocess.run([QKV, "--threads", "2"] + list(args), check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("models"))
    rng = random.Random(1)
    lm = train(tmp, "lm", ["And God said let there be %s" % rng.choice(WORDS) for _ in range(200)], 8)
    pairs = []
    for _ in range(150):
        w = rng.sample(WORDS, 3)
        pairs.append("%s\t%s" % (" ".join(w), " ".join(reversed(w))))
    tr = train(tmp, "translate", pairs, 10)
    labels = []
    for _ in range(150):
        w = rng.sample(WORDS, 2)
        labels.append("%s\t%s" % ("odd" if WORDS.index(w[0]) % 2 else "even", " ".join(w)))
    cls = train(tmp, "classify", labels, 8)
    return {"lm": lm, "translate": tr, "classify": cls}


def test_a_language_model_generates_what_the_command_line_generates(models):
    m = qkv.Model.load(models["lm"])
    assert m.task == "lm" and m.config["arch"] == "decoder" and m.config["parameters"] > 0
    text = m.generate("And God", max_new_tokens=12, temperature=0)
    want = cli("generate", "--model", models["lm"], "--prompt", "And God", "--max-len", "12")
    assert isinstance(text, str) and want == "And God" + text + "\n"  # qkv generate prints prompt + continuation
    ids = m.generate(m.encode("And God"), max_new_tokens=5, temperature=0)
    assert isinstance(ids, list) and len(ids) <= 5
    # sampling is reproducible by seed
    a = m.generate("And", max_new_tokens=8, temperature=0.9, seed=4)
    assert a == m.generate("And", max_new_tokens=8, temperature=0.9, seed=4)


def test_forward_gives_logits_over_qkvs_memory(models):
    m = qkv.Model.load(models["lm"])
    ids = m.encode("And God said")
    z = m.forward(ids)
    assert z.shape == (1, len(ids), m.config["vocab_size"]) and z.dtype == np.float32
    assert not z.flags.owndata and np.isfinite(z).all()
    # the greedy first token is the argmax of the last row (the prompt as the model reads it)
    assert m.decode(m.encode("And God said")) == "And God said"


def test_translate_and_classify_match_the_command_line(models):
    tr = qkv.Model.load(models["translate"])
    got = tr.translate(["one two three", "four five six"], beam_size=2)
    p = subprocess.run([QKV, "--threads", "2", "translate", "--model", models["translate"], "--beam", "2"],
                       input="one two three\nfour five six\n", capture_output=True, text=True, check=True)
    assert got == p.stdout.splitlines()
    cls = qkv.Model.load(models["classify"])
    assert cls.task == "classify" and sorted(cls.labels) == ["even", "odd"]
    res = cls.classify(["one two", "two three"])
    p = subprocess.run([QKV, "--threads", "2", "classify", "--model", models["classify"]], input="one two\ntwo three\n",
                       capture_output=True, text=True, check=True)
    for (label, prob), line in zip(res, p.stdout.splitlines()):
        cl, cp, _ = line.split("\t")
        assert label == cl and abs(prob - float(cp)) < 1e-3


def test_attention_maps_are_every_layers_distributions(models):
    m = qkv.Model.load(models["lm"])
    r = m.attention_maps("And God said")
    n = len(r["ids"])
    assert len(r["maps"]) == m.config["n_layers"]
    for mp in r["maps"]:
        w = mp["weights"]
        assert w.shape == (m.config["n_heads"], n, n) and mp["kind"] == "self"
        assert np.allclose(w.sum(-1), 1, atol=1e-5)
        assert np.abs(np.triu(w, 1)).max() == 0  # causal: nothing from the future
    one = m.attention_maps("And God said", layers=[0], heads=[1])
    assert len(one["maps"]) == 1 and np.array_equal(one["maps"][0]["weights"][0], r["maps"][0]["weights"][1])
    tr = qkv.Model.load(models["translate"])
    t = tr.attention_maps("six five", source="five six")
    kinds = sorted({(mp["stack"], mp["kind"]) for mp in t["maps"]})
    assert kinds == [("decoder", "cross"), ("decoder", "self"), ("encoder", "self")]
    cross = [mp for mp in t["maps"] if mp["kind"] == "cross"][0]["weights"]
    assert cross.shape[1:] == (len(t["ids"]), len(t["source_ids"]))
    with pytest.raises(qkv.Error, match="source"):
        tr.attention_maps("six five")


def test_bad_input_raises_qkv_errors(models, tmp_path):
    with pytest.raises(qkv.Error, match="nope"):
        qkv.Model.load(str(tmp_path / "nope"))
    m = qkv.Model.load(models["lm"])
    with pytest.raises(qkv.Error, match="vocabulary"):
        m.forward([1, 2, 10 ** 6])
    with pytest.raises(ValueError, match="temperature"):
        m.generate("And", temperature=-1)
    with pytest.raises(qkv.Error, match="not a translation model"):
        m.translate(["x"])
    with pytest.raises(qkv.Error, match="dtype"):
        qkv.Model.load(models["lm"], dtype="int3")


def test_threads_share_a_model_safely(models):
    # the GIL is released while a model computes; calls on one model from two threads take turns
    import threading
    m = qkv.Model.load(models["lm"])
    want = m.generate("And God", max_new_tokens=16, temperature=0)
    got = []
    ts = [threading.Thread(target=lambda: got.append(m.generate("And God", max_new_tokens=16, temperature=0)))
          for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == [want] * 4

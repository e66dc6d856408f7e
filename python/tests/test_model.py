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


def test_generate_takes_the_command_lines_options(models):
    m = qkv.Model.load(models["lm"])
    # n samples: qkv generate --sample -n 3 (the prompt three times, one seed)
    got = m.generate("And God", max_new_tokens=10, temperature=0.8, top_k=20, seed=5, n=3)
    want = cli("generate", "--model", models["lm"], "--prompt", "And God", "--max-len", "10", "--sample",
               "--temperature", "0.8", "--top-k", "20", "--seed", "5", "-n", "3").splitlines()
    assert isinstance(got, list) and len(got) == 3 and ["And God" + g for g in got] == want
    # beam search's n best, ranked with a length penalty
    got = m.generate("And God", max_new_tokens=10, beam_size=4, n=2, length_penalty=0.6)
    want = cli("generate", "--model", models["lm"], "--prompt", "And God", "--max-len", "10", "--beam", "4", "-n",
               "2", "--length-penalty", "0.6").splitlines()
    assert ["And God" + g for g in got] == want
    # a list of prompts: each as it would be alone
    many = m.generate(["And God", "let there"], max_new_tokens=6)
    assert many == [m.generate("And God", max_new_tokens=6), m.generate("let there", max_new_tokens=6)]
    assert m.generate([m.encode("And"), m.encode("God")], max_new_tokens=3) == [
        m.generate(m.encode("And"), max_new_tokens=3), m.generate(m.encode("God"), max_new_tokens=3)]
    # greedy is the default, as on the command line
    assert m.generate("And God", max_new_tokens=12) == m.generate("And God", max_new_tokens=12, temperature=0)
    # options that would be ignored, or out of range, are refused
    for kwargs, words in [(dict(top_k=5), "apply to sampling"), (dict(seed=3), "apply to sampling"),
                          (dict(n=2), "greedy decoding has one continuation"),
                          (dict(beam_size=2, n=3), "at most its 2 best"),
                          (dict(length_penalty=0.5), "give beam_size >= 2"),
                          (dict(beam_size=2, repetition_penalty=1.3), "not to beam search"),
                          (dict(temperature=0.5, beam_size=2), "samples one token at a time"),
                          (dict(temperature=float("nan")), "temperature nan"),
                          (dict(temperature=0.5, top_p=0.0), "top_p 0"),
                          (dict(max_new_tokens=0), "max_new_tokens 0")]:
        with pytest.raises(qkv.Error, match=words):
            m.generate("And", **kwargs)


def test_translate_takes_the_command_lines_options(models):
    tr = qkv.Model.load(models["translate"])
    lines = ["one two three", "", "four five six", "seven eight nine"]
    p = subprocess.run([QKV, "--threads", "2", "translate", "--model", models["translate"], "--sample", "--seed", "7",
                        "--temperature", "0.7", "--batch", "2"], input="\n".join(lines) + "\n", capture_output=True,
                       text=True, check=True)
    got = tr.translate(lines, temperature=0.7, seed=7, batch=2)
    assert got == p.stdout.split("\n")[:4] and got[1] == ""  # an empty line stays an empty line
    p = subprocess.run([QKV, "--threads", "2", "translate", "--model", models["translate"], "--beam", "3",
                        "--length-penalty", "0.5", "--max-len", "6"], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, check=True)
    assert tr.translate(lines, beam_size=3, length_penalty=0.5, max_new_tokens=6) == p.stdout.split("\n")[:4]
    for kwargs, words in [(dict(top_k=3), "apply to sampling"), (dict(temperature=0.5, beam_size=3), "samples one"),
                          (dict(beam_size=1, length_penalty=0.7), "give beam_size >= 2"),
                          (dict(repetition_penalty=1.2), "not to beam search"), (dict(batch=0), "batch 0")]:
        with pytest.raises(qkv.Error, match=words):
            tr.translate(lines, **kwargs)


def test_forward_takes_a_batch_and_a_target_as_qkv_forward(models, tmp_path):
    m = qkv.Model.load(models["lm"])
    a, b = m.encode("And God said let"), m.encode("let there")
    T = len(a)
    ids = np.zeros((2, T), np.int64)
    ids[0], ids[1, :len(b)] = a, b
    lengths = np.array([T, len(b)], np.int64)
    target = np.full((2, T), 0, np.int64)
    target[0, :-1], target[1, :len(b) - 1] = a[1:], b[1:]
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "len.npy", lengths)
    np.save(tmp_path / "tgt.npy", target)
    line = cli("forward", "--model", models["lm"], "--input", str(tmp_path / "ids.npy"), "--lengths",
               str(tmp_path / "len.npy"), "--target", str(tmp_path / "tgt.npy"), "--out", str(tmp_path / "z.npy"))
    z, loss = m.forward(ids, lengths=lengths, target=target)
    assert z.shape == (2, T, m.config["vocab_size"])
    assert np.array_equal(z, np.load(tmp_path / "z.npy"))
    assert ("loss %.9g" % loss) in line
    # a row of the batch is that row alone, up to its length
    alone = m.forward(b)
    np.testing.assert_allclose(z[1, :len(b)], alone[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="integer token ids"):
        m.forward(ids.astype(np.float32))
    with pytest.raises(qkv.Error, match="lengths"):
        m.forward(ids, lengths=np.array([T + 5, 1]))
    with pytest.raises(ValueError, match="label_smoothing applies to the loss"):
        m.forward(ids, label_smoothing=0.1)


def test_the_tokenizer_is_the_models_and_keeps_it_alive(models):
    import gc
    m = qkv.Model.load(models["translate"])
    t = m.tokenizer
    assert t.encode("one two three") == m.encode("one two three")
    assert t.decode(t.encode("one two three")) == "one two three"
    assert t.vocab_size <= m.config["vocab_size"] and t.eos_id >= 0 and t.type == "byte"  # trained with --tokenizer byte
    assert all(isinstance(t.piece(i), bytes) for i in range(t.vocab_size))
    with pytest.raises(qkv.Error, match="outside the vocabulary"):
        t.piece(t.vocab_size)
    del m
    gc.collect()
    assert t.decode(t.encode("four five")) == "four five"  # the tokenizer holds its model


def test_numpy_integers_and_arrays_are_one_input_or_many_by_their_shape(models):
    m = qkv.Model.load(models["lm"])
    ids = m.encode("And God said")
    one = m.forward(ids)
    np.testing.assert_array_equal(m.forward([np.int64(i) for i in ids]), one)
    np.testing.assert_array_equal(m.forward(np.array(ids, np.int32)), one)
    np.testing.assert_array_equal(m.forward(np.array([ids], np.int64)), one)  # (1, T): a batch of one
    assert m.generate(np.array(ids), max_new_tokens=3) == m.generate(ids, max_new_tokens=3)
    assert m.generate(np.array([ids, ids]), max_new_tokens=3) == [m.generate(ids, max_new_tokens=3)] * 2

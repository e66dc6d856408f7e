#!/usr/bin/env python3
"""qkv's chat templates (qkv/chat_template.h) against Jinja2 itself (Debian's python3-jinja2),
configured as transformers' apply_chat_template configures it: an immutable sandbox with
trim_blocks, lstrip_blocks and the loop-control extension, transformers' tojson and
raise_exception. Every template in tests/chat_templates (the published templates of Llama 2,
Llama 3 and 3.1, ChatML as SmolLM2 and Qwen 2.5 write it, Mistral, Gemma, Phi-3, Zephyr, and a
template of the remaining features) renders many random conversations in both; the prompt strings
must be identical, and where Jinja2 raises, qkv must refuse too (raise_exception's message
word for word).

    chat_template_parity.py --qkv build/qkv
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class Refused(Exception):
    pass


def raise_exception(message):
    raise Refused(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


TEXTS = [
    "Hi there", "Hello!", "Ok, thanks.", "  leading and trailing spaces  ", "two\nlines", "\n\nblank lines\n\n",
    "quotes ' and \" and \\ backslash", "Grüße aus Köln — ça va?", "日本語のテキスト", "emoji 🙂 and ♥", "",
    "{{ not a tag }} {% neither %}", "tab\there", "What is 2 + 2?", "It is 4.", "a" * 50,
    "Say 'hi' in French.", "<|im_end|> inside text", "   ", "Ends with newline\n",
]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                      "days": {"type": "integer"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Adds numbers é",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}},
]


def conversation(rng, with_tools):
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": rng.choice(TEXTS)})
    turns = rng.randint(1, 7)
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        if rng.random() < 0.06:  # roles that break alternation, or one a template refuses
            role = rng.choice(["assistant", "user", "system", "narrator"])
        msg = {"role": role, "content": rng.choice(TEXTS)}
        if with_tools and role == "assistant" and rng.random() < 0.3:
            msg["tool_calls"] = [{"type": "function", "function": {"name": "get_weather",
                                                                   "arguments": {"city": rng.choice(TEXTS[:6]), "days": rng.randint(1, 5)}}}]
            if rng.random() < 0.5:
                msg["content"] = ""
            msgs.append(msg)
            msgs.append({"role": "tool", "content": rng.choice(["sunny", "21.5", "{\"t\": 3}"])})
            continue
        msgs.append(msg)
    return msgs


def contexts(name, rng, n):
    with_tools = name in ("qwen2.5.jinja", "llama3.1-tools.jinja")
    out = []
    for _ in range(n):
        ctx = {"messages": conversation(rng, with_tools), "add_generation_prompt": rng.random() < 0.7,
               "bos_token": "<s>", "eos_token": "</s>"}
        if with_tools and rng.random() < 0.5:
            ctx["tools"] = TOOLS[: rng.randint(1, 2)]
        if name == "llama3.1-tools.jinja" and rng.random() < 0.3:
            ctx["builtin_tools"] = ["brave_search", "code_interpreter", "wolfram_alpha"]
            ctx["tools_in_user_message"] = rng.random() < 0.5
        out.append(ctx)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--cases", type=int, default=120, help="conversations per template")
    args = ap.parse_args()
    env = environment()
    rng = random.Random(2024)
    failures, checked, refused_both = 0, 0, 0
    names = sorted(f for f in os.listdir(os.path.join(HERE, "chat_templates")) if f.endswith(".jinja"))
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = os.path.join(HERE, "chat_templates", name)
            with open(path, encoding="utf-8") as f:
                source = f.read()
            template = env.from_string(source)
            ctxs = contexts(name, rng, args.cases)
            cpath = os.path.join(tmp, "contexts.json")
            with open(cpath, "w", encoding="utf-8") as f:
                json.dump(ctxs, f, ensure_ascii=False)
            r = subprocess.run([args.qkv, "chat-template", "--template", path, "--contexts", cpath],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL {name}: qkv exited {r.returncode}: {r.stderr.strip()}")
                failures += 1
                continue
            got = json.loads(r.stdout)
            assert len(got) == len(ctxs)
            ok = 0
            for i, (ctx, g) in enumerate(zip(ctxs, got)):
                try:
                    want, why = template.render(**ctx), None
                except Refused as e:
                    want, why = None, "refused: " + str(e)
                except jinja2.TemplateError as e:
                    want, why = None, "error: " + str(e)
                checked += 1
                if want is not None:
                    if g.get("text") != want:
                        failures += 1
                        print(f"FAIL {name} case {i}: differs\n  context: {json.dumps(ctx, ensure_ascii=False)}\n"
                              f"  jinja2: {want!r}\n  qkv:    {g.get('text', g.get('error'))!r}")
                    else:
                        ok += 1
                elif "error" not in g:
                    failures += 1
                    print(f"FAIL {name} case {i}: Jinja2 {why}, qkv rendered {g['text']!r}")
                elif why.startswith("refused: ") and not g["error"].endswith("the chat template refused: " + why[9:]):
                    failures += 1
                    print(f"FAIL {name} case {i}: Jinja2 {why}; qkv: {g['error']}")
                else:
                    refused_both += 1
            print(f"{name}: {ok} identical prompts, {len(ctxs) - ok} refused by both (of {len(ctxs)})")
            if ok < len(ctxs) // 3:
                print(f"FAIL {name}: too few conversations rendered ({ok}); the generator should exercise it")
                failures += 1
    print(f"{checked} conversations on {len(names)} templates, {refused_both} refused by both, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

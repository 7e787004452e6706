#!/usr/bin/env python3
"""By hand, where Hugging Face's own code is installed (transformers and
tokenizers; Debian has neither, so CI cannot run this): the tests'
independent references against the code they were written from.

The ctests hold the C++ to the references in tests/ (float64 logits to
1e-10, greedy text, token ids); this holds those references to
transformers' models and tokenizers' tokenizers, so a reading of the
modeling code that both the reference and the C++ got wrong the same way
(a window off by one, a norm's offset) shows here:

  - each family's random checkpoint, written by its reference's `write`
    (the family's names and layout: phi3's fused tensors, gpt2's Conv1D),
    loads in transformers with no tensor missing or left over; its logits
    over one prompt agree with the reference's, and transformers'
    generate() (with its KV cache, a sliding one for mistral) picks the
    reference's greedy tokens;
  - phi3 with a sliding window computes what mistral's reference computes
    with that window (the C++ reads phi3's sliding_window as mistral's);
  - each tokenizer.json tests/tokenizer_reference.py writes encodes and
    decodes its corpus as tokenizers' Tokenizer does.

  against_transformers.py WORKDIR    prints one line per check, exits 1 on a
                                     failed one

transformers computes RMSNorm and the rotary angles in float32 even for a
float64 model, so logits agree to about 1e-6, not 1e-10; a misread
semantic is off by 1e-2 or more. Ran on the lent GPU machine's image
(torch 2.11, transformers 5.17, tokenizers 0.23): docs/WEIGHTS.md.
"""
import importlib.util
import json
import os
import subprocess
import sys

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = list(b"The quick brown fox jumps over the lazy dog, twice.")
NEW = 12
TOLERANCE = 1e-4

# name: (reference script, write arguments)
CASES = {
    "llama": ("llama/reference.py", ["num_key_value_heads=2"]),
    "qwen2": ("families/reference.py", ["qwen2", "num_key_value_heads=2"]),
    "mistral": ("families/reference.py", ["mistral", "num_key_value_heads=1"]),
    "gemma": ("families/reference.py", ["gemma", "num_key_value_heads=1"]),
    # Phi3Config's default pad_token_id (32000) is past a 256-token vocabulary.
    "phi3": ("phi3/reference.py", ["num_key_value_heads=1", "pad_token_id=null"]),
    "gpt2": ("gpt2/reference.py", []),
    "gpt2_prefixed": ("gpt2/reference.py", ["prefix=1"]),
}


def module(path):
    spec = importlib.util.spec_from_file_location("ref_" + os.path.basename(os.path.dirname(path)), path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def hf_model(directory):
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64, attn_implementation="eager",
                                                       output_loading_info=True)
    # A tied lm_head.weight, and GPT-2's causal-mask buffers, are not in the
    # files; anything else missing or left over is a naming fault.
    def expected(k):
        return k == "lm_head.weight" or k.endswith((".attn.bias", ".attn.masked_bias"))
    left = {k: [n for n in v if not expected(n)] for k, v in info.items()
            if k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    left = {k: v for k, v in left.items() if v}
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval(), left


def greedy(ref, W, c):
    tokens = list(PROMPT)
    for _ in range(NEW):
        tokens.append(int(ref.logits(W, c, tokens)[-1].argmax()))
    return tokens[len(PROMPT):]


def one(name, work):
    script, args = CASES[name]
    directory = os.path.join(work, name)
    subprocess.run([sys.executable, os.path.join(TESTS, script), "write", directory] + args, check=True)
    ref = module(os.path.join(TESTS, script))
    c, W = ref.load(directory)
    want = ref.logits(W, c, PROMPT)
    model, left = hf_model(directory)
    ids = torch.tensor([PROMPT])
    got = model(ids).logits[0].double()
    diff = float((got - want).abs().max())
    hf_tokens = model.generate(ids, max_new_tokens=NEW, do_sample=False)[0, len(PROMPT):].tolist()
    ours = greedy(ref, W, c)
    ok = not left and diff < TOLERANCE and hf_tokens == ours
    print(f"{'ok' if ok else 'FAIL'} {name}: logits max |diff| {diff:.2e}, greedy {'equal' if hf_tokens == ours else f'{hf_tokens} vs {ours}'}"
          + (f", loading left {left}" if left else ""))
    return ok


def phi3_window(work):
    """phi3's sliding window is mistral's: the same weights unfused, computed
    by the mistral reference with that window, equal transformers' phi3."""
    directory = os.path.join(work, "phi3_window")
    subprocess.run([sys.executable, os.path.join(TESTS, "phi3/reference.py"), "write", directory,
                    "num_key_value_heads=1", "pad_token_id=null", "sliding_window=8"], check=True)
    fam = module(os.path.join(TESTS, "families/reference.py"))
    phi3 = module(os.path.join(TESTS, "phi3/reference.py"))
    c, W = phi3.load(directory)
    d = c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    split = {}
    for n, t in W.items():
        if n.endswith("qkv_proj.weight"):
            p = n[: -len("qkv_proj.weight")]
            split[p + "q_proj.weight"], split[p + "k_proj.weight"], split[p + "v_proj.weight"] = t.split([q, kv, kv])
        elif n.endswith("gate_up_proj.weight"):
            p = n[: -len("gate_up_proj.weight")]
            split[p + "gate_proj.weight"], split[p + "up_proj.weight"] = t.chunk(2)
        else:
            split[n] = t
    cm = dict(c, model_type="mistral", sliding_window=8)
    want = fam.logits(split, cm, PROMPT)
    model, left = hf_model(directory)
    got = model(torch.tensor([PROMPT])).logits[0].double()
    diff = float((got - want).abs().max())
    without = float((got - phi3.logits(W, c, PROMPT)).abs().max())
    ok = not left and diff < TOLERANCE and without > 1e-2
    print(f"{'ok' if ok else 'FAIL'} phi3 sliding_window 8 as mistral's: |diff| {diff:.2e} "
          f"(the reference without a window: {without:.2e})" + (f", loading left {left}" if left else ""))
    return ok


def tokenizers_check(work):
    from tokenizers import Tokenizer
    out = os.path.join(work, "tokenizers")
    os.makedirs(out, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(TESTS, "tokenizer_reference.py"), out], check=True)
    corpus = json.load(open(os.path.join(out, "corpus.json"), encoding="utf-8"))
    ok = True
    for style in sorted(os.listdir(out)):
        path = os.path.join(out, style, "tokenizer.json")
        if not os.path.isfile(path):
            continue
        expected = json.load(open(os.path.join(out, style, "expected.json"), encoding="utf-8"))
        tok = Tokenizer.from_file(path)
        bad = []
        for i, text in enumerate(corpus):
            plain = tok.encode(text, add_special_tokens=False).ids
            special = tok.encode(text, add_special_tokens=True).ids
            decoded = tok.decode(expected["plain"][i], skip_special_tokens=False)
            if plain != expected["plain"][i] or special != expected["special"][i] or decoded != expected["decoded"][i]:
                bad.append(i)
                if len(bad) <= 3:
                    print(f"  {style} {text!r}: plain {plain} vs {expected['plain'][i]}; special {special} vs "
                          f"{expected['special'][i]}; decoded {decoded!r} vs {expected['decoded'][i]!r}")
        print(f"{'ok' if not bad else 'FAIL'} tokenizer {style}: {len(corpus) - len(bad)}/{len(corpus)} texts"
              + (f"; first differing: {corpus[bad[0]]!r}" if bad else ""))
        ok = ok and not bad
    return ok


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    torch.set_grad_enabled(False)
    results = []
    for name in CASES:
        try:
            results.append(one(name, work))
        except Exception as e:  # one line per check, whatever went wrong
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            results.append(False)
    for check in (phi3_window, tokenizers_check):
        try:
            results.append(check(work))
        except Exception as e:
            print(f"FAIL {check.__name__}: {type(e).__name__}: {e}")
            results.append(False)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()

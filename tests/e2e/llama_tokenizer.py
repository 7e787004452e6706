#!/usr/bin/python3
"""A Llama checkpoint directory with its tokenizer, and its greedy text in
Python, for tests/e2e/llama_tokenizer.sh. The tokens come from
tests/tokenizer_reference.py's byte-level BPE (its own pre-tokenizer and
merges, nothing shared with the C++) and the logits from
tests/llama/reference.py's float64 Llama.

  llama_tokenizer.py write DIR KEY=VALUE...   tokenizer.json (a GPT-2-style
      BPE of 300 merges, <|endoftext|> and pads to 560 ids),
      tokenizer_config.json (BOS and EOS <|endoftext|>, add_bos_token) and
      random Llama weights + config.json (vocab_size 560, KEY=VALUEs on top)
  llama_tokenizer.py greedy DIR PROMPT N      the prompt's ids (BOS first),
      then N greedy tokens or fewer: generation stops at an EOS id
      (generation_config.json's eos_token_id, else tokenizer_config.json's
      eos_token). Prints "PROMPT|TEXT" escaped as train_model prints a
      tokenizer's text, then "stopped at EOS id X after K tokens" or "no
      EOS", then the generated ids.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "llama"))
import tokenizer_reference as tr  # noqa: E402

SIZE = 560
EOT = "<|endoftext|>"


def write(directory, items):
    import reference
    vocab, merges = tr.train(tr.training_text(), "gpt2", 300)
    added = {}
    for k, name in enumerate([EOT] + ["<|pad%d|>" % k for k in range(SIZE - len(vocab) - 1)]):
        added[name] = vocab[name] = len(vocab)
    assert len(vocab) == SIZE
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tr.tokenizer_json("gpt2", vocab, merges, added), f, ensure_ascii=False)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "bos_token": EOT, "eos_token": {"content": EOT}}, f)
    reference.write(directory, ["vocab_size=%d" % SIZE] + items)


def tokenizer(directory):
    t = json.load(open(os.path.join(directory, "tokenizer.json"), encoding="utf-8"))
    vocab = t["model"]["vocab"]
    merges = [tuple(m.split(" ")) for m in t["model"]["merges"]]
    added = {a["content"]: a["id"] for a in t["added_tokens"]}
    return tr.Reference("gpt2", vocab, merges, added, False, None), {i: s for s, i in vocab.items()}, added


def decode(ids, id_to_token, added):
    byte_of = {c: b for b, c in tr.BYTE_CHAR.items()}
    out = b""
    for i in ids:
        token = id_to_token[i]
        out += token.encode() if token in added else bytes(byte_of[c] for c in token)
    return out


def printable_utf8(data):
    """generate.cpp's printable_utf8: characters past ASCII kept, other bytes escaped."""
    out, i = "", 0
    while i < len(data):
        b = data[i]
        if b >= 0x80:
            for n in (2, 3, 4):
                try:
                    ch = data[i:i + n].decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if len(ch) == 1:
                    out, i = out + ch, i + n
                    break
            else:
                out, i = out + "\\x%02x" % b, i + 1
            continue
        out += "\\n" if b == 10 else "\\\\" if b == 92 else "\\x%02x" % b if b < 0x20 or b == 0x7F else chr(b)
        i += 1
    return out


def eos_ids(directory, added):
    path = os.path.join(directory, "generation_config.json")
    if os.path.exists(path):
        e = json.load(open(path))["eos_token_id"]
        return e if isinstance(e, list) else [e]
    return [added[json.load(open(os.path.join(directory, "tokenizer_config.json")))["eos_token"]["content"]]]


def greedy(directory, prompt, n):
    import reference
    import torch
    torch.set_grad_enabled(False)
    c, W = reference.load(directory)
    ref, id_to_token, added = tokenizer(directory)
    tokens = [added[EOT]] + ref.encode(prompt, False)  # add_bos_token
    start, stop = len(tokens), eos_ids(directory, added)
    stopped = None
    for _ in range(n):
        tokens.append(int(reference.logits(W, c, tokens)[-1].argmax()))
        if tokens[-1] in stop:
            stopped = tokens.pop()
            break
    text = printable_utf8(prompt.encode()) + "|" + printable_utf8(decode(tokens[start:], id_to_token, added))
    sys.stdout.buffer.write((text + "\n").encode("utf-8"))
    print("stopped at EOS id %d after %d tokens" % (stopped, len(tokens) - start) if stopped is not None else "no EOS")
    print(" ".join(map(str, tokens[start:])))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 5 and sys.argv[1] == "greedy":
        greedy(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)

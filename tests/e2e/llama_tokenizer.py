#!/usr/bin/python3
"""A Llama checkpoint directory with its tokenizer, and its greedy text in
Python, for tests/e2e/llama_tokenizer.sh. The tokens come from
tests/tokenizer_reference.py's byte-level BPE (its own pre-tokenizer and
merges, nothing shared with the C++) or from python3-sentencepiece, the
logits from tests/llama/reference.py's float64 Llama.

  llama_tokenizer.py write DIR bpe|sentencepiece KEY=VALUE...
      bpe: tokenizer.json (a GPT-2-style BPE of 300 merges, <|endoftext|>
      and pads to 560 ids); sentencepiece: tokenizer.model (a BPE of 400
      pieces with byte fallback, trained here); tokenizer_config.json (BOS
      and EOS, add_bos_token) and random Llama weights + config.json
      (vocab_size the tokenizer's, KEY=VALUEs on top)
  llama_tokenizer.py greedy DIR PROMPT N      the prompt's ids (BOS first),
      then N greedy tokens or fewer: generation stops at an EOS id
      (generation_config.json's eos_token_id, else tokenizer_config.json's
      eos_token). Prints "PROMPT|TEXT" escaped as train_model prints a
      tokenizer's text, then "stopped at EOS id X after K tokens" or "no
      EOS", then the generated ids, then tokenizer_config.json's EOS id.
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


def write(directory, kind, items):
    import reference
    os.makedirs(directory, exist_ok=True)
    if kind == "sentencepiece":
        import sentencepiece as spm
        lines = [line for line in tr.training_text().split("\n") if line.strip()]
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=os.path.join(directory, "tokenizer"), model_type="bpe",
            vocab_size=400, byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
            remove_extra_whitespaces=False, split_digits=True, character_coverage=1.0, minloglevel=2)
        os.remove(os.path.join(directory, "tokenizer.vocab"))
        special, size = {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"}, 400
    else:
        vocab, merges = tr.train(tr.training_text(), "gpt2", 300)
        added = {}
        for name in [EOT] + ["<|pad%d|>" % k for k in range(SIZE - len(vocab) - 1)]:
            added[name] = vocab[name] = len(vocab)
        assert len(vocab) == SIZE
        with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tr.tokenizer_json("gpt2", vocab, merges, added), f, ensure_ascii=False)
        special, size = {"add_bos_token": True, "bos_token": EOT, "eos_token": {"content": EOT}}, SIZE
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(special, f)
    reference.write(directory, ["vocab_size=%d" % size] + items)


class Bpe:
    """tokenizer.json through tokenizer_reference.py's encoder."""

    def __init__(self, directory):
        t = json.load(open(os.path.join(directory, "tokenizer.json"), encoding="utf-8"))
        vocab = t["model"]["vocab"]
        merges = [tuple(m.split(" ")) for m in t["model"]["merges"]]
        self.added = {a["content"]: a["id"] for a in t["added_tokens"]}
        self.ref = tr.Reference("gpt2", vocab, merges, self.added, False, None)
        self.id_to_token = {i: s for s, i in vocab.items()}

    def id_of(self, token):
        return self.added[token]

    def encode(self, text):
        return self.ref.encode(text, False)

    def decode(self, ids):
        byte_of = {c: b for b, c in tr.BYTE_CHAR.items()}
        out = b""
        for i in ids:
            token = self.id_to_token[i]
            out += token.encode() if token in self.added else bytes(byte_of[c] for c in token)
        return out


class SentencePiece:
    def __init__(self, directory):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=os.path.join(directory, "tokenizer.model"))

    def id_of(self, token):
        return self.sp.piece_to_id(token)

    def encode(self, text):
        return self.sp.encode(text)

    def decode(self, ids):
        return self.sp.decode(ids).encode("utf-8")


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


def token_text(config, key):
    v = config[key]
    return v["content"] if isinstance(v, dict) else v


def greedy(directory, prompt, n):
    import reference
    import torch
    torch.set_grad_enabled(False)
    c, W = reference.load(directory)
    sp = os.path.exists(os.path.join(directory, "tokenizer.model"))
    tok = SentencePiece(directory) if sp else Bpe(directory)
    config = json.load(open(os.path.join(directory, "tokenizer_config.json")))
    eos = tok.id_of(token_text(config, "eos_token"))
    stop = [eos]
    path = os.path.join(directory, "generation_config.json")
    if os.path.exists(path):
        e = json.load(open(path))["eos_token_id"]
        stop = e if isinstance(e, list) else [e]
    tokens = [tok.id_of(token_text(config, "bos_token"))] + tok.encode(prompt)  # add_bos_token
    start, stopped = len(tokens), None
    for _ in range(n):
        tokens.append(int(reference.logits(W, c, tokens)[-1].argmax()))
        if tokens[-1] in stop:
            stopped = tokens.pop()
            break
    text = printable_utf8(prompt.encode()) + "|" + printable_utf8(tok.decode(tokens[start:]))
    sys.stdout.buffer.write((text + "\n").encode("utf-8"))
    print("stopped at EOS id %d after %d tokens" % (stopped, len(tokens) - start) if stopped is not None else "no EOS")
    print(" ".join(map(str, tokens[start:])))
    print(eos)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "write" and sys.argv[3] in ("bpe", "sentencepiece"):
        write(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 5 and sys.argv[1] == "greedy":
        greedy(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)

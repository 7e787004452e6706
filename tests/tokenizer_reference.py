#!/usr/bin/env python3
"""An independent BPE for tests/test_tokenizer.cpp: trains small tokenizers,
writes them as Hugging Face tokenizer.json files, and encodes a varied
corpus with them: byte-level (GPT-2, Llama 3, Qwen2, and Qwen2 with its NFC
normalizer: unicodedata's NFC) and SentencePiece-style over characters with
byte fallback (Llama 2's normalizers, Mistral's Metaspace pre-tokenizer, a
Metaspace that splits, with its decoders).

It shares nothing with the C++ (examples/models/tokenizer/): the
pre-tokenizer patterns are scanned by hand here with unicodedata's character
classes (the C++ runs them with RE2), and BPE merges the lowest-ranked pair
one at a time, leftmost first, as Hugging Face's tokenizers does.

  tokenizer_reference.py DIR [STYLE...]   writes DIR/corpus.json and, for each style
                               (gpt2, llama3, qwen2, qwen2_nfc, llama2, mistral,
                               metaspace), DIR/STYLE/tokenizer.json and
                               DIR/STYLE/expected.json (ids, and decoded text)
"""
import json
import os
import random
import sys
import unicodedata

# Unicode's White_Space (Oniguruma's \s in tokenizers' patterns).
WHITE_SPACE = set(map(chr, [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F,
                            0x205F, 0x3000] + list(range(0x2000, 0x200B))))

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
CONTRACTIONS = ["s", "t", "re", "ve", "m", "ll", "d"]


def is_l(c):
    return unicodedata.category(c).startswith("L")


def is_n(c):
    return unicodedata.category(c).startswith("N")


def is_ws(c):
    return c in WHITE_SPACE


def is_other(c):  # [^\s\p{L}\p{N}]
    return not (is_ws(c) or is_l(c) or is_n(c))


def run(s, i, pred):
    """The end of the run of characters from i that pred accepts."""
    while i < len(s) and pred(s[i]):
        i += 1
    return i


def contraction(s, i, ignore_case):
    if s[i] != "'":
        return None
    for c in CONTRACTIONS:
        got = s[i + 1:i + 1 + len(c)]
        if got == c or (ignore_case and got.lower() == c):
            return i + 1 + len(c)
    return None


def whitespace_lookahead(s, i):
    r"""\s+(?!\S)|\s+ at i."""
    end = run(s, i, is_ws)
    if end < len(s) and end - i > 1:
        return end - 1
    return end


def gpt2_match(s, i):
    end = contraction(s, i, False)
    if end is not None:
        return end
    j = i + 1 if s[i] == " " else i
    for pred in (is_l, is_n, is_other):
        if j < len(s) and pred(s[j]):
            return run(s, j, pred)
    return whitespace_lookahead(s, i)


def llama3_match(s, i, max_digits):
    end = contraction(s, i, True)
    if end is not None:
        return end
    c = s[i]
    if is_l(c):
        return run(s, i, is_l)
    if c not in "\r\n" and not is_n(c) and i + 1 < len(s) and is_l(s[i + 1]):
        return run(s, i + 1, is_l)
    if is_n(c):
        end = i
        while end < len(s) and end - i < max_digits and is_n(s[end]):
            end += 1
        return end
    j = i + 1 if c == " " else i
    if j < len(s) and is_other(s[j]):
        return run(s, run(s, j, is_other), lambda x: x in "\r\n")
    ws_end = run(s, i, is_ws)
    newlines = [k for k in range(i, ws_end) if s[k] in "\r\n"]
    if newlines:
        return newlines[-1] + 1
    return whitespace_lookahead(s, i)


def pre_tokenize(s, style):
    words, i = [], 0
    while i < len(s):
        end = gpt2_match(s, i) if style == "gpt2" else llama3_match(s, i, 3 if style == "llama3" else 1)
        assert end > i
        words.append(s[i:end])
        i = end
    return words


def bytes_to_unicode():
    prints = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in prints:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


BYTE_CHAR = bytes_to_unicode()


def to_chars(word):
    return "".join(BYTE_CHAR[b] for b in word.encode("utf-8"))


def train(corpus, style, n_merges):
    """Vocab (the 256 byte characters in a shuffled order) and merges by pair frequency."""
    counts = {}
    for w in pre_tokenize(corpus, style):
        key = tuple(to_chars(w))
        counts[key] = counts.get(key, 0) + 1
    chars = [BYTE_CHAR[b] for b in range(256)]
    random.Random(7).shuffle(chars)
    vocab = {c: i for i, c in enumerate(chars)}
    return vocab, learn_merges(counts, vocab, n_merges)


def learn_merges(counts, vocab, n_merges):
    """Merges by pair frequency over words (tuples of symbols) and their
    counts, each merged symbol added to vocab; byte fallback tokens never merge."""
    merges = []
    words = dict(counts)
    for _ in range(n_merges):
        pairs = {}
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                if not a.startswith("<0x") and not b.startswith("<0x"):
                    pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        merged = {}
        for w, n in words.items():
            out, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and (w[k], w[k + 1]) == best:
                    out.append(w[k] + w[k + 1])
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return merges


def bpe(chars, ranks):
    symbols = list(chars)
    while True:
        best = None
        for k in range(len(symbols) - 1):
            r = ranks.get((symbols[k], symbols[k + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, k)
        if best is None:
            return symbols
        k = best[1]
        symbols[k:k + 2] = [symbols[k] + symbols[k + 1]]


class Reference:
    def __init__(self, style, vocab, merges, added, ignore_merges, bos, nfc=False):
        self.style, self.vocab, self.added, self.ignore_merges = style, vocab, added, ignore_merges
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.bos, self.nfc = bos, nfc

    def encode(self, text, add_special):
        ids = [self.added[self.bos]] if add_special and self.bos else []
        segment, i = 0, 0
        by_length = sorted(self.added, key=len, reverse=True)
        while i < len(text):
            token = next((t for t in by_length if text.startswith(t, i)), None)
            if token is None:
                i += 1
                continue
            ids += self.encode_segment(text[segment:i], segment == 0)
            ids.append(self.added[token])
            i += len(token)
            segment = i
        return ids + self.encode_segment(text[segment:], segment == 0)

    def encode_segment(self, text, at_start):
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        ids = []
        for w in pre_tokenize(text, self.style):
            chars = to_chars(w)
            if self.ignore_merges and chars in self.vocab:
                ids.append(self.vocab[chars])
                continue
            ids += [self.vocab[s] for s in bpe(chars, self.ranks)]
        return ids


    def decode(self, ids):
        byte_of = {c: b for b, c in BYTE_CHAR.items()}
        by_id = {i: t for t, i in self.vocab.items()}
        by_id.update({i: t for t, i in self.added.items()})
        return b"".join(by_id[i].encode() if by_id[i] in self.added else bytes(byte_of[c] for c in by_id[i])
                        for i in ids).decode("utf-8")


SPACE = "\u2581"  # SentencePiece's "▁"
DECODE_LLAMA2 = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"},
                 {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]
DECODE_METASPACE = [{"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always", "split": True},
                    {"type": "ByteFallback"}, {"type": "Fuse"}]


def split_before(s, mark):
    """s split before each mark (Hugging Face's MergedWithNext), no empty words."""
    words, begin = [], 0
    for k in range(1, len(s)):
        if s[k] == mark:
            words.append(s[begin:k])
            begin = k
    return [w for w in words + [s[begin:]] if w]


def metaspace_symbols(word, vocab):
    out = []
    for ch in word:
        out += [ch] if ch in vocab else ["<0x%02X>" % b for b in ch.encode("utf-8")]
    return out


def train_metaspace(corpus, n_merges):
    """A SentencePiece-like vocab: <unk>, <s>, </s>, the 256 byte tokens, the
    characters seen at least 3 times, then merges within "▁"-led words."""
    text = SPACE + corpus.replace(" ", SPACE)
    seen = {}
    for ch in text:
        seen[ch] = seen.get(ch, 0) + 1
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for ch in sorted((c for c in seen if seen[c] >= 3), key=lambda c: (-seen[c], c)):
        vocab[ch] = len(vocab)
    counts = {}
    for w in split_before(text, SPACE):
        key = tuple(metaspace_symbols(w, vocab))
        counts[key] = counts.get(key, 0) + 1
    return vocab, learn_merges(counts, vocab, n_merges)


def decode_steps(tokens, steps):
    """Hugging Face's decoders, each over the token strings the one before left."""
    for step in steps:
        kind = step["type"]
        if kind == "Replace":
            tokens = [t.replace(step["pattern"]["String"], step["content"]) for t in tokens]
        elif kind == "Metaspace":
            tokens = [t.replace(SPACE, "" if i == 0 else " ") for i, t in enumerate(tokens)]
        elif kind == "Fuse":
            tokens = ["".join(tokens)]
        elif kind == "Strip":
            out = []
            for t in tokens:
                k = 0
                while k < step["start"] and t.startswith(step["content"]):
                    t, k = t[len(step["content"]):], k + 1
                out.append(t)
            tokens = out
        elif kind == "ByteFallback":
            out, pending = [], b""
            for t in tokens + [None]:
                is_byte = t is not None and len(t) == 6 and t.startswith("<0x") and t.endswith(">")
                if is_byte:
                    pending += bytes([int(t[3:5], 16)])
                    continue
                if pending:
                    try:
                        out.append(pending.decode("utf-8"))
                    except UnicodeDecodeError:
                        out += ["\ufffd"] * len(pending)
                    pending = b""
                if t is not None:
                    out.append(t)
            tokens = out
    return "".join(tokens)


class MetaspaceReference(Reference):
    """Llama 2's tokenizer.json (normalizers Prepend "▁" and Replace " "), a
    Mistral-style one (pre-tokenizer Metaspace, prepend_scheme first, no
    split) and a Metaspace-always one that splits (with NFC): BPE over
    characters, byte fallback for the rest."""

    def __init__(self, style, vocab, merges):
        added = {"<unk>": 0, "<s>": 1, "</s>": 2}
        super().__init__(style, vocab, merges, added, False, None if style == "metaspace" else "<s>")
        self.decoders = DECODE_METASPACE if style == "metaspace" else DECODE_LLAMA2

    def encode_segment(self, text, at_start):
        if not text:
            return []
        if self.style == "llama2":
            words = [SPACE + text.replace(" ", SPACE)]
        else:
            if self.style == "metaspace":
                text = unicodedata.normalize("NFC", text)
            s = text.replace(" ", SPACE)
            if (self.style == "metaspace" or at_start) and not s.startswith(SPACE):
                s = SPACE + s
            words = split_before(s, SPACE) if self.style == "metaspace" else [s]
        ids = []
        for w in words:
            ids += [self.vocab[t] for t in bpe(metaspace_symbols(w, self.vocab), self.ranks)]
        return ids

    def decode(self, ids):
        by_id = {i: t for t, i in self.vocab.items()}
        return decode_steps([by_id[i] for i in ids], self.decoders)


def metaspace_json(style, vocab, merges):
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for t, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))]
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
             "vocab": vocab, "merges": [a + " " + b for a, b in merges]}
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    out = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "model": model,
           "normalizer": None, "pre_tokenizer": None, "post_processor": template,
           "decoder": {"type": "Sequence", "decoders": DECODE_LLAMA2}}
    if style == "llama2":
        out["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPACE}, {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]}
    elif style == "mistral":
        out["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first", "split": False}
    else:
        out["normalizer"] = {"type": "NFC"}
        out["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always", "split": True}
        out["decoder"] = {"type": "Sequence", "decoders": DECODE_METASPACE}
        out["post_processor"] = None
    return out


def tokenizer_json(style, vocab, merges, added):
    added_tokens = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": True} for t, i in added.items()]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": style == "gpt2"}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab}
    if style == "gpt2":
        pre, post = byte_level, dict(byte_level)
        model["merges"] = [a + " " + b for a, b in merges]
    else:
        pattern = LLAMA3_PATTERN if style == "llama3" else QWEN2_PATTERN
        split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
        pre = {"type": "Sequence", "pretokenizers": [split, byte_level]}
        model["merges"] = [[a, b] for a, b in merges] if style == "llama3" else [a + " " + b for a, b in merges]
        model["ignore_merges"] = style == "llama3"
        post = dict(byte_level)
        if style == "llama3":
            bos = "<|begin_of_text|>"
            template = {"type": "TemplateProcessing",
                        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                        "pair": [], "special_tokens": {bos: {"id": bos, "ids": [added[bos]], "tokens": [bos]}}}
            post = {"type": "Sequence", "processors": [dict(byte_level), template]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens, "normalizer": None,
            "pre_tokenizer": pre, "post_processor": post, "decoder": dict(byte_level), "model": model}


def training_text():
    rng = random.Random(11)
    words = ["the", "The", "tokenizer", "token", "model", "parallel", "tensor", "weights", "shard", "rank",
             "hello", "world", "don't", "it's", "we'll", "I'm", "they've", "you'd", "café", "naïve", "Übung",
             "日本語", "中文", "テキスト", "Ελληνικά", "кириллица", "😀", "🎉", "123", "4567", "3.14", "2026",
             "print(x)", "{\"a\": 1}", "x += 1;", "#include", "->", "...", "!!", "--"]
    letters = "abcdefghijklmnopqrstuvwxyzéüñøçABCDEFGHIJKLMNOPRSTαβγδκλмнопрстあいうかきくの日本中文字"
    words += ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(300)]
    seps = [" ", " ", " ", "  ", "\n", "\t", ", ", ". ", "\n\n", "   "]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(4000))


CORPUS = [
    "", " ", "  ", "\n", "Hello world", "Hello, world! How are you?", "  leading spaces", "trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nend", "multiple   spaces     between", "digits 1234567 and 3.14159, 42nd 2026",
    "don't won't I'm we'll they've she'd it's", "DON'T IT'S We'Ll", "Ünïcödé naïve café Übung",
    "日本語のテキスト、中文字符。", "emoji 😀🎉👍🏽 family 👨‍👩‍👧 end", "mixed<|endoftext|>special",
    "<|begin_of_text|>hi<|eot_id|>", "\r\n windows\r\nline\r\n", "punctuation!!! ??? ... ---", "  \n  x",
    "a\u00a0b\u3000c\u2003d", "x \t y", "Ελληνικά кириллица العربية עברית", "tab-led\t\tword", "$$$ 100% #hashtag @user",
    "ends with newline\n", "print(x)\n    return {\"a\": 1}\n", "<|endoftext|>", "<|endoftext|><|endoftext|>",
    "a<|end", "<|im_start|>user\nhi<|im_end|>\n", "१२३ ٣٤٥ ⅫⅣ", "CamelCaseWord snake_case_word", "\t\t\n \n\t x",
    "tokenizer tokenizers tokenized",
    # Decomposed accents (NFC composes them), Hangul jamo, a doubled mark,
    # and SentencePiece's own marks and specials written in the text.
    "cafe\u0301 nai\u0308ve A\u030angstro\u0308m \u00c5", "\u1100\u1161\u11a8 e\u0301\u0301 o\u0308\u0304",
    "<s>hi</s> <unk> x", " \u2581already marked \u2581\u2581 a\u2581b", "<s> after bos", "x</s>y",
]


def check_scanner(text):
    """Where the regex module (Debian's python3-regex) is installed, the hand
    scanner must split exactly as it does (the engine GPT-2's own encoder.py
    used); else the scanner stands alone."""
    try:
        import regex
    except ImportError:
        return
    for style, pattern in (("gpt2", GPT2_PATTERN), ("llama3", LLAMA3_PATTERN), ("qwen2", QWEN2_PATTERN)):
        for t in CORPUS + [text]:
            if pre_tokenize(t, style) != regex.findall(pattern, t):
                sys.exit("tokenizer_reference.py: the %s scanner and the regex module split %r apart" % (style, t[:80]))


def main():
    out, only = sys.argv[1], set(sys.argv[2:])
    text = training_text()
    check_scanner(text)
    with open(os.path.join(out, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(CORPUS, f, ensure_ascii=False)
    for style in ("gpt2", "llama3", "qwen2", "qwen2_nfc"):
        if only and style not in only:
            continue
        vocab, merges = train(text, style.replace("_nfc", ""), 300)
        names = {"gpt2": ["<|endoftext|>"], "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
                 "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}[style.replace("_nfc", "")]
        added = {}
        for k, name in enumerate(names):
            added[name] = len(vocab) + (0 if style == "gpt2" else k)  # as Hugging Face numbers them
            if style == "gpt2":
                vocab[name] = added[name]  # GPT-2 lists its one special token in the vocab too
        bos = "<|begin_of_text|>" if style == "llama3" else None
        nfc = style == "qwen2_nfc"
        ref = Reference(style.replace("_nfc", ""), vocab, merges, added, style == "llama3", bos, nfc)
        config = tokenizer_json(style.replace("_nfc", ""), vocab, merges, added)
        if nfc:
            config["normalizer"] = {"type": "NFC"}
        write_style(out, style, config, ref, max(max(vocab.values()), max(added.values())) + 1,
                    added["<|begin_of_text|>"] if style == "llama3" else -1)
    for style in ("llama2", "mistral", "metaspace"):
        if only and style not in only:
            continue
        vocab, merges = train_metaspace(text, 300)
        write_style(out, style, metaspace_json(style, vocab, merges), MetaspaceReference(style, vocab, merges),
                    len(vocab), -1 if style == "metaspace" else 1)


def write_style(out, style, config, ref, vocab_size, bos):
    os.makedirs(os.path.join(out, style), exist_ok=True)
    with open(os.path.join(out, style, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    plain = [ref.encode(t, False) for t in CORPUS]
    expected = {"plain": plain, "special": [ref.encode(t, True) for t in CORPUS], "vocab_size": vocab_size,
                "bos": bos, "decoded": [ref.decode(ids) for ids in plain]}
    with open(os.path.join(out, style, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()

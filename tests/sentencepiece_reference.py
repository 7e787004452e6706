#!/usr/bin/env python3
"""Trains small SentencePiece models with Debian's python3-sentencepiece and
encodes tokenizer_reference.py's corpus with them, for
tests/test_tokenizer_sentencepiece.cpp.

  sentencepiece_reference.py DIR   writes DIR/STYLE.model and DIR/expected.json
                                   for STYLE in bpe (Llama 2's settings:
                                   byte fallback, no normalization) and unigram
"""
import json
import os
import sys

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_reference import CORPUS, training_text  # noqa: E402


def main():
    out = sys.argv[1]
    lines = [line for line in training_text().split("\n") if line.strip()]
    expected = {}
    for style in ("bpe", "unigram"):
        prefix = os.path.join(out, style)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=prefix, model_type=style, vocab_size=400, hard_vocab_limit=False,
            byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
            remove_extra_whitespaces=False, split_digits=True, character_coverage=1.0, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
        ids = [sp.encode(t) for t in CORPUS]
        expected[style] = {"ids": ids, "decoded": [sp.decode(i) for i in ids], "vocab_size": sp.get_piece_size(),
                           "bos": sp.bos_id(), "eos": sp.eos_id()}
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()

"""Write the toy's tokenizer as a Hugging Face one, offline: the id of byte b is b, EOS `<|eos|>` is 256
(vocab 257, the model's config.json), so a text prompt means what docs/engine-contract.md's `text` says.

A byte-level BPE with no merges: the pre-tokenizer maps each byte to one printable character (GPT-2's
byte-to-unicode table, which `ByteLevel` uses), the vocabulary gives that character its byte's value,
and the decoder maps back. Run with the vLLM venv's Python (it has `tokenizers` and `transformers`):

    /work/vllm-venv/bin/python examples/vllm_toy/make_tokenizer.py examples/vllm_toy/model

It writes tokenizer.json, tokenizer_config.json and the chat template (kern's: the messages' text
contents concatenated) into the folder and checks the round trip.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS = "<|eos|>"
# kern's chat template (docs/api.md): the messages' text contents concatenated, nothing added
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
                 "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
                 "{% endif %}{% endfor %}")


def byte_chars() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the rest for 256, 257, ... in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def build() -> PreTrainedTokenizerFast:
    vocab = {c: b for b, c in byte_chars().items()}
    vocab[EOS] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def check(tok: PreTrainedTokenizerFast) -> None:
    text = "Hi \x00 héllo\n\t wörld ~\x7f"
    ids = tok(text)["input_ids"]
    assert ids == list(text.encode()), (ids, list(text.encode()))
    assert tok.decode(ids) == text and tok.eos_token_id == 256 and len(tok) == 257, (tok.decode(ids), len(tok))
    chat = [{"role": "system", "content": "a "}, {"role": "user", "content": [{"type": "text", "text": "b"}]}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == "a b"


if __name__ == "__main__":
    tok = build()
    check(tok)
    for folder in sys.argv[1:]:
        tok.save_pretrained(folder)
        cfg = Path(folder) / "tokenizer_config.json"  # a class every transformers release knows (5.x names
        # its own "TokenizersBackend"), so the vLLM lines that pin an older transformers load it too
        # and the chat template inside it too: releases before chat_template.jinja read it only there
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "tokenizer_class": "PreTrainedTokenizerFast",
                                   "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
        print(f"{folder}: tokenizer.json, tokenizer_config.json (vocab {len(tok)}, EOS {tok.eos_token_id})")

"""The built-in character-level tokenizer, written as an ordinary Hugging Face fast tokenizer.

Vocabulary: <pad>=0, <bos>=1, <eos>=2, <unk>=3, then one token per character of `CHARS`. Encoding
prepends <bos>; decoding fuses tokens with no separator, so decode(encode(s)) == s for s over CHARS.
`save_pretrained` writes tokenizer.json + tokenizer_config.json that `AutoTokenizer` loads offline.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "0123456789+-= "
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh char-level tokenizer (deterministic: the same ids on every machine)."""
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a local model directory (never downloads). A missing pad token is set
    to the eos token, which batched generation needs."""
    from transformers import AutoTokenizer  # here: it imports torch (~2 s), which the built-in tokenizer does not need

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return tok


def encode_prompt(tok: PreTrainedTokenizerBase, text: str, templated: bool) -> list[int]:
    """Token ids of a prompt. A chat-templated prompt already holds the template's special tokens
    (e.g. Llama's `<|begin_of_text|>`), so none are added again, as `apply_chat_template(tokenize=True)`
    does; a plain prompt gets the tokenizer's usual ones (e.g. a BOS)."""
    return list(tok(text, add_special_tokens=not templated).input_ids)

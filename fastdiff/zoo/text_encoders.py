"""Tiny offline tokenizers and text-encoder configs for the flow-matching transformer pipelines.

Nothing may come from the Hugging Face hub, so each tokenizer is generated in code in its family's
format, over the common prompt words of :mod:`fastdiff.zoo.tokenizer` (every listed word is one token;
anything else falls back to characters or bytes):

=============  ===========================  ==========================================================
family         tokenizer                    model
=============  ===========================  ==========================================================
T5             ``T5Tokenizer`` (Unigram)    Flux, SD3, PixArt-Sigma (``T5EncoderModel``)
Gemma2         ``GemmaTokenizer`` (BPE)     Sana (``Gemma2Model``)
Qwen2.5-VL     ``Qwen2Tokenizer`` (bytes)   Qwen-Image (``Qwen2_5_VLForConditionalGeneration``)
Qwen3          ``Qwen2Tokenizer`` + chat    Z-Image (``Qwen3Model``), Flux.2 Klein (``Qwen3ForCausalLM``)
Mistral3       ``Qwen2Tokenizer`` + chat       Flux.2 (``Mistral3ForConditionalGeneration``)
=============  ===========================  ==========================================================

Example::

    from fastdiff.zoo.text_encoders import make_t5_tokenizer
    tokenizer = make_t5_tokenizer()
    ids = tokenizer("a photo of a cat").input_ids  # [a, photo, of, a, cat, </s>]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a photo of a cat"
"""

from __future__ import annotations

import string

from tokenizers.models import BPE
from tokenizers.pre_tokenizers import ByteLevel
from transformers import (
    Gemma2Config,
    GemmaTokenizer,
    LlamaConfig,
    Mistral3Config,
    Qwen2_5_VLConfig,
    Qwen2Tokenizer,
    Qwen3Config,
    T5Config,
    T5Tokenizer,
)

from fastdiff.zoo.tokenizer import COMMON_WORDS

# Words of the prompt templates the pipelines wrap prompts in (Qwen-Image drops exactly the 34 tokens of
# its system prefix, so each of its words must be one token, as in the real Qwen vocabulary).
TEMPLATE_WORDS = """
system user assistant Describe describe detailing color shape size texture quantity text spatial
relationships objects background You AI that reasons about descriptions give structured responses
focusing object attribution actions without speculation
"""
WORDS = list(dict.fromkeys((COMMON_WORDS + TEMPLATE_WORDS).split()))
PRINTABLE = [c for c in string.printable if not c.isspace()]

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
QWEN_VL_SPECIAL = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
MISTRAL_SPECIAL = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
    "<pad>",
]

# ChatML as Qwen2.5 / Qwen3 render it (text parts only); Qwen3 adds an empty think block when asked.
QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)
# Mistral Small 3.1's layout: [SYSTEM_PROMPT]..[/SYSTEM_PROMPT][INST]..[/INST] (text parts only).
MISTRAL_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set parts = [{'type': 'text', 'text': message['content']}] -%}"
    "{%- else -%}{%- set parts = message['content'] -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[INST]' -}}{%- endif -%}"
    "{%- for part in parts -%}{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}"
    "{%- if message['role'] == 'system' -%}{{- '[/SYSTEM_PROMPT]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[/INST]' -}}{%- else -%}{{- eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
)


def bpe_vocab_and_merges(
    alphabet: list[str], words: list[str], specials: list[str] = ()
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A BPE ``(vocab, merges)``: ``specials``, then ``alphabet``, then one merge chain per word.

    As in :func:`fastdiff.zoo.tokenizer.build_vocab_and_merges`, each word is first split by the merges so
    far and its pieces are joined left to right, so every word ends as one token.

    Example::

        vocab, merges = bpe_vocab_and_merges(list("abct"), ["cat"])
        assert "cat" in vocab and ("c", "a") in merges
    """
    vocab = {token: index for index, token in enumerate(dict.fromkeys([*specials, *alphabet]))}
    merges: list[tuple[str, str]] = []
    for word in dict.fromkeys(words):
        pieces = [token.value for token in BPE(vocab=vocab, merges=merges).tokenize(word)]
        merged = pieces[0]
        for piece in pieces[1:]:
            merges.append((merged, piece))
            merged += piece
            vocab.setdefault(merged, len(vocab))
    return vocab, merges


def make_t5_tokenizer(model_max_length: int = 512, extra_words: str = "") -> T5Tokenizer:
    """A T5 (sentencepiece Unigram) tokenizer: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, words (and
    ``extra_words``, whitespace-separated, after them), characters.

    Example::

        tokenizer = make_t5_tokenizer()
        assert tokenizer("cat").input_ids == [tokenizer.convert_tokens_to_ids("▁cat"), 1]
    """
    # Unigram scores are log-probabilities: a whole word (-3) beats its characters (-10 each).
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -5.0)]
    words = list(dict.fromkeys(WORDS + extra_words.split()))
    pieces += [("▁" + word, -3.0) for word in words] + [(word, -4.0) for word in words]
    pieces += [(char, -10.0) for char in PRINTABLE if char not in {"▁"}]
    pieces = list({piece: (piece, score) for piece, score in pieces}.values())  # first score wins
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=model_max_length)


def make_gemma_tokenizer(model_max_length: int = 8192) -> GemmaTokenizer:
    """A Gemma (sentencepiece BPE with byte fallback) tokenizer; adds ``<bos>`` like Gemma 2.

    Example::

        tokenizer = make_gemma_tokenizer()
        assert tokenizer("a cat").input_ids[0] == tokenizer.bos_token_id
    """
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    alphabet = [f"<0x{byte:02X}>" for byte in range(256)] + PRINTABLE + ["▁"]
    words = [spelling for word in WORDS for spelling in (word, "▁" + word)]
    vocab, merges = bpe_vocab_and_merges(alphabet, words, specials)
    return GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        model_max_length=model_max_length,
        add_bos_token=True,
        padding_side="right",
    )


def _byte_level_vocab(specials: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE (GPT-2 / Qwen / Tekken style): 256 byte characters, ``word`` and ``Ġword``."""
    words = [spelling for word in WORDS for spelling in (word, "Ġ" + word)]
    vocab, merges = bpe_vocab_and_merges(sorted(ByteLevel.alphabet()), words)
    for special in specials:
        vocab[special] = len(vocab)
    return vocab, merges


def make_qwen_tokenizer(vision: bool = False, model_max_length: int = 32768) -> Qwen2Tokenizer:
    """A Qwen2 byte-level BPE tokenizer with ChatML special tokens and chat template (Qwen2.5-VL / Qwen3).

    ``vision`` adds Qwen2.5-VL's vision marker tokens. Padding is on the right.

    Example::

        tokenizer = make_qwen_tokenizer()
        text = tokenizer.apply_chat_template([{"role": "user", "content": "a cat"}], tokenize=False)
        assert text == "<|im_start|>user\\na cat<|im_end|>\\n"
    """
    specials = QWEN_SPECIAL + (QWEN_VL_SPECIAL if vision else [])
    vocab, merges = _byte_level_vocab(specials)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        model_max_length=model_max_length,
        chat_template=QWEN_CHAT_TEMPLATE,
        additional_special_tokens=specials[1:],
        padding_side="right",
    )
    return tokenizer


def make_mistral_tokenizer(model_max_length: int = 131072) -> Qwen2Tokenizer:
    """A byte-level BPE tokenizer (like Mistral Small 3.1's Tekken) with Mistral's chat template.

    Flux.2 ships a ``PixtralProcessor`` here, but transformers' processor needs torchvision (not installed);
    the pipeline only calls ``apply_chat_template`` for text to image, which the tokenizer provides.

    Example::

        tokenizer = make_mistral_tokenizer()
        text = tokenizer.apply_chat_template([{"role": "user", "content": "a cat"}], tokenize=False)
        assert text == "<s>[INST]a cat[/INST]"
    """
    vocab, merges = _byte_level_vocab(MISTRAL_SPECIAL)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=model_max_length,
        chat_template=MISTRAL_CHAT_TEMPLATE,
        additional_special_tokens=MISTRAL_SPECIAL[3:10],
        padding_side="left",  # as Mistral Small 3.1's processor pads (an init argument, so that it is saved)
    )
    return tokenizer


def t5_config(tokenizer: T5Tokenizer, width: int, layers: int, heads: int) -> T5Config:
    """A T5 v1.1-style (gated GELU) encoder config over ``tokenizer``'s vocabulary."""
    return T5Config(
        vocab_size=len(tokenizer),
        d_model=width,
        d_kv=width // heads,
        d_ff=2 * width,
        num_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )


def _decoder_fields(
    tokenizer,
    width: int,
    layers: int,
    heads: int,
    ffn: int,
    max_positions: int,
    chatml: bool = False,
    head_dim: bool = True,
) -> dict:
    """The fields every decoder-only text config here shares: sizes (``ffn`` x ``width`` MLP, half as many
    key/value heads), ``head_dim`` unless told not to, and token ids: the tokenizer's pad/bos/eos, or with
    ``chatml`` pad as bos and ``<|im_end|>`` as eos (Qwen)."""
    fields = dict(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=ffn * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.pad_token_id if chatml else tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>") if chatml else tokenizer.eos_token_id,
    )
    if head_dim:
        fields["head_dim"] = width // heads
    return fields


def gemma2_config(tokenizer: GemmaTokenizer, width: int, layers: int, heads: int) -> Gemma2Config:
    """A Gemma 2 config (alternating sliding-window / global attention, soft-capped logits)."""
    return Gemma2Config(**_decoder_fields(tokenizer, width, layers, heads, 4, 8192), sliding_window=256)


def qwen3_config(tokenizer: Qwen2Tokenizer, width: int, layers: int, heads: int) -> Qwen3Config:
    """A Qwen3 config (grouped-query attention with q/k norms)."""
    return Qwen3Config(**_decoder_fields(tokenizer, width, layers, heads, 3, 4096, chatml=True))


def llama_config(tokenizer: Qwen2Tokenizer, width: int, layers: int, heads: int) -> LlamaConfig:
    """A Llama config (HunyuanVideo's text encoder is a Llama-shaped decoder) over a byte-level BPE tokenizer."""
    return LlamaConfig(**_decoder_fields(tokenizer, width, layers, heads, 3, 4096, chatml=True))


def qwen2_5_vl_config(tokenizer: Qwen2Tokenizer, width: int, layers: int, heads: int) -> Qwen2_5_VLConfig:
    """A Qwen2.5-VL config: text model with multimodal RoPE and a tiny vision tower (unused for text)."""
    head_dim = width // heads
    section = [head_dim // 8, head_dim // 8, head_dim // 4]  # temporal, height, width halves of RoPE
    ids = {
        name: tokenizer.convert_tokens_to_ids(token)
        for name, token in [
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
        ]
    }
    return Qwen2_5_VLConfig(
        text_config=dict(
            **_decoder_fields(tokenizer, width, layers, heads, 3, 4096, chatml=True, head_dim=False),
            rope_parameters=dict(rope_type="default", mrope_section=section, rope_theta=1e6),
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=width),
        **ids,
    )


def mistral3_config(tokenizer: Qwen2Tokenizer, width: int, layers: int, heads: int) -> Mistral3Config:
    """A Mistral3 (Mistral text model + tiny Pixtral vision tower, unused for text) config."""
    return Mistral3Config(
        text_config=dict(
            model_type="mistral",
            **_decoder_fields(tokenizer, width, layers, heads, 3, 4096),
            sliding_window=None,
            rope_parameters=dict(rope_type="default", rope_theta=1e9),
        ),
        vision_config=dict(
            model_type="pixtral",
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            image_size=64,
            patch_size=8,
            num_channels=3,
            head_dim=8,
        ),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=1,
        vision_feature_layer=-1,
    )

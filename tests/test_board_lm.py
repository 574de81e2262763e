"""`BoardQwen2ForCausalLM`: which tokens are board cells, at which (row, col), and that decoding embeds them exactly as
a full forward does."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from vagen.bootstrap.tiny import load_tiny_text_lm
from vagen.bootstrap.tiny_text import TEXT_GAMES, board_examples, board_of, build_tiny_text, make_text_game
from vagen.models.board_lm import BoardQwen2ForCausalLM


@pytest.fixture(scope="module")
def tiny_text_base():
    """tiny_text's untrained base at the test size: a BoardQwen2ForCausalLM with the grid tokenizer."""
    return load_tiny_text_lm(build_tiny_text(size="test"))


@pytest.fixture(scope="module")
def tokenizer(tiny_text_base):
    return tiny_text_base[1]


@pytest.fixture(scope="module")
def model(tiny_text_base):
    assert type(tiny_text_base[0]) is BoardQwen2ForCausalLM
    return tiny_text_base[0]


def dialogue(tokenizer, game: str, seed: int) -> tuple[str, str]:
    observation, _ = make_text_game(game).reset(seed=seed)
    messages = [
        {"role": "user", "content": observation.text},
        {"role": "assistant", "content": board_of(observation.text)},  # a board in a response
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False), board_of(observation.text)


@pytest.mark.parametrize("game", ["sokoban_text", "frozenlake_text"])
def test_the_cells_of_a_user_board_get_their_row_and_column(tokenizer, model, game):
    text, board = dialogue(tokenizer, game, seed=3)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    rows, cols = model.model.embed_tokens.positions(ids)
    tokens = tokenizer.convert_ids_to_tokens(ids[0].tolist())
    found = {(int(r), int(c)): tokens[j] for j, (r, c) in enumerate(zip(rows[0], cols[0], strict=True)) if r}
    lines = board.split("\n")
    expected = {(r + 1, c + 1): tokenizer.convert_ids_to_tokens(tokenizer(ch)["input_ids"])[0]
                for r, line in enumerate(lines) for c, ch in enumerate(line)}  # fmt: skip
    assert found == expected  # the user's board, cell by cell; the legend's symbols and the response's board: 0
    assert int((rows[0] > 0).sum()) == sum(len(line) for line in lines)


def test_decoding_embeds_as_the_full_forward(tokenizer, model):
    """The rollout samples token by token from a cache; training scores the whole dialogue at once."""
    text, _ = dialogue(tokenizer, "sokoban_text", seed=5)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    prompt = ids.shape[1] - 12
    with torch.no_grad():
        full = model(ids).logits[0, prompt - 1 :]
        out = model(ids[:, :prompt], use_cache=True)
        steps = [out.logits[0, -1]]
        for j in range(prompt, ids.shape[1]):
            out = model(ids[:, j : j + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[0, -1])
    torch.testing.assert_close(torch.stack(steps), full, rtol=1e-4, atol=1e-5)


def test_board_positions_change_the_embedding_only_on_cells_and_survive_saving(tokenizer, model, tmp_path):
    text, _ = dialogue(tokenizer, "sokoban_text", seed=1)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    embedding = model.model.embed_tokens
    rows, _ = embedding.positions(ids)
    moved = (embedding(ids) - torch.nn.functional.embedding(ids, embedding.weight)).abs().sum(-1)[0] > 0
    assert np.array_equal(moved.numpy(), rows[0].numpy() > 0)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is BoardQwen2ForCausalLM
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()  # still tied
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


def test_vllm_refuses_a_board_model_with_the_fix(tokenizer, model, tmp_path):
    from vagen.engines.base import EngineSource
    from vagen.engines.vllm_engine import VLLMEngine

    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vLLM cannot run; use the transformers engine"):
        VLLMEngine.from_source(EngineSource(model_path=str(tmp_path)))


def test_board_reading_examples_are_one_board_and_its_think_text(tokenizer):
    """`pretrain_boards`' data: the prompt is the board alone as a user message, the target the game's think text."""
    examples = board_examples(tokenizer, boards=2)
    assert len(examples) == 2 * len(TEXT_GAMES)
    games = [(name, seed) for name in TEXT_GAMES for seed in (300_000, 300_001)]
    for (ids, prompt), (name, seed) in zip(examples, games, strict=True):
        env = make_text_game(name)
        observation, _ = env.reset(seed=seed)
        board = board_of(observation.text)
        assert tokenizer.decode(ids[:prompt]) == f"<|im_start|>user\n{board}<|im_end|>\n<|im_start|>assistant\n"
        assert tokenizer.decode(ids[prompt:]) == f"<think>{env.unwrapped.demo_reasoning()}</think><|im_end|>"


def test_later_turn_boards_are_read_with_their_own_think_text(tokenizer):
    """With `turns`, a level is played before its board is read: some boards are not the levels' first ones, and
    every think text names where the box is on its own board (a board paired with another state's text would not)."""
    first, later = board_examples(tokenizer, boards=24), board_examples(tokenizer, boards=24, turns=3)
    sokoban = [(tokenizer.decode(ids[:prompt]), tokenizer.decode(ids[prompt:])) for ids, prompt in later[:24]]
    assert sum(a != b for a, b in zip(first[:24], later[:24], strict=True)) >= 6
    for prompt, think in sokoban:
        rows = prompt.split("user\n")[1].split("<|im_end|>")[0].split("\n")
        (pr, pc), (br, bc) = [next((r, c) for r, row in enumerate(rows) for c, x in enumerate(row) if x in cells)
                              for cells in ("PS", "X")]  # fmt: skip
        vertical, horizontal = ("up", "", "down")[np.sign(br - pr) + 1], ("left", "", "right")[np.sign(bc - pc) + 1]
        direction = "-".join(filter(None, (vertical, horizontal)))
        assert think.startswith(f"<think>box is {direction} of me"), (prompt, think)

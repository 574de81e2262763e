"""`BoardQwen2ForCausalLM`: which tokens are board cells, at which (row, col), and that decoding embeds them exactly as
a full forward does."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from vagen.bootstrap.tiny import init_model, load_tiny_text_lm
from vagen.bootstrap.tiny_text import TEXT_GAMES, board_examples, board_of, build_tiny_text, make_text_game
from vagen.models.board_lm import BoardQwen2Config, BoardQwen2ForCausalLM, board_positions


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


@pytest.fixture(scope="module")
def towered(model):
    """The base with a 2-block board tower whose output layer is drawn (a new tower's starts at zero)."""
    towered = init_model(BoardQwen2ForCausalLM, BoardQwen2Config(**{**model.config.to_dict(), "board_tower_layers": 2}))
    torch.nn.init.normal_(towered.model.embed_tokens.tower.up.weight, std=0.1)
    return towered


def two_boards(tokenizer, seed: int = 5) -> torch.Tensor:
    """A dialogue of two user boards (sokoban_text, then frozenlake_text) and the start of a response, as ids [1, T]."""
    first, _ = make_text_game("sokoban_text").reset(seed=seed)
    second, _ = make_text_game("frozenlake_text").reset(seed=seed)
    messages = [
        {"role": "user", "content": first.text},
        {"role": "assistant", "content": "<think>box is up of me</think><answer>Up</answer>"},
        {"role": "user", "content": second.text},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>goal is"
    return torch.tensor([tokenizer(text)["input_ids"]])


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


def test_decoding_with_a_board_tower_matches_the_full_forward_and_padding(tokenizer, towered):
    ids = two_boards(tokenizer)
    prompt = ids.shape[1] - 4
    single = torch.tensor([tokenizer(dialogue(tokenizer, "frozenlake_text", seed=2)[0])["input_ids"]])  # one 4x4 board
    padded = torch.full((1, ids.shape[1]), tokenizer.pad_token_id)
    padded[0, : single.shape[1]] = single[0]
    with torch.no_grad():
        full = towered(ids).logits[0, prompt - 1 :]
        out = towered(ids[:, :prompt], use_cache=True)
        steps = [out.logits[0, -1]]
        for j in range(prompt, ids.shape[1]):
            out = towered(ids[:, j : j + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[0, -1])
        batched = towered(torch.cat([ids, padded])).logits  # the tower pads the 4x4 board to the 6x6 one's 36 cells
        alone = towered(single).logits[0]
    torch.testing.assert_close(torch.stack(steps), full, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(batched[1, : single.shape[1]], alone, rtol=1e-4, atol=1e-5)


def test_the_board_tower_mixes_cells_within_one_board_only(tokenizer, towered):
    """Each board is numbered on its own; a cell changed on the second board moves the tower's output on every cell of
    that board and on no cell of the first."""
    ids = two_boards(tokenizer)
    embedding = towered.model.embed_tokens
    rows, _ = embedding.positions(ids)
    _, _, boards = board_positions(ids.numpy(), embedding.is_cell, embedding.is_break, *embedding.ids)
    assert np.array_equal(np.unique(boards), [0, 1, 2]) and np.array_equal(boards[0] > 0, rows[0].numpy() > 0)
    first_board, second = torch.from_numpy(boards[0] == 1), torch.nonzero(torch.from_numpy(boards[0] == 2))[:, 0]
    assert int(first_board.sum()) == 36  # sokoban_text's 6x6 board, then frozenlake_text's
    changed = ids.clone()
    changed[0, second[len(second) // 2]] = ids[0, second[0]]  # a wall where there was something else
    assert not torch.equal(changed, ids)
    with torch.no_grad():
        delta = (embedding(changed) - embedding(ids)).abs().sum(-1)[0]
    moved = delta > 0
    assert not bool(moved[first_board].any())
    assert bool(moved[second].all())  # the whole second board sees the change, not only the changed cell
    assert not bool(moved[rows[0] == 0].any())


def test_a_new_board_tower_leaves_the_model_unchanged(tokenizer, model):
    """The tower's output layer starts at zero: a tower added to trained weights changes nothing until it learns."""
    ids = two_boards(tokenizer)
    towered = init_model(BoardQwen2ForCausalLM, BoardQwen2Config(**{**model.config.to_dict(), "board_tower_layers": 1}))
    missing = towered.load_state_dict(model.state_dict(), strict=False).missing_keys
    assert missing and all(".tower." in key for key in missing)
    with torch.no_grad():
        torch.testing.assert_close(towered(ids).logits, model(ids).logits)


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


def test_a_board_tower_survives_saving(tokenizer, towered, tmp_path):
    ids = two_boards(tokenizer)
    towered.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.board_tower_layers == 2 and loaded.model.embed_tokens.tower.up.weight.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, towered(ids).logits)


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

"""`BoardQwen2ForCausalLM`: which tokens are board cells, at which (row, col), and that decoding embeds them exactly as
a full forward does."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from vagen.bootstrap.tiny import load_tiny_text_lm
from vagen.bootstrap.tiny_text import TEXT_GAMES, board_examples, board_of, build_tiny_text, make_text_game
from vagen.models.board_lm import BoardQwen2ForCausalLM, with_neighbours


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


@pytest.mark.parametrize("game", ["sokoban_text", "frozenlake_text"])
def test_board_neighbours_are_each_cells_four_neighbours_added_at_zero(tokenizer, model, game, tmp_path):
    """`with_neighbours`: each user-board cell sees the symbols above, below, left and right of it (none past an edge),
    the model's outputs do not change until the tables train, and decoding still embeds as the full forward."""
    text, board = dialogue(tokenizer, game, seed=3)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    wide = with_neighbours(model).eval()
    with torch.no_grad():
        torch.testing.assert_close(wide(ids).logits, model(ids).logits, rtol=0, atol=0)
    rows, cols = wide.model.embed_tokens.positions(ids)
    neighbours = wide.model.embed_tokens.neighbour_symbols(ids, rows, cols)
    cells = wide.config.board_cell_ids
    grid = [[1 + cells.index(tokenizer(ch)["input_ids"][0]) for ch in line] for line in board.split("\n")]

    def at(r, c):  # 0-based; 0 past the edge
        return grid[r][c] if 0 <= r < len(grid) and 0 <= c < len(grid[r]) else 0

    found = {(int(r), int(c)): n.tolist() for r, c, n in zip(rows[0], cols[0], neighbours[0], strict=True) if r}
    expected = {(r + 1, c + 1): [at(r - 1, c), at(r + 1, c), at(r, c - 1), at(r, c + 1)]
                for r in range(len(grid)) for c in range(len(grid[r]))}  # fmt: skip
    assert found == expected
    assert not neighbours[0][rows[0] == 0].any()

    torch.manual_seed(0)
    with torch.no_grad():
        for table in wide.model.embed_tokens.neighbour:
            table.weight[1:].normal_(0, 0.5)
        changed = wide(ids).logits
    assert not torch.allclose(changed, model(ids).logits)
    prompt = ids.shape[1] - 12
    with torch.no_grad():
        out = wide(ids[:, :prompt], use_cache=True)
        steps = [out.logits[0, -1]]
        for j in range(prompt, ids.shape[1]):
            out = wide(ids[:, j : j + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[0, -1])
    torch.testing.assert_close(torch.stack(steps), changed[0, prompt - 1 :], rtol=1e-4, atol=1e-5)
    wide.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.board_neighbours
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, changed)


def test_a_board_model_with_neighbours_samples_what_the_full_dialogue_scores(model, tokenizer):
    """Over turns (each next turn prefilled from the kept keys and values), the engine's log-probs of a neighbour
    model are those of one forward over the whole dialogue, as the update scores it."""
    from vagen.engines import HFEngine, SamplingParams
    from vagen.env import make_env
    from vagen.rollout import DialogueFormatter, RolloutSpec, collect_rollouts

    wide = with_neighbours(model).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for table in wide.model.embed_tokens.neighbour:
            table.weight[1:].normal_(0, 0.5)
    spec = RolloutSpec(group_seeds=[3, 4], group_size=2, max_context_tokens=2048)
    make = lambda: make_env("vagen/FrozenLake-v0", observation="text", max_turns=3)
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    trajectories = collect_rollouts(make, HFEngine(wide, tokenizer), DialogueFormatter(tokenizer), spec, sampling)
    assert max(len(t.turns) for t in trajectories) >= 2
    for trajectory in trajectories:
        ids, mask = trajectory.token_ids_and_mask()
        with torch.no_grad():
            logprobs = torch.log_softmax(wide(torch.tensor([ids])).logits[0, :-1], -1)
        scored = [logprobs[j - 1, ids[j]].item() for j in range(1, len(ids)) if mask[j]]
        np.testing.assert_allclose(scored, trajectory.sampled_logprobs(), atol=1e-4)


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

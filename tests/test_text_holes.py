"""frozenlake_text's default `tiny_text_holes` (vagen/bootstrap/text_holes.py): the cell labels, read from each board
cell's own hidden state, the hole-row mask, the build's stamp and report, and the shipped build replaying its report;
and research/text_hole_reading.py's other choices of what the labels train."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from test_tiny_text import CONFIGS
from test_trainer import repo_module

from vagen.bootstrap.text_holes import (
    TEXT_HOLES_FOLDER,
    TextHolesRecipe,
    build_tiny_text_holes,
    cells_head,
    cells_loss,
    hole_boards,
    only_hole_rows,
    pretrain_cells,
    tiny_text_holes_stamp,
)
from vagen.bootstrap.tiny import load_tiny_text_lm
from vagen.bootstrap.tiny_text import TEXT_GAMES, build_tiny_text, make_text_game
from vagen.bootstrap.warmstart import evaluate_model, read_report
from vagen.env.policies import RELATIVE_DIRECTIONS
from vagen.models.board_lm import with_neighbours
from vagen.models.cache import read_stamp
from vagen.rollout.validation import eval_seeds


def test_cell_labels_are_each_cells_directions_and_hole_neighbours():
    _, tokenizer = load_tiny_text_lm(build_tiny_text(size="test"))
    boards = hole_boards(tokenizer, range(300_000, 300_004), np.random.default_rng(0))
    for (ids, prompt), reading, labels in boards:
        board = tokenizer.decode(ids[:prompt]).split("user\n")[1].split("<|im_end|>")[0].splitlines()
        size = len(board)
        assert labels.shape == (size * size, 2 + 4)
        holes = {(r, c) for r, row in enumerate(board) for c, cell in enumerate(row) if cell == "O"}
        for index, (r, c) in enumerate(np.ndindex(size, size)):
            beside = [(r - 1, c) in holes, (r + 1, c) in holes, (r, c - 1) in holes, (r, c + 1) in holes]
            assert labels[index, 2:].tolist() == [int(b) for b in beside]  # up, down, left, right
        player = next((r, c) for r, row in enumerate(board) for c, cell in enumerate(row) if cell in "PX√")
        assert RELATIVE_DIRECTIONS[labels[player[0] * size + player[1], 0]] == "here"  # the player, seen from itself
        assert ("holes" in reading) == any(labels[player[0] * size + player[1], 2:])


def test_cells_loss_reads_every_cell_at_its_layer_and_trains_only_the_layers_below():
    model, tokenizer = load_tiny_text_lm(build_tiny_text(size="test"))
    boards = hole_boards(tokenizer, range(300_000, 300_003), np.random.default_rng(0))
    loss = cells_loss(model, cells_head(model, boards), 1, boards, tokenizer.pad_token_id)  # one state per cell
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    layers = model.model.layers
    assert layers[0].mlp.down_proj.weight.grad.abs().sum() > 0
    assert all(param.grad is None for layer in layers[1:] for param in layer.parameters())


def pretrain_cells_changes(cells_params: str, neighbours: bool = False):
    """The parameters of the test-size tiny_text (with its neighbour tables added, if `neighbours`) that 2 steps of
    `pretrain_cells` at layer 1 change, by name, training research/text_hole_reading.py's `cell_parameters`, and the
    model and tokenizer after them."""
    script = repo_module("research/text_hole_reading.py")
    torch.set_num_threads(1)
    model, tokenizer = load_tiny_text_lm(build_tiny_text(size="test"))
    if neighbours:
        model = with_neighbours(model)
    if cells_params == "hole_rows":
        only_hole_rows(model, tokenizer)
    boards = hole_boards(tokenizer, range(300_000, 300_008), np.random.default_rng(0))
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    trained = script.cell_parameters(model, 1, cells_params)
    pretrain_cells(model, cells_head(model, boards), 1, boards, trained, 2, 1e-3, np.random.default_rng(0),
                   tokenizer.pad_token_id)  # fmt: skip
    changed = {name for name, param in model.named_parameters() if not torch.equal(param, before[name])}
    return changed, model, tokenizer


def test_pretrain_cells_trains_only_what_is_below_its_layer():
    changed, _, _ = pretrain_cells_changes("below")
    assert any(name.startswith("model.layers.0.") for name in changed)
    assert any("embed" in name for name in changed)
    assert not any(name.startswith("model.layers.1.") or name.startswith("lm_head") for name in changed)


def test_pretrain_cells_into_the_neighbour_tables_trains_only_them():
    changed, _, _ = pretrain_cells_changes("neighbours", neighbours=True)
    assert changed and all(".neighbour." in name for name in changed), changed


def hole_rows_only(model, tokenizer) -> None:
    """Every neighbour table of `model` is zero but for the hole symbol's row."""
    embedding = model.get_input_embeddings()
    hole = embedding.symbol[tokenizer.convert_tokens_to_ids("O")]
    for table in embedding.neighbour:
        nonzero = table.weight.detach().abs().sum(-1).nonzero().flatten().tolist()
        assert nonzero == [hole], nonzero


def test_pretrain_cells_into_the_hole_rows_changes_only_the_holes_row_of_each_table():
    changed, model, tokenizer = pretrain_cells_changes("hole_rows", neighbours=True)
    assert changed and all(".neighbour." in name for name in changed), changed
    hole_rows_only(model, tokenizer)


QUICK = TextHolesRecipe(boards=8, cells_steps=2, cells_layer=1, steps=2, train_episodes=4, eval_episodes=1)


def test_the_build_keeps_only_the_hole_rows_reports_both_games_and_its_stamp_forces_a_rebuild(tmp_path):
    """A quick recipe on the untrained test-size tiny_text: the saved model has neighbour tables that are zero but for
    the hole row (through the SFT steps too), the report evaluates both text games before and after, and the build is
    reused while the recipe and the base are the same, rebuilt when either changes."""
    torch.set_num_threads(1)
    base = build_tiny_text(tmp_path, size="test")
    folder = build_tiny_text_holes(tmp_path, QUICK, base)
    assert folder.parent == tmp_path and read_stamp(folder) == tiny_text_holes_stamp(QUICK, base)
    model, tokenizer = load_tiny_text_lm(folder)
    assert model.config.board_neighbours
    hole_rows_only(model, tokenizer)
    report = read_report(folder)
    assert report["recipe"] == read_stamp(folder)["recipe"] and list(report["games"]) == list(TEXT_GAMES)
    assert all({"eval_before", "eval"} <= set(block) for block in report["games"].values())
    assert {"cells", "dialogue", "reading"} <= set(report["loss"])
    built = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_text_holes(tmp_path, QUICK, base) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == built  # the same recipe and base: reused
    longer = replace(QUICK, steps=3)
    assert build_tiny_text_holes(tmp_path, longer, base) == folder and read_report(folder)["recipe"]["steps"] == 3
    other = build_tiny_text(tmp_path / "other", size="test", seed=1)
    assert tiny_text_holes_stamp(longer, other) != read_stamp(folder)  # another base: another build


@pytest.mark.slow(seconds=150)
def test_shipped_tiny_text_holes_is_the_current_recipe_and_replays_its_report(tmp_path):
    """The committed tiny_text_holes is used while its stamp is today's recipe on today's tiny_text, it is
    frozenlake_text's default, and its weights replay the report: greedy success and format-ok on the report's
    held-out seeds within 3 episodes (CPU float reductions differ with the thread count), for both games."""
    folder = build_tiny_text_holes(cache_dir=tmp_path)
    assert folder == TEXT_HOLES_FOLDER, "the tiny_text_holes recipe or tiny_text changed: rebuild it and ship it"
    assert not (tmp_path / folder.name).exists()  # nothing built
    assert (folder / "model.safetensors").stat().st_size <= 20 * 2**20
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        default = compose("train", overrides=["env=frozenlake_text"])
    assert (default.model.name, default.model.source) == ("tiny_text_holes", "tiny_text_holes")
    report = read_report(folder)
    model, tokenizer = load_tiny_text_lm(folder)
    episodes = report["recipe"]["eval_episodes"]
    for name, block in report["games"].items():
        assert block["eval"]["seeds"] == [eval_seeds(episodes)[0], eval_seeds(episodes)[-1]]
        greedy = evaluate_model(model, tokenizer, episodes, 0.0, report["recipe"]["max_new_tokens"],
                                lambda name=name: make_text_game(name), name)  # fmt: skip
        for key in ("success", "format_ok"):
            assert abs(greedy[key] - block["eval"]["greedy"][key]) <= 3 / episodes, (name, key)

"""research/text_hole_reading.py's cell labels: the vision pre-training's labels for each board cell, read from that
cell's own hidden state."""

import numpy as np
import torch
from test_trainer import repo_module

from vagen.bootstrap.tiny import load_tiny_text_lm
from vagen.bootstrap.tiny_text import build_tiny_text
from vagen.env.policies import RELATIVE_DIRECTIONS
from vagen.models.board_lm import with_neighbours


def test_cell_labels_are_each_cells_directions_and_hole_neighbours():
    script = repo_module("research/text_hole_reading.py")
    _, tokenizer = load_tiny_text_lm(build_tiny_text(size="test"))
    boards = script.reading_boards(tokenizer, range(300_000, 300_004), np.random.default_rng(0))
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
    script = repo_module("research/text_hole_reading.py")
    model, tokenizer = load_tiny_text_lm(build_tiny_text(size="test"))
    boards = script.reading_boards(tokenizer, range(300_000, 300_003), np.random.default_rng(0))
    head = torch.nn.Linear(model.config.hidden_size, boards[0][2].shape[1] * len(RELATIVE_DIRECTIONS))
    loss = script.cells_loss(model, head, 1, boards, tokenizer.pad_token_id)  # asserts one hidden state per cell
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    layers = model.model.layers
    assert layers[0].mlp.down_proj.weight.grad.abs().sum() > 0
    assert all(param.grad is None for layer in layers[1:] for param in layer.parameters())


def pretrain_cells_changes(cells_params: str, neighbours: bool = False):
    """The parameters of the test-size tiny_text (with its neighbour tables added, if `neighbours`) that 2 steps of
    `pretrain_cells` at layer 1 change, by name, and the model and tokenizer after them."""
    script = repo_module("research/text_hole_reading.py")
    torch.set_num_threads(1)
    model, tokenizer = load_tiny_text_lm(build_tiny_text(size="test"))
    if neighbours:
        model = with_neighbours(model)
    if cells_params == "hole_rows":
        script.only_hole_rows(model, tokenizer)
    boards = script.reading_boards(tokenizer, range(300_000, 300_008), np.random.default_rng(0))
    head = torch.nn.Linear(model.config.hidden_size, boards[0][2].shape[1] * len(RELATIVE_DIRECTIONS))
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    args = {"cells_lr": 1e-3, "seed": 0, "cells_steps": 2, "cells_params": cells_params}
    script.pretrain_cells(model, head, 1, boards, boards[:4], args, tokenizer.pad_token_id)
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


def test_pretrain_cells_into_the_hole_rows_changes_only_the_holes_row_of_each_table():
    changed, model, tokenizer = pretrain_cells_changes("hole_rows", neighbours=True)
    assert changed and all(".neighbour." in name for name in changed), changed
    embedding = model.get_input_embeddings()
    hole = embedding.symbol[tokenizer.convert_tokens_to_ids("O")]
    for table in embedding.neighbour:
        nonzero = table.weight.detach().abs().sum(-1).nonzero().flatten().tolist()
        assert nonzero == [hole], nonzero

"""A text policy that sees a board's cells at their 2-D positions: `BoardQwen2ForCausalLM` (the architecture of
the shipped `tiny_text` since its recipe version 2, see docs/warm_starts.md).

An image patch reaches Qwen2.5-VL's language model with its row and column (the vision tower's 2-D positions, mRoPE).
A text board reaches a plain causal LM as one line of cell tokens after another, so "the box is up-left of me" needs
the model to count tokens back to the line the player is on. Here every board cell's input embedding gets a learned
row embedding and column embedding added, so the player's token itself carries where it is.

A causal LM cannot put what lies below or to the right of a cell on that cell's token: those cells come later in the
sequence (docs/learning.md, "The text default has the same gap"). A vision tower attends both ways. With
`board_neighbours`, every board cell's embedding also gets an embedding of each of its four neighbours' symbols
(up / down / left / right, zero where there is none): the player's token carries "a hole below me" as an image patch
can. `with_neighbours` adds these tables to a trained model at zero, which leaves its outputs unchanged.

Which tokens are board cells is decided from the token ids alone (`board_positions`): a line (between newlines or
special tokens) of at least two cell tokens (`board_cell_ids`: the grid symbols, one token each with tiny_text's
tokenizer) inside a user message; consecutive such lines are one board, rows and columns count from 1, and every
other token gets 0, whose embeddings are zero. A model's own responses are never board cells, so decoding one token
at a time (which sees no line) embeds exactly as a full forward of the same dialogue does.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM


class BoardQwen2Config(Qwen2Config):
    """Qwen2's config plus what finds the board cells: their token ids, the ids that end a line, and the chat
    template's `<|im_start|>` and `user` ids (only user messages hold boards)."""

    model_type = "vagen_board_qwen2"

    def __init__(
        self,
        board_cell_ids: list[int] | None = None,
        board_break_ids: list[int] | None = None,
        im_start_id: int | None = None,
        user_id: int | None = None,
        board_max_side: int = 32,
        board_neighbours: bool = False,
        **kwargs,
    ):
        self.board_cell_ids = list(board_cell_ids or [])
        self.board_break_ids = list(board_break_ids or [])
        self.im_start_id = im_start_id
        self.user_id = user_id
        self.board_max_side = board_max_side
        self.board_neighbours = board_neighbours
        super().__init__(**kwargs)


def board_config(config: Qwen2Config, tokenizer, cell_pattern: str, max_side: int = 32) -> BoardQwen2Config:
    """`config` as a `BoardQwen2Config` whose cells are the tokens of `tokenizer` that are one `cell_pattern` match,
    and whose lines end at a newline token or any special token."""
    vocab = len(tokenizer)
    cells = [i for i in range(vocab) if re.fullmatch(cell_pattern, tokenizer.decode([i]))]
    special = [i for i, token in tokenizer.added_tokens_decoder.items() if token.special]
    breaks = sorted({*special, *(i for i in range(vocab) if tokenizer.decode([i]) == "\n")})
    return BoardQwen2Config(
        board_cell_ids=cells,
        board_break_ids=breaks,
        im_start_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        user_id=tokenizer.convert_tokens_to_ids("user"),
        board_max_side=max_side,
        **{k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")},
    )


NEIGHBOURS = ("up", "down", "left", "right")


def board_positions(
    ids: np.ndarray, is_cell: np.ndarray, is_break: np.ndarray, im_start_id: int, user_id: int, max_side: int
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of every token of `ids` [B, T]: 1-based inside a board of a user message, 0 elsewhere."""
    rows, cols = np.zeros(ids.shape, np.int64), np.zeros(ids.shape, np.int64)
    for b, sequence in enumerate(ids):
        cell = is_cell[sequence]
        in_user, start, row = False, 0, 0
        for end in np.flatnonzero(is_break[sequence]):
            width = end - start
            if in_user and 2 <= width <= max_side and row < max_side and cell[start:end].all():
                row += 1
                rows[b, start:end] = row
                cols[b, start:end] = np.arange(1, width + 1)
            else:
                row = 0
            if sequence[end] == im_start_id:
                in_user = end + 1 < len(sequence) and sequence[end + 1] == user_id
            start = end + 1
    return rows, cols


def board_neighbours(ids: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(B, T, 4): the token ids of each board cell's neighbours up / down / left / right in its board (`rows`, `cols`
    from `board_positions`; a board starts at each row 1, col 1), -1 where there is none (an edge, a shorter row, or
    not a cell)."""
    neighbours = np.full((*ids.shape, len(NEIGHBOURS)), -1, np.int64)
    for b in range(ids.shape[0]):
        at = np.flatnonzero(rows[b])
        if not len(at):
            continue
        board, r, c = np.cumsum((rows[b] == 1) & (cols[b] == 1))[at], rows[b, at], cols[b, at]
        grid = np.full((board[-1] + 1, r.max() + 2, c.max() + 2), -1, np.int64)  # one cell of margin on each side
        grid[board, r, c] = ids[b, at]
        neighbours[b, at] = np.stack([grid[board, r - 1, c], grid[board, r + 1, c], grid[board, r, c - 1],
                                      grid[board, r, c + 1]], -1)  # fmt: skip
    return neighbours


class BoardEmbedding(nn.Embedding):
    """The token embedding plus, on board cells, a row and a column embedding (index 0, off the board, is zero), and
    with `board_neighbours` an embedding of each neighbour's symbol per side (`neighbour[side]`, index 0: none)."""

    def __init__(self, config: BoardQwen2Config):
        super().__init__(config.vocab_size, config.hidden_size, config.pad_token_id)
        side = config.board_max_side
        self.row = nn.Embedding(side + 1, config.hidden_size, padding_idx=0)
        self.col = nn.Embedding(side + 1, config.hidden_size, padding_idx=0)
        self.is_cell = np.zeros(config.vocab_size, dtype=bool)
        self.is_cell[config.board_cell_ids] = True
        self.is_break = np.zeros(config.vocab_size, dtype=bool)
        self.is_break[config.board_break_ids] = True
        self.ids = (config.im_start_id, config.user_id, side)
        self.neighbour = None
        if config.board_neighbours:
            self.symbol = np.zeros(config.vocab_size + 1, dtype=np.int64)  # token id -> 1 + its symbol; [-1]: none
            self.symbol[config.board_cell_ids] = np.arange(1, len(config.board_cell_ids) + 1)
            symbols = len(config.board_cell_ids) + 1
            self.neighbour = nn.ModuleList(nn.Embedding(symbols, config.hidden_size, padding_idx=0) for _ in NEIGHBOURS)

    def positions(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, cols) of `input_ids` [B, T] (`board_positions`), on their device."""
        rows, cols = board_positions(input_ids.cpu().numpy(), self.is_cell, self.is_break, *self.ids)
        return torch.from_numpy(rows).to(input_ids.device), torch.from_numpy(cols).to(input_ids.device)

    def neighbour_symbols(self, input_ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(B, T, 4): 1 + the symbol of each board cell's neighbour up / down / left / right (`board_neighbours`), 0
        where there is none; on `input_ids`' device."""
        found = board_neighbours(input_ids.cpu().numpy(), rows.cpu().numpy(), cols.cpu().numpy())
        return torch.from_numpy(self.symbol[found]).to(input_ids.device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeddings = super().forward(input_ids)
        if input_ids.shape[-1] < 2:  # a decode step: a response token, never a board cell
            return embeddings
        rows, cols = self.positions(input_ids)
        embeddings = embeddings + self.row(rows) + self.col(cols)
        if self.neighbour is not None:
            symbols = self.neighbour_symbols(input_ids, rows, cols)
            for side, table in enumerate(self.neighbour):
                embeddings = embeddings + table(symbols[..., side])
        return embeddings


class BoardQwen2ForCausalLM(Qwen2ForCausalLM):
    """Qwen2ForCausalLM whose input embedding is a `BoardEmbedding` (tied to the output layer as before)."""

    config_class = BoardQwen2Config

    def __init__(self, config: BoardQwen2Config):
        super().__init__(config)
        self.model.embed_tokens = BoardEmbedding(config)
        self.post_init()


def with_neighbours(model: BoardQwen2ForCausalLM) -> BoardQwen2ForCausalLM:
    """`model` (a copy) with `board_neighbours` on and its neighbour tables at zero: the same outputs as `model`, and
    a cell's neighbours one linear map away for training to use."""
    given = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
    config = BoardQwen2Config(**{**given, "board_neighbours": True})
    wider = BoardQwen2ForCausalLM(config)
    missing, unexpected = wider.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(".neighbour." in key for key in missing), (missing, unexpected)
    with torch.no_grad():
        for table in wider.model.embed_tokens.neighbour:
            table.weight.zero_()
    return wider


AutoConfig.register(BoardQwen2Config.model_type, BoardQwen2Config)
AutoModelForCausalLM.register(BoardQwen2Config, BoardQwen2ForCausalLM)

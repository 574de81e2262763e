"""A text policy that sees a board's cells at their 2-D positions: `BoardQwen2ForCausalLM` (the architecture of
the shipped `tiny_text` since its recipe version 2, see docs/warm_starts.md).

An image patch reaches Qwen2.5-VL's language model with its row and column (the vision tower's 2-D positions, mRoPE).
A text board reaches a plain causal LM as one line of cell tokens after another, so "the box is up-left of me" needs
the model to count tokens back to the line the player is on. Here every board cell's input embedding gets a learned
row embedding and column embedding added, so the player's token itself carries where it is.

Which tokens are board cells is decided from the token ids alone (`board_positions`): a line (between newlines or
special tokens) of at least two cell tokens (`board_cell_ids`: the grid symbols, one token each with tiny_text's
tokenizer) inside a user message; consecutive such lines are one board, rows and columns count from 1, and every
other token gets 0, whose embeddings are zero. A model's own responses are never board cells, so decoding one token
at a time (which sees no line) embeds exactly as a full forward of the same dialogue does.

With `board_tower_layers` > 0 a board also passes through a small bidirectional transformer of its own cells (the
"board tower", the text counterpart of tiny_vl's vision tower, which lets every image patch see the whole image
before the causal LM reads it): each cell's embedding gets the tower's output added, so the box's token can carry
"wall to my left" without the LM attending back over the board. Its output layer starts at zero, so a tower added to
trained weights leaves their function unchanged until it learns.
"""

from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn.functional as F
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
        board_tower_layers: int = 0,
        board_tower_hidden: int = 64,
        board_tower_heads: int = 4,
        board_tower_intermediate: int = 256,
        **kwargs,
    ):
        self.board_tower_layers = board_tower_layers
        self.board_tower_hidden = board_tower_hidden
        self.board_tower_heads = board_tower_heads
        self.board_tower_intermediate = board_tower_intermediate
        self.board_cell_ids = list(board_cell_ids or [])
        self.board_break_ids = list(board_break_ids or [])
        self.im_start_id = im_start_id
        self.user_id = user_id
        self.board_max_side = board_max_side
        super().__init__(**kwargs)


def board_config(
    config: Qwen2Config, tokenizer, cell_pattern: str, max_side: int = 32, tower_layers: int = 0
) -> BoardQwen2Config:
    """`config` as a `BoardQwen2Config` whose cells are the tokens of `tokenizer` that are one `cell_pattern` match,
    and whose lines end at a newline token or any special token; `tower_layers` blocks of board tower (0: none)."""
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
        board_tower_layers=tower_layers,
        **{k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")},
    )


def board_positions(
    ids: np.ndarray, is_cell: np.ndarray, is_break: np.ndarray, im_start_id: int, user_id: int, max_side: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, boards) of every token of `ids` [B, T]: rows and columns 1-based inside a board of a user message,
    and the board's number in the whole batch (1, 2, ... in token order); 0 elsewhere."""
    rows, cols, boards = (np.zeros(ids.shape, np.int64) for _ in range(3))
    board = 0
    for b, sequence in enumerate(ids):
        cell = is_cell[sequence]
        in_user, start, row = False, 0, 0
        for end in np.flatnonzero(is_break[sequence]):
            width = end - start
            if in_user and 2 <= width <= max_side and row < max_side and cell[start:end].all():
                row += 1
                board += row == 1
                rows[b, start:end] = row
                cols[b, start:end] = np.arange(1, width + 1)
                boards[b, start:end] = board
            else:
                row = 0
            if sequence[end] == im_start_id:
                in_user = end + 1 < len(sequence) and sequence[end + 1] == user_id
            start = end + 1
    return rows, cols, boards


class BoardBlock(nn.Module):
    """One pre-norm transformer block whose cells attend to every cell of their board (`valid` [N, L] marks them)."""

    def __init__(self, width: int, heads: int, intermediate: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, intermediate), nn.GELU(), nn.Linear(intermediate, width))

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        n, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
        x = x + self.proj(attended.transpose(1, 2).reshape(n, length, width))
        return x + self.mlp(self.norm2(x))


class BoardTower(nn.Module):
    """The board tower: each board's cells (their own token, row and column embeddings of width `hidden`, as a vision
    tower has its own patch embedding) through `layers` bidirectional blocks, then projected to the LM's width and
    added to those cells' embeddings."""

    def __init__(self, config: BoardQwen2Config):
        super().__init__()
        width, side = config.board_tower_hidden, config.board_max_side + 1
        self.cell, self.row, self.col = (
            nn.Embedding(config.vocab_size, width),
            nn.Embedding(side, width),
            nn.Embedding(side, width),
        )
        self.blocks = nn.ModuleList(
            BoardBlock(width, config.board_tower_heads, config.board_tower_intermediate)
            for _ in range(config.board_tower_layers)
        )
        self.norm, self.up = nn.LayerNorm(width), nn.Linear(width, config.hidden_size)
        self.reset_ends()

    def reset_ends(self) -> None:
        """Unit-scale input embeddings (the blocks' layer norms then see O(1) inputs) and a zero output layer."""
        for embedding in (self.cell, self.row, self.col):
            nn.init.normal_(embedding.weight)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(
        self, input_ids: torch.Tensor, embeddings: torch.Tensor, rows: np.ndarray, cols: np.ndarray, boards: np.ndarray
    ) -> torch.Tensor:
        """`embeddings` [B, T, H] plus the tower's output on every cell of a board (`board_positions`' arrays)."""
        flat = boards.reshape(-1)
        cells = np.flatnonzero(flat)  # board numbers rise in token order, so each board's cells are consecutive here
        if not len(cells):
            return embeddings
        _, first, counts = np.unique(flat[cells], return_index=True, return_counts=True)
        offsets = np.arange(counts.max())
        valid = offsets < counts[:, None]
        index = cells[np.where(valid, first[:, None] + offsets, first[:, None])]  # [N, L], padding repeats a cell
        device, hidden = embeddings.device, embeddings.shape[-1]
        where = torch.from_numpy(index).to(device)
        x = self.cell(input_ids.reshape(-1)[where])
        x = x + self.row(torch.from_numpy(rows.reshape(-1)[index]).to(device))
        x = x + self.col(torch.from_numpy(cols.reshape(-1)[index]).to(device))
        valid = torch.from_numpy(valid).to(device)
        for block in self.blocks:
            x = block(x, valid)
        out = self.up(self.norm(x))[valid].to(embeddings.dtype)
        return embeddings.reshape(-1, hidden).index_add(0, where[valid], out).view_as(embeddings)


class BoardEmbedding(nn.Embedding):
    """The token embedding plus, on board cells, a row and a column embedding (index 0, off the board, is zero), and
    the board tower's output where the config has one."""

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
        self.tower = BoardTower(config) if config.board_tower_layers else None

    def positions(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, cols) of `input_ids` [B, T] (`board_positions`), on their device."""
        rows, cols, _ = board_positions(input_ids.cpu().numpy(), self.is_cell, self.is_break, *self.ids)
        return torch.from_numpy(rows).to(input_ids.device), torch.from_numpy(cols).to(input_ids.device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeddings = super().forward(input_ids)
        if input_ids.shape[-1] < 2:  # a decode step: a response token, never a board cell
            return embeddings
        rows, cols, boards = board_positions(input_ids.cpu().numpy(), self.is_cell, self.is_break, *self.ids)
        device = input_ids.device
        embeddings = (
            embeddings + self.row(torch.from_numpy(rows).to(device)) + self.col(torch.from_numpy(cols).to(device))
        )
        return embeddings if self.tower is None else self.tower(input_ids, embeddings, rows, cols, boards)


class BoardQwen2ForCausalLM(Qwen2ForCausalLM):
    """Qwen2ForCausalLM whose input embedding is a `BoardEmbedding` (tied to the output layer as before)."""

    config_class = BoardQwen2Config

    def __init__(self, config: BoardQwen2Config):
        super().__init__(config)
        self.model.embed_tokens = BoardEmbedding(config)
        self.post_init()
        if self.model.embed_tokens.tower is not None:
            self.model.embed_tokens.tower.reset_ends()  # post_init drew them at the LM's small scale


AutoConfig.register(BoardQwen2Config.model_type, BoardQwen2Config)
AutoModelForCausalLM.register(BoardQwen2Config, BoardQwen2ForCausalLM)

"""One folder per (model, env) cell: episode JSON files, their images, GIFs, and the settings they were made with.

    <cell>/settings.json                      what produced these episodes (checked on every re-run)
    <cell>/episodes/ep00003_seed1000000003.json
    <cell>/images/ep00003_turn1_0.png         turn 1's first image, referred to from the JSON's messages
    <cell>/images/ep00003_final_0.png         the image of the state the episode ended in (final_observation)
    <cell>/gifs/ep00003_seed1000000003.gif

An episode file is written to a temp file and renamed into place (`os.replace`), so a file that
exists is complete: that is what makes re-running a command resume it. Images are written before
their JSON, so a complete JSON never points at a missing image. A file is checked before it is
trusted (`record_problem`): one of another shape is played again. Episodes without their
settings.json are refused, never relabelled with today's settings.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from vagen.eval.episodes import RECORD_FORMAT, episode_record, record_problem
from vagen.rollout.chat import EpisodeResult

logger = logging.getLogger(__name__)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _settings_difference(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    keys = sorted(set(saved) | set(current))
    differences = []
    for key in keys:
        old, new = saved.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            differences += _settings_difference(old, new, f"{prefix}{key}.")
        elif old != new:
            differences.append(f"{prefix}{key}: {old!r} -> {new!r}")
    return differences


class CellStore:
    """The results of one model on one env, on disk."""

    def __init__(self, folder: Path, model: str, env: str) -> None:
        self.folder, self.model, self.env = Path(folder), model, env

    def _remove_temp_files(self) -> None:
        """Delete `.tmp-*` files that a killed run left behind (a finished write renames its temp file away)."""
        for temp in self.folder.glob("**/.tmp-*"):
            if temp.is_file():
                temp.unlink(missing_ok=True)

    def episode_path(self, index: int, seed: int) -> Path:
        return self.folder / "episodes" / f"ep{index:05d}_seed{seed}.json"

    def gif_path(self, index: int, seed: int) -> Path:
        return self.folder / "gifs" / f"ep{index:05d}_seed{seed}.gif"

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Record `settings` on first use; raise if episodes already here were made with other settings."""
        path = self.folder / "settings.json"
        current = json.loads(json.dumps(settings))  # the JSON view, so tuples and lists compare equal
        self._remove_temp_files()
        if path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as error:
                raise ValueError(
                    f"{path} is damaged ({error}), so it cannot tell which settings made the episodes beside it. "
                    f"Fix: evaluate under another name (name=...) or out_dir, or delete {self.folder} to start again."
                ) from None
            if not isinstance(saved, dict):
                raise ValueError(f"{path} is not a settings object; delete {self.folder} to start that cell again.")
            differences = _settings_difference(saved, current)
            if differences:
                raise ValueError(
                    f"{self.folder} holds episodes made with other settings ({'; '.join(differences)}). Mixing them "
                    "would make the summary meaningless. Fix: evaluate under another name (name=...) or out_dir, "
                    "or delete that folder to start it again."
                )
            return
        episodes = list((self.folder / "episodes").glob("*.json"))
        if episodes:
            raise ValueError(
                f"{path} is missing, but {len(episodes)} episode file(s) are beside it: nothing tells which settings "
                "made them, and recording today's would relabel them. Fix: restore it (from a copy of the results), "
                f"or evaluate under another name (name=...) or out_dir, or delete {self.folder} to start it again."
            )
        atomic_write_text(path, json.dumps(current, indent=2, sort_keys=True))

    def load(self, index: int, seed: int) -> dict[str, Any] | None:
        """The stored record of episode `index`, or None if there is none (or it is unreadable)."""
        path = self.episode_path(index, seed)
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            logger.warning("Ignoring unreadable episode file %s (%s); it will be played again.", path, error)
            return None
        expected = {"format": RECORD_FORMAT, "seed": seed, "index": index}
        if not isinstance(record, dict) or any(record.get(key) != value for key, value in expected.items()):
            logger.warning("Ignoring %s: not an episode record of this index and seed; it will be played again.", path)
            return None
        problem = record_problem(record)
        if problem is not None:
            logger.warning("Ignoring %s: %s; it will be played again.", path, problem)
            return None
        return record

    def records(self) -> list[dict[str, Any]]:
        """Every valid episode record stored here, in episode order (an unreadable file is left out, as by `load`)."""
        found = []
        for path in sorted((self.folder / "episodes").glob("ep*_seed*.json")):
            index, _, seed = path.stem.removeprefix("ep").partition("_seed")
            record = self.load(int(index), int(seed)) if index.isdigit() and seed.isdigit() else None
            if record is not None:
                found.append(record)
        return found

    def is_finished(self, index: int, seed: int, retry_failed: bool) -> bool:
        record = self.load(index, seed)
        return record is not None and (record["error"] is None or not retry_failed)

    def write(self, episode: EpisodeResult, index: int) -> dict[str, Any]:
        """Save the episode's images, then its JSON record (atomically); return the record."""

        def save(images: list[Any], name: str) -> list[str]:
            paths = []
            for image_index, image in enumerate(images):
                relative = Path("images") / f"ep{index:05d}_{name}_{image_index}.png"
                (self.folder / "images").mkdir(parents=True, exist_ok=True)
                image.save(self.folder / relative)
                paths.append(str(Path("..") / relative))  # relative to the JSON file's folder
            return paths

        image_paths = [save(turn.images, f"turn{turn_index}") for turn_index, turn in enumerate(episode.turns)]
        record = episode_record(
            episode,
            model=self.model,
            env=self.env,
            index=index,
            image_paths=image_paths,
            final_image_paths=save(episode.final_images, "final"),
        )
        text = json.dumps(record, indent=1, ensure_ascii=False)
        # Lone UTF-16 surrogates (invalid Unicode an env or server may pass on) cannot be encoded as UTF-8; inside
        # JSON strings, where alone they can be, backslashreplace writes them as the escapes that read them back.
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        self.gif_path(index, episode.seed).unlink(missing_ok=True)  # a GIF of the episode this one replaces
        atomic_write_text(self.episode_path(index, episode.seed), text)
        return record

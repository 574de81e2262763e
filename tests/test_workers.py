"""Scale-out on a real local Ray cluster: 2 CPU workers on the tiny models against the single process.

One Ray session for the module (starting Ray costs seconds). The algorithm is PPO, so every replica also holds
a critic and a KL reference, and each step adds a demonstration loss (`algorithm.sft_coef`) on the solver's labels of
the states the iteration's rollouts visited (`algorithm.sft_source=visited`: the trajectories travel to every replica).
"""

import os
import signal
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from vagen.trainer.learner import NonFiniteTraining
from vagen.trainer.run import train, trained
from vagen.trainer.starpo import StarPOTrainer

ray = pytest.importorskip("ray")
from vagen.trainer.workers import RayLearners, WorkerLost, contiguous_shares, local_ray_environment  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
RUN = [
    "env=sokoban_visual",
    "model=tiny_vl_test",
    "algorithm=ppo",
    "env.kwargs.max_turns=2",
    "trainer.groups=3",  # uneven shares: worker 0 plays groups 0-1, worker 1 group 2
    "trainer.group_size=2",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2",
    "trainer.save_every=1",
    "trainer.keep_checkpoints=5",
    "rollout.max_new_tokens=12",
    "logger.wandb_mode=disabled",
    "logger.progress=false",
    "trainer.viz_every=0",
    "trainer.eval_every=0",
    "trainer.eval_episodes=3",  # validation is called directly below, split 2 + 1 between the workers
    "diagnostics.compute_freq=1",
    "algorithm.sft_coef=0.5",  # a demonstration loss too: 3 dialogues per step, split 2 + 1 between the workers
    "algorithm.sft_batch_size=3",
    "algorithm.sft_source=visited",
]


def config(run_dir, *overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("train", overrides=[*RUN, *overrides])
    cfg.run_dir = str(run_dir)
    return cfg


@pytest.fixture(scope="module")
def ray_cluster():
    local_ray_environment()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    """The single process's 2 iterations: each iteration's trajectories, the policy after each, and the final
    validation."""
    trainer = StarPOTrainer(config(tmp_path_factory.mktemp("single")))
    trajectories, parameters = [], []
    for _ in range(2):
        trainer.train_iteration()
        trajectories.append(trainer.last_trajectories)
        parameters.append({name: p.detach().clone() for name, p in trainer.learner.model.named_parameters()})
    return trajectories, parameters, trainer.validate()


def assert_same_trajectories(mine, theirs):
    assert [(t.group_id, t.seed) for t in mine] == [(t.group_id, t.seed) for t in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert [turn.response_ids for turn in a.turns] == [turn.response_ids for turn in b.turns]
        assert [turn.reward for turn in a.turns] == [turn.reward for turn in b.turns]
        got = torch.tensor([x for turn in a.turns for x in turn.response_logprobs])
        torch.testing.assert_close(got, torch.tensor([x for turn in b.turns for x in turn.response_logprobs]))


def assert_same_parameters(mine, theirs, atol=1e-5):
    assert mine.keys() == theirs.keys()
    worst = max(float((mine[name] - theirs[name]).detach().abs().max()) for name in mine)
    assert worst <= atol, f"largest parameter difference {worst:.2e}"


def test_contiguous_shares_never_split_a_group_and_cover_all():
    assert contiguous_shares(3, 2) == [range(0, 2), range(2, 3)]
    assert contiguous_shares(8, 3) == [range(0, 3), range(3, 6), range(6, 8)]
    assert [i for share in contiguous_shares(17, 4) for i in share] == list(range(17))


def test_two_workers_play_and_train_as_one_process(ray_cluster, single_run, tmp_path):
    """Same trajectories at every iteration; parameters within 1e-5 after 2 iterations, on both replicas; the same
    held-out validation (to that tolerance)."""
    trajectories, parameters, validation = single_run
    trainer = StarPOTrainer(config(tmp_path, "trainer.workers=2"))
    assert isinstance(trainer.learner, RayLearners)
    try:
        for iteration in range(2):
            metrics = trainer.train_iteration()
            assert_same_trajectories(trainer.last_trajectories, trajectories[iteration])
        logged = {"mi/first_turn/num_prompts", "critic/explained_variance", "loss/kl", "loss/sft", "policy/update_norm"}
        assert logged <= metrics.keys()
        assert_same_parameters(trainer.learner.worker_parameters(0), parameters[1])
        assert_same_parameters(trainer.learner.worker_parameters(1), trainer.learner.worker_parameters(0), atol=0)
        # The probe's mass reads weights that agree to 1e-5 (summation order), so it agrees to about that; a
        # different sampled episode would move success by 1/episodes, far outside it.
        assert trainer.validate() == pytest.approx(validation, rel=1e-5, nan_ok=True)
    finally:
        trainer.close()


@pytest.mark.slow(seconds=50)
def test_each_worker_count_resumes_the_others_checkpoint(ray_cluster, single_run, tmp_path):
    """1 worker → checkpoint → 2 workers finish the run, and the other way round: both end where the single
    uninterrupted run ends."""
    _, parameters, _ = single_run
    for first, second in ((1, 2), (2, 1)):
        run_dir = tmp_path / f"{first}-then-{second}"
        train(config(run_dir, f"trainer.workers={first}", "trainer.iterations=1"))
        train(config(run_dir, f"trainer.workers={second}", "trainer.iterations=2"))
        final = trained(config(run_dir, "trainer.iterations=2"))
        assert final.iteration == 2
        assert_same_parameters(dict(final.learner.model.named_parameters()), parameters[1])


@pytest.mark.slow(seconds=45)
def test_a_killed_worker_names_itself_and_the_checkpoint_which_resumes(ray_cluster, single_run, tmp_path):
    _, parameters, _ = single_run
    cfg = config(tmp_path, "trainer.workers=2", "trainer.iterations=2")
    trainer = StarPOTrainer(cfg)
    try:
        trainer.train_iteration()
        checkpoint = trainer.save(keep_last=5)
        os.kill(trainer.learner.pids[1], signal.SIGKILL)
        with pytest.raises(WorkerLost, match=rf"worker 1 of 2 \(pid {trainer.learner.pids[1]}\).*{checkpoint}.*rerun"):
            trainer.train_iteration()
    finally:
        trainer.close()
    train(cfg)  # the same command again: resumes from the checkpoint and finishes
    final = trained(cfg)
    assert final.iteration == 2
    assert_same_parameters(dict(final.learner.model.named_parameters()), parameters[1])


def test_more_workers_than_groups_is_refused_before_ray_starts(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.workers=4 exceeds trainer.groups=3"):
        StarPOTrainer(config(tmp_path, "trainer.workers=4"))


def test_a_non_finite_update_in_the_workers_is_the_trainers_own_one_line_error(ray_cluster, tmp_path):
    """A checkpoint whose value model holds NaN: every worker refuses the update, and the driver raises the
    workers' own NonFiniteTraining (one line, as train.py prints it), not Ray's wrapper with a remote traceback."""
    single = StarPOTrainer(config(tmp_path))
    with torch.no_grad():
        single.learner.critic.value_head.weight.fill_(float("nan"))
    checkpoint = single.save(keep_last=5)
    trainer = StarPOTrainer(config(tmp_path, "trainer.workers=2"))
    try:
        trainer.restore(checkpoint)
        with pytest.raises(NonFiniteTraining) as raised:
            trainer.train_iteration()
    finally:
        trainer.close()
    message = str(raised.value)
    assert type(raised.value) is NonFiniteTraining and "\n" not in message
    assert (
        message.startswith("Training became non-finite at iteration 1: a loss of inf or NaN")
        and str(checkpoint) in message
    )

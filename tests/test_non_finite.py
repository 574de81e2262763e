"""A non-finite update under data parallelism: every replica raises before its optimizer steps, none is left waiting
in a collective (two gloo replicas, one of them with a diverged value model)."""

import multiprocessing
from pathlib import Path

import torch
from test_trainer import TEXT

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
RUN = [*TEXT, "algorithm=ppo", "filter.empty_policy=keep_all"]


def replica(rank: int, rendezvous: str, run_dir: str, results) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    from hydra import compose, initialize_config_dir

    from vagen.trainer.data_parallel import DataParallel
    from vagen.trainer.learner import Learner
    from vagen.trainer.starpo import StarPOTrainer

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("train", overrides=[*RUN, f"run_dir={run_dir}"])
    trainer = StarPOTrainer(cfg, Learner(cfg, DataParallel(rank, 2)))
    if rank == 0:  # only this replica's value model diverged
        with torch.no_grad():
            trainer.learner.critic.value_head.weight.fill_(float("nan"))
    before = {name: p.detach().clone() for name, p in trainer.learner.model.named_parameters()}
    try:
        trainer.train_iteration()
        outcome = "trained"
    except ValueError as error:
        outcome = type(error).__name__
    unchanged = all(torch.equal(p, before[name]) for name, p in trainer.learner.model.named_parameters())
    results.put((rank, outcome, unchanged))
    torch.distributed.destroy_process_group()


def test_every_replica_raises_before_stepping(tmp_path):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(target=replica, args=(rank, str(tmp_path / "rendezvous"), str(tmp_path / "run"), results))
        for rank in range(2)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = sorted(results.get(timeout=600) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    assert outcomes == [(0, "NonFiniteTraining", True), (1, "NonFiniteTraining", True)]

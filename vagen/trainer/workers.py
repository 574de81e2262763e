"""Scale-out on Ray: `trainer.workers=N` trains with N Ray actors, each a replica of the trainer on its own device.

What runs where
- The driver (`RayTrainer`, the `scripts/train.py` process) holds no model. It owns the loop state of
  `IterationLoop`: env seeds, the group filter, rerolls, the diagnostics and Echo Trap state, metrics, logging.
- Each worker (`TrainerWorker`, a Ray actor in one bundle of a placement group: 1 GPU each on GPUs, an equal
  share of the CPU threads on CPU) builds a full `StarPOTrainer`: policy, critic and reference where the
  algorithm has them, optimizers, its own rollout engine (hf, or vLLM on its GPU).
- Rollouts: the P groups are split into contiguous shares, a group never split. Every context is seeded by
  (run seed, iteration, group, env seed, rollout, turn) (`vagen.rollout.loop`), so the trajectories are the same
  for any N. The driver gathers them, filters over all groups, and sends the kept ones to every worker.
- Update: data parallel over torch.distributed (gloo on CPU, nccl on GPU) between the actors; see
  `vagen.trainer.data_parallel` for the split and why it is not the DDP wrapper. Replicas stay identical.
- Worker 0 computes the MI diagnostics and writes checkpoints, in the single-process format, so any N resumes
  any other N's checkpoint. Validation episodes are split like the groups.
- A worker that dies ends the run with `WorkerLost`, naming it and the last complete checkpoint.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from vagen.rollout import Trajectory
from vagen.rollout.validation import validation_metrics
from vagen.trainer.checkpoint import latest_checkpoint
from vagen.trainer.config import validate_config
from vagen.trainer.data_parallel import DataParallel
from vagen.trainer.loop import IterationLoop
from vagen.trainer.monitor import DiagnosticsMonitor
from vagen.trainer.starpo import StarPOTrainer, UpdateStats

PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)  # a collective waits this long for a slow replica before failing
PLACEMENT_TIMEOUT_S = 120.0


class WorkerLost(RuntimeError):
    """A Ray worker of the run died (its process was killed, its node lost)."""


def contiguous_shares(count: int, parts: int) -> list[range]:
    """`range(count)` cut into `parts` contiguous ranges whose sizes differ by at most one (first ones larger)."""
    base, extra = divmod(count, parts)
    shares, start = [], 0
    for part in range(parts):
        stop = start + base + (part < extra)
        shares.append(range(start, stop))
        start = stop
    return shares


class TrainerWorker:
    """One replica: a `StarPOTrainer` with rank `rank` of `world`, driven by `RayTrainer` (run as a Ray actor)."""

    def __init__(self, cfg: dict[str, Any], rank: int, world: int, threads: int) -> None:
        torch.set_num_threads(threads)
        self.cfg, self.rank, self.world = OmegaConf.create(cfg), rank, world
        self.trainer: StarPOTrainer | None = None

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port, where the other replicas find rank 0 (`torch.distributed`)."""
        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            return ray.util.get_node_ip_address(), probe.getsockname()[1]

    def start(self, address: str, port: int, backend: str) -> int:
        """Join the process group, then build the trainer; returns this process's id."""
        torch.distributed.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=self.rank,
            world_size=self.world,
            timeout=PROCESS_GROUP_TIMEOUT,
        )
        self.trainer = StarPOTrainer(self.cfg, DataParallel(self.rank, self.world))
        return os.getpid()

    def collect(self, group_seeds: list[int], first_group_id: int, iteration: int) -> list[Trajectory]:
        self.trainer.iteration = iteration  # the driver's count decides the sampling seeds
        return self.trainer.collect(group_seeds, first_group_id)

    def mi(self, monitor: DiagnosticsMonitor, trajectories: list[Trajectory], iteration: int) -> tuple:
        trainer = self.trainer
        metrics = monitor.mi(trainer.model, trainer.policy.processor, trainer.policy.tokenizer, trajectories, iteration)
        return metrics, monitor  # the monitor's state (EMAs, thresholds) travels back to the driver

    def learning_rate(self) -> float:
        return self.trainer.learning_rate()

    def train_on(self, kept: list[Trajectory], iteration: int) -> dict[str, list[torch.Tensor]]:
        self.trainer.iteration = iteration  # the driver's count decides the shuffle
        return dict(self.trainer.train_stats(kept).values)

    def finish_iteration(self) -> None:
        self.trainer.finish_iteration()

    def validation_episodes(self, start: int, stop: int) -> list[Trajectory]:
        return self.trainer.validation_episodes(range(start, stop))

    def move_probe(self) -> dict[str, float]:
        return self.trainer.move_probe()

    def save(self, state: dict[str, Any], keep_last: int) -> str:
        self.trainer.load_state(state)  # the driver's loop state goes into the checkpoint
        return str(self.trainer.save(keep_last))

    def restore(self, path: str) -> dict[str, Any]:
        return self.trainer.restore(Path(path))

    def parameters(self) -> dict[str, torch.Tensor]:
        """The policy's weights (tests compare replicas and runs)."""
        return {name: p.detach().cpu().clone() for name, p in self.trainer.model.named_parameters()}


def local_ray_environment() -> None:
    """Settings for a Ray that this process starts (call before `ray.init`; explicit environment values win)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster needs no auth token written to disk
    # Ray lowers its workers' priority by default; here they are the run's own training, which would be starved
    # by anything else using the CPU (a shared machine took 21 minutes for a 2-minute test).
    os.environ.setdefault("RAY_worker_niceness", "0")


def connect(address: str | None) -> bool:
    """Join the Ray cluster at `address` (auto: the one `ray start` runs here), or start a local one when
    `address` is null and this process has none. Returns whether this call started Ray (and must stop it)."""
    import ray

    if ray.is_initialized():
        return False
    local_ray_environment()
    if address is None:
        ray.init(include_dashboard=False, log_to_driver=True)
    else:
        ray.init(address=address, log_to_driver=True)
    return True


def worker_bundles(cfg: DictConfig) -> tuple[list[dict[str, float]], int, str]:
    """One placement bundle per worker, torch threads per worker, and the process-group backend."""
    import ray

    workers, cpus = cfg.trainer.workers, cfg.ray.cpus_per_worker
    gpus_in_cluster = ray.cluster_resources().get("GPU", 0)
    use_gpu = cfg.device == "cuda" or (cfg.device == "auto" and gpus_in_cluster > 0)
    if use_gpu:
        threads = cpus or 1
        return [{"CPU": threads, "GPU": 1}] * workers, threads, "nccl"
    threads = cpus or max(1, int(ray.cluster_resources().get("CPU", 1)) // workers)
    return [{"CPU": threads}] * workers, threads, "gloo"


class RayTrainer(IterationLoop):
    """The driver of `trainer.workers` replicas (see the module docstring); used through `vagen.trainer.run`."""

    def __init__(self, cfg: DictConfig) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        validate_config(cfg)
        super().__init__(cfg)
        self.started_ray = connect(cfg.ray.address)
        bundles, threads, backend = worker_bundles(cfg)
        self.group = placement_group(bundles, strategy="PACK")
        ready, _ = ray.wait([self.group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            self.close()
            raise ValueError(
                f"trainer.workers={cfg.trainer.workers} needs {len(bundles)} bundles of {bundles[0]} but the Ray "
                f"cluster has {ray.cluster_resources()}; lower trainer.workers or ray.cpus_per_worker, or add nodes."
            )
        actor = ray.remote(TrainerWorker)
        config = OmegaConf.to_container(cfg, resolve=True)
        self.workers = [
            actor.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=rank),
            ).remote(config, rank, len(bundles), threads)
            for rank, bundle in enumerate(bundles)
        ]
        self.pids: list[int | None] = [None] * len(self.workers)
        try:
            address, port = self._call("rendezvous", [self.workers[0].rendezvous.remote()])[0]
            self.pids = self._call("start", [w.start.remote(address, port, backend) for w in self.workers])
        except BaseException:
            self.close()  # the caller never gets this trainer to close: free the actors and bundles here
            raise

    # ---- calling the workers -------------------------------------------------------------
    def _call(self, what: str, refs: list) -> list:
        """The results of one call per worker (refs[i] from worker i, or from worker 0 alone), failing fast:
        a dead worker raises `WorkerLost` at once instead of leaving the others waiting in a collective."""
        import ray

        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as error:
                raise self._lost(refs.index(done[0]), what, error) from None
            except ray.exceptions.RayTaskError as error:  # the worker's own exception (a config check's ValueError,
                cause = getattr(error, "cause", None)  # NonFiniteTraining), without Ray's wrapper and remote traceback
                raise (cause if isinstance(cause, Exception) else error.as_instanceof_cause()) from None
        return ray.get(refs)

    def _lost(self, rank: int, what: str, error: Exception) -> WorkerLost:
        last = latest_checkpoint(self.run_dir)
        return WorkerLost(
            f"Ray worker {rank} of {len(self.workers)} (pid {self.pids[rank]}) died during {what} at iteration "
            f"{self.iteration}: {type(error).__name__}. Last complete checkpoint: {last or 'none'}; rerun the same "
            "command to resume from it."
        )

    # ---- the loop's hooks ----------------------------------------------------------------
    def collect(self, group_seeds: list[int]) -> list[Trajectory]:
        shares = contiguous_shares(len(group_seeds), len(self.workers))
        refs = [
            worker.collect.remote(group_seeds[share.start : share.stop], share.start, self.iteration)
            for worker, share in zip(self.workers, shares, strict=True)
        ]
        return [trajectory for part in self._call("rollout", refs) for trajectory in part]

    def diagnostics_hook(self, trajectories: list[Trajectory]) -> dict[str, float]:
        freq = self.cfg.diagnostics.compute_freq
        if not freq or self.iteration % freq:
            return {}
        ref = self.workers[0].mi.remote(self.monitor, trajectories, self.iteration)
        metrics, self.monitor = self._call("diagnostics", [ref])[0]
        return metrics

    def learning_rate(self) -> float:
        return self._call("update", [self.workers[0].learning_rate.remote()])[0]

    def train_on(self, kept: list[Trajectory]) -> dict[str, float]:
        import ray

        batch = ray.put(kept)  # one copy in the object store, read by every worker
        parts = self._call("update", [worker.train_on.remote(batch, self.iteration) for worker in self.workers])
        stats = UpdateStats.empty()
        for part in parts:  # every micro-batch of every replica, as one process would have averaged them
            for name, values in part.items():
                stats.values[name] += values
        return stats.means()

    def finish_iteration(self) -> None:
        self._call("update", [worker.finish_iteration.remote() for worker in self.workers])

    def validate(self) -> dict[str, float]:
        shares = contiguous_shares(self.cfg.trainer.eval_episodes, len(self.workers))
        refs = [w.validation_episodes.remote(s.start, s.stop) for w, s in zip(self.workers, shares, strict=True)]
        episodes = [trajectory for part in self._call("validation", refs) for trajectory in part]
        return validation_metrics(episodes) | self._call("validation", [self.workers[0].move_probe.remote()])[0]

    def save(self, keep_last: int) -> Path:
        return Path(self._call("checkpoint", [self.workers[0].save.remote(self.state(), keep_last)])[0])

    def restore(self, path: Path) -> dict[str, Any]:
        states = self._call("resume", [worker.restore.remote(str(path)) for worker in self.workers])
        self.load_state(states[0])
        return states[0]

    def worker_parameters(self, rank: int = 0) -> dict[str, torch.Tensor]:
        return self._call("parameters", [self.workers[rank].parameters.remote()])[0]

    def close(self) -> None:
        """Stop the workers and free their bundles (and Ray itself, if this trainer started it)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for worker in getattr(self, "workers", []):
            ray.kill(worker)
        if getattr(self, "group", None) is not None:
            remove_placement_group(self.group)
        if self.started_ray:
            ray.shutdown()

"""Scale-out on Ray: `trainer.workers=N` trains with N Ray actors, each a replica of the `Learner` on its own device.

What runs where
- The driver (the `scripts/train.py` process) holds no model. Its `StarPOTrainer` loop holds a `RayLearners`, which
  has the `Learner` API; the loop keeps its state (iteration, levels, filter, rerolls, the diagnostics and Echo Trap
  state, metrics, logging) and passes the iteration wherever a seed depends on it.
- Each worker (`LearnerWorker`, a Ray actor in one bundle of a placement group: 1 GPU each on GPUs, an equal
  share of the CPU threads on CPU) builds a full `Learner`: policy, critic and reference where the algorithm has
  them, optimizers, its own rollout engine (hf, or vLLM on its GPU).
- Rollouts: the P groups are split into contiguous shares, a group never split. Every context is seeded by
  (run seed, iteration, group, env seed, rollout, turn) (`vagen.rollout.loop`), so the trajectories are the same
  for any N. The driver gathers them, filters over all groups, and sends the kept ones to every worker.
- Update: data parallel over torch.distributed (gloo on CPU, nccl on GPU) between the actors; see
  `vagen.trainer.data_parallel` for the split and why it is not the DDP wrapper. Replicas stay identical.
- Worker 0 scores the MI diagnostics' jobs (the maths and state stay on the driver) and writes checkpoints, in the
  single-process format with the loop state the driver passes, so any N resumes any other N's checkpoint.
  Validation episodes are split like the groups.
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

from vagen.diagnostics.scoring import ScoringJob
from vagen.engines import SamplingParams
from vagen.models.registry import load_processing
from vagen.rollout import TokenBatch, Trajectory
from vagen.trainer.checkpoint import latest_checkpoint
from vagen.trainer.data_parallel import DataParallel
from vagen.trainer.learner import Learner, UpdateStats

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


class LearnerWorker:
    """One replica: a `Learner` with rank `rank` of `world` (run as a Ray actor); `call` runs one of its methods."""

    def __init__(self, cfg: dict[str, Any], rank: int, world: int, threads: int) -> None:
        torch.set_num_threads(threads)
        self.cfg, self.rank, self.world = OmegaConf.create(cfg), rank, world
        self.learner: Learner | None = None

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port, where the other replicas find rank 0 (`torch.distributed`)."""
        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            return ray.util.get_node_ip_address(), probe.getsockname()[1]

    def start(self, address: str, port: int, backend: str) -> int:
        """Join the process group, then build the learner; returns this process's id."""
        torch.distributed.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=self.rank,
            world_size=self.world,
            timeout=PROCESS_GROUP_TIMEOUT,
        )
        self.learner = Learner(self.cfg, DataParallel(self.rank, self.world))
        return os.getpid()

    def call(self, method: str, *args: Any) -> Any:
        """`self.learner.<method>(*args)`: the `Learner` API, unchanged, on this replica."""
        return getattr(self.learner, method)(*args)

    def parameters(self) -> dict[str, torch.Tensor]:
        """The policy's weights (tests compare replicas and runs)."""
        return {name: p.detach().cpu().clone() for name, p in self.learner.model.named_parameters()}


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


class RayLearners:
    """`trainer.workers` Ray replicas of a `Learner`, behind the `Learner` API (see the module docstring)."""

    def __init__(self, cfg: DictConfig) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.cfg = cfg
        model = cfg.model
        self.tokenizer, _ = load_processing(model.source, model.modality, path=model.path, size=model.size)
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
        actor = ray.remote(LearnerWorker)
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
            address, port = self._gather("rendezvous", [self.workers[0].rendezvous.remote()])[0]
            self.pids = self._gather("start", [w.start.remote(address, port, backend) for w in self.workers])
        except BaseException:
            self.close()  # the caller never gets these learners to close: free the actors and bundles here
            raise

    # ---- calling the workers -------------------------------------------------------------
    def _all(self, what: str, method: str, *args: Any) -> list:
        """`method(*args)` on every replica; their results in rank order."""
        return self._gather(what, [worker.call.remote(method, *args) for worker in self.workers])

    def _first(self, what: str, method: str, *args: Any) -> Any:
        """`method(*args)` on replica 0 alone."""
        return self._gather(what, [self.workers[0].call.remote(method, *args)])[0]

    def _gather(self, what: str, refs: list) -> list:
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
        last = latest_checkpoint(Path(self.cfg.run_dir))
        return WorkerLost(
            f"Ray worker {rank} of {len(self.workers)} (pid {self.pids[rank]}) died during {what}: "
            f"{type(error).__name__}. Last complete checkpoint: {last or 'none'}; rerun the same command to resume "
            "from it."
        )

    # ---- the Learner API -------------------------------------------------------------------
    def collect(self, group_seeds: list[int], sampling: SamplingParams) -> list[Trajectory]:
        """Each replica plays a contiguous share of the groups; group ids stay those of the whole batch."""
        shares = contiguous_shares(len(group_seeds), len(self.workers))
        refs = [
            worker.call.remote("collect", group_seeds[share.start : share.stop], sampling, share.start)
            for worker, share in zip(self.workers, shares, strict=True)
        ]
        return [trajectory for part in self._gather("rollout", refs) for trajectory in part]

    def play_held_out(self, episodes: range, greedy: bool = False) -> list[Trajectory]:
        """Each replica plays a contiguous share of the held-out episodes."""
        shares = contiguous_shares(len(episodes), len(self.workers))
        refs = [
            worker.call.remote("play_held_out", episodes[share.start : share.stop], greedy)
            for worker, share in zip(self.workers, shares, strict=True)
        ]
        return [trajectory for part in self._gather("validation", refs) for trajectory in part]

    def move_probe(self) -> dict[str, float]:
        return self._first("validation", "move_probe")

    def cross_score(self, job: ScoringJob, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._first("diagnostics", "cross_score", job, micro_batch)

    def image_probe(self, job: ScoringJob, micro_batch: int, scores: torch.Tensor) -> Any:
        return self._first("diagnostics", "image_probe", job, micro_batch, scores)

    def learning_rate(self) -> float:
        return self._first("update", "learning_rate")

    def update(self, batch: TokenBatch, iteration: int, visited: list[Trajectory] | None = None) -> UpdateStats:
        """Every replica trains on its share of the rows of the same batch (and of the demonstrations labelled from
        `visited`); their statistics merged, every micro-batch of every replica, as one process would have averaged
        them."""
        import ray

        shared = ray.put(batch)  # one copy in the object store, read by every worker
        shared_visited = None if visited is None else ray.put(visited)
        stats = UpdateStats.empty()
        for part in self._all("update", "update", shared, iteration, shared_visited):
            stats.merge(part)
        return stats

    def sync(self) -> None:
        self._all("update", "sync")

    def save(
        self, run_dir: Path, iteration: int, state: dict[str, Any], keep_last: int, fingerprint: dict[str, Any]
    ) -> Path:
        """Replica 0 writes the checkpoint (the replicas are identical), the loop's `state` beside its weights."""
        return Path(self._first("checkpoint", "save", str(run_dir), iteration, state, keep_last, fingerprint))

    def restore(self, path: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
        return self._all("resume", "restore", str(path), fingerprint)[0]

    def worker_parameters(self, rank: int = 0) -> dict[str, torch.Tensor]:
        return self._gather("parameters", [self.workers[rank].parameters.remote()])[0]

    def close(self) -> None:
        """Stop the workers and free their bundles (and Ray itself, if this group started it)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for worker in getattr(self, "workers", []):
            ray.kill(worker)
        if getattr(self, "group", None) is not None:
            remove_placement_group(self.group)
        if getattr(self, "started_ray", False):
            ray.shutdown()

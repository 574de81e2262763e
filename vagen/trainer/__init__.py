"""The StarPO trainer: the iteration's driver side in `loop`, its model side in `starpo`, a whole run (resume,
logging, checkpoints) in `run`, and scale-out over Ray workers in `workers` (data parallelism in `data_parallel`)."""

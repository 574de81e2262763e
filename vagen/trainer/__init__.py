"""The StarPO trainer: one iteration in `starpo`, a whole run (resume, logging, checkpoints) in `run`."""

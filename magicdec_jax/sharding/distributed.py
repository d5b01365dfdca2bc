"""Multi-host runs: `jax.distributed` start-up and a barrier.

Per-process datagen shards and their merge are datagen's (datagen_files.shard_path / split / merge_shards);
run.py orchestrates: initialize, datagen.run on this process's share, barrier, process 0 merges.

Design: a mesh spans the devices of one process (make_mesh uses jax.local_devices()); hosts split the
*data*. Each process takes every process_count-th input record (by position, starting at its index),
generates into its own shard `OUT.shard-IIIII-of-NNNNN` (resumable like any datagen output), then all
processes meet at a barrier (a tiny cross-process all-reduce, `multihost_utils.sync_global_devices`)
and process 0 merges the shards into OUT in input order. A record's content depends only on
(seed, id, sample), never on the batch it ran in, so the merged file holds the records one process
would have written.
"""
from __future__ import annotations

import jax


def initialize(coordinator_address: str | None, num_processes: int, process_id: int,
               local_device_ids=None) -> bool:
  """jax.distributed.initialize for num_processes > 1 (a no-op for 1); call before any computation.

  Returns whether the distributed runtime was started. Raises ValueError on inconsistent arguments.
  """
  if num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
  if num_processes == 1:
    return False
  if not coordinator_address:
    raise ValueError("num_processes > 1 needs a coordinator address (host:port of process 0)")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, local_device_ids=local_device_ids)
  return True


def barrier(name: str) -> None:
  """Wait until every process reaches `name` (no-op in a single process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)

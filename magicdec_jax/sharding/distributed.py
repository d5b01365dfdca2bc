"""Multi-host runs: `jax.distributed` start-up, per-process datagen shards, a barrier and the merge.

Design: a mesh spans the devices of one process (make_mesh uses jax.local_devices()); hosts split the
*data*. Each process takes every process_count-th input record (by position, starting at its index),
generates into its own shard `OUT.shard-IIIII-of-NNNNN` (resumable like any datagen output), then all
processes meet at a barrier (a tiny cross-process all-reduce, `multihost_utils.sync_global_devices`)
and process 0 merges the shards into OUT in input order. A record's content depends only on
(seed, id, sample), never on the batch it ran in, so the merged file holds the records one process
would have written.
"""
from __future__ import annotations

import json
import os

import jax

from magicdec_jax import datagen


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


def shard_path(output: str, index: int, count: int) -> str:
  """Where process `index` of `count` writes its part of `output`."""
  return f"{output}.shard-{index:05d}-of-{count:05d}"


def split(items: list, index: int, count: int) -> list:
  """This process's share of `items`: every count-th one, starting at `index`."""
  return items[index::count]


def _input_order(input_path: str) -> dict[str, int]:
  """json.dumps(id) -> position in the input (ids only; bad lines are skipped)."""
  order = {}
  with open(input_path, "rb") as f:
    for n, raw in enumerate(f):
      try:
        rec = json.loads(raw)
        order.setdefault(json.dumps(rec["id"]), n)
      except (ValueError, KeyError, TypeError):
        continue
  return order


def merge_shards(output: str, input_path: str, count: int) -> dict:
  """Concatenate the `count` shards of `output` into `output`, in input order then sample; returns a
  summary. Each shard is first repaired (a torn tail dropped); a missing shard is an error."""
  records, per_shard = {}, []
  for i in range(count):
    path = shard_path(output, i, count)
    if not os.path.exists(path):
      raise datagen.DatagenError(f"merge: shard {path} is missing (did process {i} finish?)")
    datagen.repair_output(path)
    n = 0
    with open(path, encoding="utf-8") as f:
      for line in f:
        rec = json.loads(line)
        records.setdefault((json.dumps(rec["id"]), int(rec["sample"])), line)
        n += 1
    per_shard.append(n)
  order = _input_order(input_path)
  keys = sorted(records, key=lambda k: (order.get(k[0], len(order)), k[0], k[1]))
  tmp = f"{output}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.writelines(records[k] for k in keys)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, output)
  config = shard_path(output, 0, count) + ".config.json"
  if os.path.exists(config):
    with open(config) as f:
      text = f.read()
    with open(output + ".config.json", "w") as f:
      f.write(text)
  summary = {"output": output, "records_total": len(keys), "shards": count, "records_per_shard": per_shard}
  with open(output + ".summary.json", "w") as f:
    f.write(json.dumps(summary, indent=1) + "\n")
  return summary

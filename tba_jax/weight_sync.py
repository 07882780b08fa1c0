"""Trainer -> searcher weight transfer, and the mailbox searchers read it from.

A publish casts the trainer's parameters (optionally to bfloat16, on the
trainer devices, so fewer bytes move) and copies them to the searcher
shardings with `jax.device_put`. The copy is dispatched asynchronously: the
trainer goes on with its next step while the bytes move, and a searcher keeps
sampling with the previous weights until it starts its next batch.

Across hosts the trainer's parameters are global arrays spanning every host.
They are first gathered to a replicated layout inside a jitted program on the
trainer mesh (every process runs it); each process then copies its local
replica onto its own searcher devices.
"""
from __future__ import annotations

import threading
from typing import Any

import jax

from tba_jax.model import Params


def _cast(params: Params, dtype: str | None) -> Params:
  if dtype is None:
    return params
  return jax.tree.map(lambda x: x.astype(dtype), params)


def _gather_and_cast(params: Params, dtype: str | None, trainer_mesh) -> Params:
  replicated = jax.sharding.NamedSharding(trainer_mesh, jax.sharding.PartitionSpec())
  out = jax.tree.map(lambda _: replicated, params)
  return jax.jit(lambda p: _cast(p, dtype), out_shardings=out)(params)


def publish(params: Params, searcher_shardings, *, dtype: str | None = None,
            trainer_mesh=None) -> Params:
  """A copy of `params` on the searcher shardings (asynchronously dispatched).

  `dtype`: cast before the copy (e.g. "bfloat16"); None keeps the trainer's.
  `trainer_mesh`: needed only when the trainer spans several processes.
  """
  if jax.process_count() > 1:
    # Every process must run this gather in the same order (it is a collective).
    full = _gather_and_cast(params, dtype, trainer_mesh)
    local = jax.tree.map(lambda x: x.addressable_shards[0].data, full)
    return jax.device_put(local, searcher_shardings)
  if dtype is not None:
    params = jax.jit(lambda p: _cast(p, dtype))(params)
  # A real copy even when the slices share devices: the trainer donates its state.
  return jax.device_put(params, searcher_shardings, may_alias=False)


class Mailbox:
  """The newest published (version, params); searchers take it between batches.

  Double buffering: the searcher holds a reference to the weights it is
  sampling with, while the mailbox holds the newer ones; the old copy is freed
  when the searcher lets go of it.
  """

  def __init__(self, version: int, params: Any):
    self._lock = threading.Lock()
    self._version, self._params = version, params

  def put(self, version: int, params: Any) -> None:
    with self._lock:
      self._version, self._params = version, params

  def get(self) -> tuple[int, Any]:
    with self._lock:
      return self._version, self._params

  @property
  def version(self) -> int:
    with self._lock:
      return self._version

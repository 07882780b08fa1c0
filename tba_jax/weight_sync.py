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

Every program here is jitted once (module level, or cached per (dtype, mesh)):
a sync compiles nothing after the first one.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

import jax
import jax.numpy as jnp

from tba_jax.model import Params


@functools.partial(jax.jit, static_argnames="dtype")
def _cast(params: Params, dtype: str) -> Params:
  return jax.tree.map(lambda x: x.astype(dtype), params)


@functools.partial(jax.jit, static_argnames="dtype")
def snapshot(params: Params, dtype: str) -> Params:
  """A copy of `params` in `dtype` on their own devices and shardings (e.g. the
  reference a reset takes from the trainer: the trainer's state is donated, so a
  real copy, never an alias)."""
  return jax.tree.map(lambda x: jnp.copy(x.astype(dtype)), params)


@functools.lru_cache(maxsize=None)
def _gather_and_cast_fn(dtype: str | None, trainer_mesh):
  replicated = jax.sharding.NamedSharding(trainer_mesh, jax.sharding.PartitionSpec())
  cast = lambda x: x if dtype is None else x.astype(dtype)
  return jax.jit(lambda p: jax.tree.map(cast, p), out_shardings=replicated)


def _gather_and_cast(params: Params, dtype: str | None, trainer_mesh) -> Params:
  return _gather_and_cast_fn(dtype, trainer_mesh)(params)


def publish(params: Params, searcher_shardings, *, dtype: str | None = None,
            trainer_mesh=None, copy: bool = True) -> Params:
  """A copy of `params` on the searcher shardings (asynchronously dispatched).

  `dtype`: cast before the copy (e.g. "bfloat16"); None keeps the trainer's.
  `trainer_mesh`: needed only when the trainer spans several processes.
  `copy=False`: where an array already sits on its searcher devices in `dtype`
  (one device shared by both roles), the searcher gets the same array. Only for
  weights that are never donated (a LoRA run's frozen base, held once).
  """
  if jax.process_count() > 1:
    # Every process must run this gather in the same order (it is a collective).
    full = _gather_and_cast(params, dtype, trainer_mesh)
    local = jax.tree.map(lambda x: x.addressable_shards[0].data, full)
    return jax.device_put(local, searcher_shardings)
  if dtype is not None and any(x.dtype != dtype for x in jax.tree.leaves(params)):
    params = _cast(params, dtype=dtype)
  # A real copy even when the slices share devices: the trainer donates its state.
  return jax.device_put(params, searcher_shardings, may_alias=False if copy else None)


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

"""Role meshes and the PartitionSpec table of each role.

Two roles, two meshes built from disjoint device subsets:
  trainer  axes ("fsdp", "tensor"): parameters and optimizer state FSDP-sharded
           over "fsdp" (and heads / mlp over "tensor" when > 1); the batch is
           split over "fsdp".
  searcher axes ("data", "tensor"): parameters replicated over "data",
           tensor-parallel over "tensor" (heads, mlp, vocab); the batch is split
           over "data".

One table maps each parameter (by its name in the parameter dict, LoRA adapters
included) to the axes of its dimensions. A dimension that its mesh axis does not divide is left
unsharded, so odd head counts (SmolLM2 has 9 heads) still work.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tba_jax.model import EncoderConfig, ModelConfig, param_shapes

# Dimension names of each parameter (stacked layers lead with L; P rows of a
# position / token-type table and C labels are never sharded). Decoders
# (model.py) and encoders (encoder.py) share the names.
_DIMS = {
    "embed": "VD",
    "pos_embed": "PD",
    "type_embed": "PD",
    "embed_norm/scale": "D",
    "embed_norm/bias": "D",
    "lm_head": "DV",
    "score": "DC",
    "score_bias": "C",
    "pooler": "DE",  # E: a second model dim (not sharded)
    "pooler_bias": "D",
    "final_norm/scale": "D",
    "final_norm/bias": "D",
    "layers/attn_norm/scale": "LD",
    "layers/attn_norm/bias": "LD",
    "layers/mlp_norm/scale": "LD",
    "layers/mlp_norm/bias": "LD",
    "layers/attn_post_norm/scale": "LD",  # Gemma's norms of the attention / MLP outputs
    "layers/mlp_post_norm/scale": "LD",
    "layers/attn/q_norm/scale": "LH",  # Qwen3's / Gemma's per-head q and k norms (H: never sharded)
    "layers/attn/k_norm/scale": "LH",
    "layers/attn/q": "LDNH",
    "layers/attn/k": "LDKH",
    "layers/attn/v": "LDKH",
    "layers/attn/o": "LNHD",
    "layers/attn/q_bias": "LNH",
    "layers/attn/k_bias": "LKH",
    "layers/attn/v_bias": "LKH",
    "layers/attn/o_bias": "LD",
    "layers/mlp/gate": "LDF",
    "layers/mlp/up": "LDF",
    "layers/mlp/down": "LFD",
    "layers/mlp/gate_bias": "LF",
    "layers/mlp/up_bias": "LF",
    "layers/mlp/down_bias": "LD",
    # LoRA adapters (lora.py): A [L, in, R], B [L, R, out], inputs / outputs flattened
    # (E: flattened heads, never sharded; R: the rank, never sharded).
    **{f"layers/attn/{x}_lora/lora_a": "LDR" for x in ("q", "k", "v", "qkv")},
    **{f"layers/attn/{x}_lora/lora_b": "LRE" for x in ("q", "k", "v", "qkv")},
    "layers/attn/o_lora/lora_a": "LER",
    "layers/attn/o_lora/lora_b": "LRD",
    **{f"layers/mlp/{x}_lora/lora_a": "LDR" for x in ("gate", "up")},
    **{f"layers/mlp/{x}_lora/lora_b": "LRF" for x in ("gate", "up")},
    "layers/mlp/down_lora/lora_a": "LFR",
    "layers/mlp/down_lora/lora_b": "LRD",
}

# Which mesh axis each named dimension goes to, per role: FSDP shards the
# first of V / D a parameter has; tensor parallelism splits heads, the mlp dim
# and (searcher) the vocab. A mesh axis shards at most one dim of a parameter.
_RULES = {
    "trainer": {"V": "fsdp", "D": "fsdp", "N": "tensor", "K": "tensor", "F": "tensor"},
    "searcher": {"N": "tensor", "K": "tensor", "F": "tensor", "V": "tensor"},
}

BATCH_AXIS = {"trainer": "fsdp", "searcher": "data"}
MESH_AXES = {"trainer": ("fsdp", "tensor"), "searcher": ("data", "tensor")}


def make_mesh(role: str, devices: Sequence[jax.Device], tensor: int = 1) -> Mesh:
  """A 2-D mesh for `role` over `devices` (batch axis x tensor axis)."""
  devices = list(devices)
  if not devices or len(devices) % tensor:
    raise ValueError(f"{role} mesh: {len(devices)} devices do not split into "
                     f"tensor={tensor} groups")
  grid = np.array(devices, dtype=object).reshape(len(devices) // tensor, tensor)
  return Mesh(grid, MESH_AXES[role])


def split_devices(devices: Sequence[jax.Device], num_trainer: int):
  """(trainer devices, searcher devices); with one device both roles share it."""
  devices = list(devices)
  if len(devices) == 1:
    return devices, devices
  if not 0 < num_trainer < len(devices):
    raise ValueError(f"num_trainer_devices={num_trainer} must leave at least one of "
                     f"the {len(devices)} devices to each role")
  return devices[:num_trainer], devices[num_trainer:]


def _path(keys) -> str:
  return "/".join(str(getattr(k, "key", k)) for k in keys)


def param_spec(role: str, name: str, shape: tuple[int, ...], mesh: Mesh) -> P:
  if name not in _DIMS:
    raise KeyError(f"no sharding rule for parameter {name!r}")
  axes = []
  for dim, size in zip(_DIMS[name], shape):
    axis = _RULES[role].get(dim)
    ok = axis and axis not in axes and mesh.shape[axis] > 1 and size % mesh.shape[axis] == 0
    axes.append(axis if ok else None)
  return P(*axes)


def param_specs(cfg: ModelConfig | EncoderConfig, role: str, mesh: Mesh):
  """PartitionSpec pytree matching the parameter dict of `cfg`."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: param_spec(role, _path(path), x.shape, mesh), param_shapes(cfg))


def param_shardings(cfg: ModelConfig | EncoderConfig, role: str, mesh: Mesh):
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(cfg, role, mesh))


def batch_sharding(role: str, mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Leading (batch) dimension over the role's batch axis, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXIS[role], *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def cache_sharding(cfg: ModelConfig, mesh: Mesh) -> NamedSharding:
  """KV cache [L,B,K,S,H] on a searcher mesh: batch over data, kv heads over tensor."""
  t = mesh.shape["tensor"]
  heads = "tensor" if cfg.num_kv_heads % t == 0 and t > 1 else None
  return NamedSharding(mesh, P(None, "data", heads))


def batch_size_multiple(role: str, mesh: Mesh) -> int:
  return mesh.shape[BATCH_AXIS[role]]

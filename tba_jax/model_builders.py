"""The devices a run uses and the model it trains on them, built from the config's `mesh`
and `model` sections: the CPU device count, the role meshes, the model path's checks, the
policy (random or a checkpoint; LoRA adapters over a frozen base), the tokenizer, and the
publisher that places each new policy on the searchers' devices.

config_builders builds the rest of a run (the task, searchers, evaluation, losses) and
re-exports these, so a caller builds every piece of a run from one module.
"""
from __future__ import annotations

import importlib.util
import math
import os

import jax

from tba_jax import attention, hf_checkpoints, host_memory, lora, sharding, weight_sync
from tba_jax import tokenizer as tokenizer_lib
from tba_jax.errors import ConfigError
from tba_jax.model import LoRAConfig, ModelConfig, init_params


def use_cpu_devices(num: int) -> None:
  """Splits the host CPU into `num` JAX devices (0: JAX's default) and keeps the memory
  malloc frees for reuse (host_memory.keep_freed_memory: a CPU run's steps no longer fault
  their temporaries in afresh); no-op on accelerators.

  JAX reads the setting when it starts its backends. Once they run, a CPU host
  that has fewer devices than asked stops here: fewer devices would silently
  change the run (one device turns async into alternation).
  """
  if not num:
    return
  host_memory.keep_freed_memory()
  try:
    jax.config.update("jax_num_cpu_devices", num)
  except RuntimeError:  # JAX's backends have started
    have = len(jax.local_devices())
    if jax.default_backend() == "cpu" and have < num:
      raise ConfigError(
          f"mesh.num_cpu_devices={num}, but JAX started with {have} CPU device(s) before "
          "the run could set it (something used JAX first), so the run would not be the one "
          f"configured{' (alternate, not async)' if have == 1 else ''}. Start the run before "
          f"anything uses JAX, call jax.config.update('jax_num_cpu_devices', {num}) right "
          f"after `import jax`, or set mesh.num_cpu_devices=0 to use the {have} there are."
      ) from None


def meshes(mesh_cfg, mode: str):
  """(trainer mesh spanning all processes, [searcher mesh per local searcher], mode)."""
  local = jax.local_devices()
  count = mesh_cfg.num_devices or len(local)
  if local[0].platform == "cpu" and mesh_cfg.num_cpu_devices:
    count = min(count, mesh_cfg.num_cpu_devices)  # JAX started with more (use_cpu_devices)
  local = local[:count]
  if len(local) == 1:
    # One device: the roles share it and take turns.
    mesh = sharding.make_mesh("trainer", local)
    return mesh, [sharding.make_mesh("searcher", local)], "alternate"
  n = mesh_cfg.num_trainer_devices
  _, searcher_local = sharding.split_devices(local, n)
  if len(searcher_local) % mesh_cfg.num_searchers:
    raise ConfigError(f"mesh.num_searchers={mesh_cfg.num_searchers}: the "
                      f"{len(searcher_local)} searcher devices do not split into that many "
                      "equal groups")
  per = len(searcher_local) // mesh_cfg.num_searchers
  searchers = [sharding.make_mesh("searcher", searcher_local[i * per:(i + 1) * per],
                                  mesh_cfg.searcher_tensor) for i in range(mesh_cfg.num_searchers)]
  # The trainer mesh takes the first n devices of every process.
  trainer = [d for p in range(jax.process_count())
             for d in [d for d in jax.devices() if d.process_index == p][:n]]
  return sharding.make_mesh("trainer", trainer, mesh_cfg.trainer_tensor), searchers, mode


def evaluation_mesh(devices: str, trainer_mesh, searcher_meshes, trainer_tensor: int):
  """Where evaluation runs (config eval.devices): searcher 0's mesh, or a searcher-role
  mesh over this process's trainer devices (each process evaluates its own problems).
  With one device both are the shared device: searcher 0's mesh."""
  local = [d for d in trainer_mesh.devices.flat if d.process_index == jax.process_index()]
  if devices == "searcher" or set(local) == set(searcher_meshes[0].devices.flat):
    return searcher_meshes[0]
  return sharding.make_mesh("searcher", local, math.gcd(trainer_tensor, len(local)))


def load_model(model_cfg, tokenizer, dtype: str, trainer_mesh, seed: int):
  """(ModelConfig, params on the trainer mesh)."""
  if model_cfg.path == "random":
    cfg = ModelConfig(**model_cfg.random.to_dict(), dtype=dtype,
                      attention_impl=model_cfg.attention_impl)
    try:
      attention.check(cfg, (model_cfg.dtype,))  # the master's and the compute dtype
    except ValueError as e:
      raise ConfigError(f"model.{e}") from None
    if cfg.vocab_size < tokenizer.vocab_size:
      raise ConfigError(f"model.random.vocab_size={cfg.vocab_size} < the tokenizer's "
                        f"{tokenizer.vocab_size} tokens")
    return cfg, init_params(cfg, seed, sharding.param_shardings(cfg, "trainer", trainer_mesh))
  cfg, params = hf_checkpoints.load(model_path(model_cfg.path), dtype, mesh=trainer_mesh,
                                    role="trainer")
  cfg = cfg.replace(attention_impl=model_cfg.attention_impl)
  try:
    attention.check(cfg, (model_cfg.dtype,))
  except ValueError as e:
    raise ConfigError(f"model.{e}") from None
  return cfg, params


def lora_config(lora_cfg, architecture: ModelConfig) -> LoRAConfig | None:
  """model.lora as a LoRAConfig for `architecture` ("all": its projections); rank 0
  (full fine-tuning) is None."""
  if lora_cfg.rank == 0:
    return None
  targets = tuple(t.strip() for t in lora_cfg.targets.split(","))
  return LoRAConfig(lora_cfg.rank, float(lora_cfg.alpha),
                    architecture.projections if targets == ("all",) else targets)


def load_policy(model_cfg, tokenizer, master_dtype: str, trainer_mesh, seed: int):
  """(ModelConfig, trained params, frozen params) on the trainer mesh.

  Full fine-tuning (model.lora.rank 0): the whole model in `master_dtype`, and {}.
  LoRA: fresh adapters in `master_dtype` and the base in model.dtype (frozen weights
  need no master copy); the targets are checked against the architecture before
  any weight is read.
  """
  if model_cfg.lora.rank == 0:
    return (*load_model(model_cfg, tokenizer, master_dtype, trainer_mesh, seed), {})
  if model_cfg.path == "random":
    architecture = ModelConfig(**model_cfg.random.to_dict())
  else:
    architecture = hf_checkpoints.read_config(model_path(model_cfg.path))
  try:
    adapters = lora_config(model_cfg.lora, architecture)
    architecture.replace(lora=adapters)
  except ValueError as e:
    raise ConfigError(f"model.lora.targets={model_cfg.lora.targets!r}: {e}") from None
  cfg, base = load_model(model_cfg, tokenizer, model_cfg.dtype, trainer_mesh, seed)
  cfg = cfg.replace(lora=adapters)
  shardings = lora.trained(cfg, sharding.param_shardings(cfg, "trainer", trainer_mesh))
  return cfg, lora.init_adapters(cfg.replace(dtype=master_dtype), seed, shardings), base


def publisher(model_config: ModelConfig, base, meshes, dtype: str, trainer_mesh):
  """`publish(trained params, i)`: the policy on searcher i's devices, in `dtype`.

  Full fine-tuning: every weight is copied. LoRA: only the adapters move; each
  searcher holds the base once, placed here (the trainer's own arrays when the
  roles share a device in the same dtype), and a published policy is that base
  combined with the new adapters.
  """
  shardings = [sharding.param_shardings(model_config, "searcher", m) for m in meshes]
  if model_config.lora is None:
    return lambda params, i: weight_sync.publish(params, shardings[i], dtype=dtype,
                                                 trainer_mesh=trainer_mesh)
  bases = [weight_sync.publish(base, lora.frozen(model_config, s), dtype=dtype,
                               trainer_mesh=trainer_mesh, copy=False) for s in shardings]
  adapter_shardings = [lora.trained(model_config, s) for s in shardings]
  return lambda adapters, i: lora.combine(bases[i], weight_sync.publish(
      adapters, adapter_shardings[i], dtype=dtype, trainer_mesh=trainer_mesh))


def model_path(path: str) -> str:
  if not path:
    raise ValueError("config.model.path is empty: give a HF directory, hub id, .gguf file, "
                     "'smollm2' or 'random'")
  return hf_checkpoints.smollm2_gguf_path() if path == "smollm2" else path


def check_model_path(model_cfg) -> None:
  """Stops with a `model.path` error when the path cannot be a model.

  Runs before the tokenizer is read: it usually comes from the same path and
  would report a wrong path in its own words first (a hub repo-id syntax
  error, a missing sentencepiece).
  """
  path = model_cfg.path
  if path == "random":
    return
  expected = ("expected a Hugging Face directory (config.json + safetensors), a .gguf file, "
              "a hub id (owner/name), 'smollm2' or 'random'")
  try:
    resolved = model_path(path)
  except FileNotFoundError as e:
    raise ConfigError(f"model.path={path!r}: {e}") from None
  if os.path.isdir(resolved):
    if not os.path.exists(os.path.join(resolved, "config.json")):
      raise ConfigError(f"model.path={path!r} is a directory without config.json; {expected}")
    if not model_cfg.tokenizer:
      _check_tokenizer_files(path, resolved)
  elif os.path.isfile(resolved):
    if not resolved.endswith(".gguf"):
      raise ConfigError(f"model.path={path!r} is a file but not a .gguf file; {expected}")
  elif path.count("/") == 1 and not path.startswith((".", "/", "~")):
    try:  # a hub id: fetched here, so that a wrong id is named as the model's
      hf_checkpoints.read_config(path)
    except (OSError, ValueError) as e:
      raise ConfigError(f"model.path={path!r}: {e}") from None
  else:
    raise ConfigError(f"model.path={path!r} does not exist; {expected}")


def _check_tokenizer_files(path: str, directory: str) -> None:
  has = lambda name: os.path.exists(os.path.join(directory, name))
  if has("tokenizer.json"):
    return
  if has("tokenizer.model") and importlib.util.find_spec("sentencepiece") is None:
    raise ConfigError(f"model.path={path!r} holds only a sentencepiece tokenizer "
                      "(tokenizer.model, no tokenizer.json): pip install sentencepiece protobuf, "
                      "or point model.tokenizer at a directory with tokenizer.json")
  if not any(has(n) for n in ("tokenizer.model", "vocab.json", "tokenizer_config.json")):
    raise ConfigError(f"model.path={path!r} has no tokenizer files; set model.tokenizer to a "
                      "directory or hub id that has them")


def load_tokenizer(model_cfg):
  return tokenizer_lib.load(model_cfg.tokenizer or model_path(model_cfg.path), model_cfg.add_bos)

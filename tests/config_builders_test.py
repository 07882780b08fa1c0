"""Pieces built from config sections: the model path check, the CPU device layout."""
import os
import subprocess
import sys

import jax
import pytest

from configs import gsm8k as gsm8k_config
from tba_jax import config_builders, loop, model_builders, sharding
from tba_jax.config_checks import ConfigError
from conftest import TEST_CACHE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model_config(path, tokenizer=""):
  c = gsm8k_config.get_config("tiny")
  c.unlock()
  c.model.update(path=path, tokenizer=tokenizer)
  return c


def test_a_wrong_model_path_is_named_once_before_the_tokenizer_reads_it(tmp_path):
  # The `cpu` / `qwen` / `rho1b` layout: the tokenizer comes from model.path.
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=r"^model.path='/no/such/model' does not exist; expected"):
    loop.run(_model_config("/no/such/model"), str(workdir))
  assert not workdir.exists()


@pytest.mark.parametrize("make,message", [
    (lambda d: d.mkdir(), "is a directory without config.json"),
    (lambda d: d.write_text("x"), "is a file but not a .gguf file"),
])
def test_a_model_path_that_is_not_a_model_is_named(tmp_path, make, message):
  path = tmp_path / "model"
  make(path)
  with pytest.raises(ConfigError, match=f"model.path='{path}' {message}"):
    config_builders.check_model_path(_model_config(str(path)).model)


def test_a_sentencepiece_only_tokenizer_asks_for_sentencepiece(tmp_path, monkeypatch):
  (tmp_path / "config.json").write_text("{}")
  (tmp_path / "tokenizer.model").write_bytes(b"\0")
  monkeypatch.setattr(model_builders.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(ConfigError, match="pip install sentencepiece protobuf"):
    config_builders.check_model_path(_model_config(str(tmp_path)).model)
  # A tokenizer from elsewhere makes the model directory's tokenizer files irrelevant.
  config_builders.check_model_path(_model_config(str(tmp_path), tokenizer="bytes").model)


def test_an_unreachable_hub_id_is_named_as_the_model_path():
  # HF_HUB_OFFLINE=1 (conftest): the hub cannot be reached.
  with pytest.raises(ConfigError, match=r"^model.path='someone/no-such-model': could not fetch"):
    config_builders.check_model_path(_model_config("someone/no-such-model").model)


def test_num_cpu_devices_limits_the_layout_when_jax_has_more(tmp_path):
  # The tests' JAX started with 8 CPU devices; the config asks for 2.
  c = gsm8k_config.get_config("tiny")
  c.unlock()
  c.mesh.num_cpu_devices = 2
  config_builders.use_cpu_devices(2)
  trainer, searchers, mode = config_builders.meshes(c.mesh, "async")
  assert (trainer.devices.size, [m.devices.size for m in searchers], mode) == (1, [1], "async")
  with pytest.raises(ConfigError, match=r"mesh.num_cpu_devices=16, but JAX started with 8 CPU"):
    config_builders.use_cpu_devices(16)


_LIBRARY_RUN = """
import sys
from configs import gsm8k
from tba_jax import loop
c = gsm8k.get_config("tiny,num_train_steps=2,export=false,eval.greedy=false,eval.num_samples=0,"
                     "mesh.num_cpu_devices=2")
if sys.argv[2] == "jax_first":
  import jax
  jax.devices()  # starts JAX's backends with one CPU device
loop.run(c, sys.argv[1])
"""


@pytest.mark.slow  # ~16 s on 2 cores (2026-12-04): out of the default suite
def test_loop_run_applies_num_cpu_devices_or_says_it_cannot(tmp_path):
  """README's library entry point with the default layout: async on 2 CPU devices."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # JAX's default: 1 device
  env.update(JAX_COMPILATION_CACHE_DIR=TEST_CACHE,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
  run = lambda workdir, mode: subprocess.run(
      [sys.executable, "-c", _LIBRARY_RUN, str(workdir), mode], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=300)
  out = run(tmp_path / "ok", "")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "devices   2 x cpu" in out.stdout and "mode      async (" in out.stdout, out.stdout
  out = run(tmp_path / "late", "jax_first")
  assert out.returncode != 0
  assert "ConfigError: mesh.num_cpu_devices=2, but JAX started with 1 CPU device(s)" in \
      out.stderr and "(alternate, not async)" in out.stderr, out.stderr[-2000:]
  assert not (tmp_path / "late").exists()


def test_evaluation_runs_on_this_processs_trainer_devices_or_searcher_zeros():
  devices = jax.devices()[:6]
  trainer = sharding.make_mesh("trainer", devices[:2], 2)
  searchers = [sharding.make_mesh("searcher", devices[i:i + 2]) for i in (2, 4)]
  on_trainer = config_builders.evaluation_mesh("trainer", trainer, searchers, 2)
  assert list(on_trainer.devices.flat) == devices[:2]
  assert dict(on_trainer.shape) == {"data": 1, "tensor": 2}  # the trainer's tensor axis
  assert config_builders.evaluation_mesh("searcher", trainer, searchers, 2) is searchers[0]
  # One device: the roles share it, and so does evaluation.
  shared = [sharding.make_mesh("searcher", devices[:1])]
  one = sharding.make_mesh("trainer", devices[:1])
  assert config_builders.evaluation_mesh("trainer", one, shared, 1) is shared[0]


def test_a_registered_task_builds_from_its_config_and_passes_the_config_check(monkeypatch):
  from configs import echo as echo_config
  from experiments import echo as echo_experiment
  from tba_jax import config_checks, tokenizer
  c = echo_config.get_config("tiny")
  with pytest.raises(ConfigError, match=r"task.name='echo': must be one of 'gsm8k', "):
    config_checks.validate(c)  # not registered: an unknown task
  for name, build in echo_experiment.TASKS.items():
    monkeypatch.setitem(config_builders.TASKS, name, build)
  config_checks.validate(c)
  task = config_builders.build_task(c.task, tokenizer.byte_tokenizer())
  assert (len(task.train), len(task.test)) == (8, 4) and task.name == "echo"
  assert [p.id for p in task.test] == [0, 1, 2, 3]
  assert task.reward("cax", "cat") == pytest.approx(2 / 3)

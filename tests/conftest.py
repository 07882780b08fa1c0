"""Test setup: 8 fake CPU devices, set BEFORE jax is imported anywhere."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402  (after the flags above)

# Repeated test runs reuse compiled programs.
jax.config.update("jax_compilation_cache_dir",
                  os.path.expanduser(os.environ.get("TBA_JAX_TEST_CACHE", "~/.cache/tba_jax_test_xla")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

import pytest  # noqa: E402

from tba_jax.model import ModelConfig  # noqa: E402

TINY_LLAMA = ModelConfig(vocab_size=128, dim=64, mlp_dim=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, norm_eps=1e-6)


@pytest.fixture
def tiny_cfg():
  return TINY_LLAMA


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_CACHE = os.path.expanduser(os.environ.get("TBA_JAX_TEST_CACHE", "~/.cache/tba_jax_test_xla"))


def tiny_command(experiment: str, workdir: str) -> list[str]:
  """README's smoke test of `experiment` (readme_test.py checks that README shows it so),
  with the tests' compilation cache."""
  import sys
  return [sys.executable, "-m", f"experiments.{experiment}", "--config",
          f"configs/{experiment}.py:tiny", "--workdir", workdir,
          f"--compilation_cache={TEST_CACHE}"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
  """`tiny_run(experiment)` -> (workdir, completed process): README's smoke test of the
  experiment, run once per test session for every test that reads it."""
  import subprocess
  done = {}

  def run(experiment):
    if experiment not in done:
      workdir = str(tmp_path_factory.mktemp(f"{experiment}_tiny") / "run")
      env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as
      env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")  # a user's; the configs ask for 2
      out = subprocess.run(tiny_command(experiment, workdir), cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
      assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
      done[experiment] = workdir, out
    return done[experiment]

  return run

r"""Time to publish weights trainer -> searchers (jax.device_put between two meshes).

  python -m benchmarks.weight_sync               # 8 fake CPU devices: 4 trainer, 1 searcher
  python -m benchmarks.weight_sync --devices=0   # the real devices (one device: a copy in place)

For 135M-shaped (SmolLM2) and 1B-shaped (RhoMath / TinyLlama) random params,
float32 and bfloat16 (a publish casts on the trainer first when asked): the
trainer FSDP-sharded over half the devices, one searcher on the next device
(how the configs lay searchers out). Prints the median over repeats and
bytes/s (bytes of the published copy / seconds).
"""
import argparse
import os
import sys


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--devices", type=int, default=8,
                      help="fake CPU devices to create (0 = use the real ones)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--models", default="135m,1b")
  args = parser.parse_args()
  if args.devices:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import time

  import jax
  import numpy as np

  from tba_jax import model, sharding, weight_sync
  from tba_jax.model import ModelConfig

  shapes = {
      "135m": ModelConfig(vocab_size=49152, dim=576, mlp_dim=1536, num_layers=30, num_heads=9,
                          num_kv_heads=3, head_dim=64, tie_embeddings=True),
      "1b": ModelConfig(vocab_size=32000, dim=2048, mlp_dim=5632, num_layers=22, num_heads=32,
                        num_kv_heads=4, head_dim=64),
  }
  devices = jax.devices()
  if len(devices) == 1:
    trainer_devices = searcher_devices = devices
  else:
    half = len(devices) // 2
    trainer_devices, searcher_devices = devices[:half], devices[half:half + 1]
  trainer = sharding.make_mesh("trainer", trainer_devices)
  searcher = sharding.make_mesh("searcher", searcher_devices)
  print(f"devices: {devices[0].platform} x{len(devices)} "
        f"(trainer {len(trainer_devices)}, searcher {len(searcher_devices)})")
  print(f"{'model':>6} {'params':>8} {'published':>10} {'MB':>8} {'median s':>9} {'GB/s':>7}")
  for name in args.models.split(","):
    cfg = shapes[name]
    params = model.init_params(cfg, 0, sharding.param_shardings(cfg, "trainer", trainer))
    dst = sharding.param_shardings(cfg, "searcher", searcher)
    for dtype in ("float32", "bfloat16"):
      cast = None if dtype == "float32" else dtype
      jax.block_until_ready(weight_sync.publish(params, dst, dtype=cast))  # compile the cast
      times = []
      for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(weight_sync.publish(params, dst, dtype=cast))
        times.append(time.perf_counter() - t0)
        del out
      nbytes = model.count_params(cfg) * (4 if dtype == "float32" else 2)
      med = float(np.median(times))
      print(f"{name:>6} {model.count_params(cfg) / 1e6:>7.0f}M {dtype:>10} {nbytes / 1e6:>8.0f} "
            f"{med:>9.3f} {nbytes / med / 1e9:>7.2f}")
    del params
  sys.stdout.flush()


if __name__ == "__main__":
  main()

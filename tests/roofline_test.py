"""The compiled cost model (benchmarks/roofline.py) and the simulated pod (benchmarks/pod.py):
layer extrapolation equals a full unrolled compile, the roofline bound, the HLO collective
counter and its replica groups, the collective time within and across nodes, the
measured-beside-predicted table."""
import math

import jax
import pytest

from benchmarks import measured_vs_predicted, pod, roofline
from tba_jax import model

SMALL = dict(prompt_len=8, new_tokens=8, rows=4, microbatches=2, sync_every=2, reward_model=False)


@pytest.mark.slow  # 6 compiles of the update: minutes on 2 loaded cores
def test_costs_from_one_and_two_layers_equal_the_full_unrolled_compile(tiny_cfg, monkeypatch):
  monkeypatch.setattr(roofline, "DECODE_BATCHES", (4,))
  with roofline.unrolled_layers():
    one = roofline.programs(tiny_cfg.replace(num_layers=1), SMALL)
    two = roofline.programs(tiny_cfg.replace(num_layers=2), SMALL)
    three = roofline.programs(tiny_cfg.replace(num_layers=3), SMALL)
  for k in ("decode4", "prefill", "scoring", "update"):
    extrapolated = one[k]["flops"] + 2 * (two[k]["flops"] - one[k]["flops"])
    # (the update: within 1%, XLA fuses the optimizer's global-norm sums differently)
    assert extrapolated == pytest.approx(three[k]["flops"], rel=1e-2), k
    assert two[k]["flops"] > one[k]["flops"] > 0, k


def test_roofline_bound_is_the_slower_of_compute_and_memory():
  chip = dict(tflops=1.0, hbm_gbps=1.0)
  assert roofline.seconds({"flops": 2e12, "bytes": 1e9}, chip) == 2.0
  assert roofline.seconds({"flops": 1e12, "bytes": 3e9}, chip) == 3.0


def test_pod_counts_collectives_and_multiplies_the_layer_loop_body():
  hlo = "\n".join([
      "%inner.2 (p: (f32[4])) -> (f32[4]) {",
      "  %ag = bf16[8,128]{1,0} all-gather(bf16[1,128]{1,0} %x), replica_groups={}",
      "}",
      "%body.1 (p: (f32[4])) -> (f32[4]) {",
      '  %w2 = (f32[4]) while((f32[4]) %t), condition=%c2, body=%inner.2, '
      'backend_config={"known_trip_count":{"n":"5"}}',
      "}",
      "ENTRY %main (a: f32[4]) -> f32[4] {",
      '  %w = (f32[4]) while((f32[4]) %t), condition=%cond.1, body=%body.1, '
      'backend_config={"known_trip_count":{"n":"2"}}',
      "  %ar = f32[256]{0} all-reduce(f32[256]{0} %y), to_apply=%add",
      "  %rs = (f32[2]{0}, f32[2]{0}) reduce-scatter-start(f32[16]{0} %z)",
      "}"])
  got = pod.collectives(hlo)  # the all-gather: 5 layers x 2 micro-batches
  assert got == {"all-gather": (10, 10 * 8 * 128 * 2), "all-reduce": (1, 1024),
                 "reduce-scatter": (1, 16)}


def test_pod_reads_replica_groups_in_each_hlo_form():
  assert pod.replica_groups("x, replica_groups={{0,2},{1,3}}, to_apply=%add") == [[0, 2], [1, 3]]
  assert pod.replica_groups("x, replica_groups=[2,2]<=[4], dimensions={0}") == [[0, 1], [2, 3]]
  assert pod.replica_groups("x, replica_groups=[2,2]<=[2,2]T(1,0), d") == [[0, 2], [1, 3]]
  assert pod.replica_groups("x, replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}, d") == [
      [0, 2], [1, 3]]
  assert pod.replica_groups("x, replica_groups=mesh['axis_0'=2,'axis_1'=2], "
                            "device_ids=([2,2]T(1,0)) {'axis_1'}, d") == [[0, 2], [1, 3]]
  assert pod.replica_groups("x, source_target_pairs={{0,1},{1,0}}, d") == [[0, 1], [1, 0]]
  assert pod.replica_groups("x, replica_groups={}, to_apply=%add") is None  # every device


def test_pod_collective_time_within_a_node_and_across_nodes():
  # 2 chips to a node, 1 GB/s between them, 0.25 GB/s from a chip to another node.
  gpu = dict(link_gbps=1.0, node_chips=2, net_gbps=0.25)
  op = lambda kind, groups: [dict(kind=kind, count=1, bytes=1e9, groups=groups)]
  assert pod.collective_seconds(op("all-reduce", [[0, 1], [2, 3]]), gpu, 4) == pytest.approx(1.0)
  # all 4 devices: 2 nodes, 2 of the group in each, so 2 NICs at once: 0.5 GB/s
  assert pod.collective_seconds(op("all-gather", None), gpu, 4) == pytest.approx(0.75 / 0.5)
  assert pod.collective_seconds(op("all-reduce", None), gpu, 4) == pytest.approx(1.5 / 0.5)
  # one of the group in each node: one NIC
  assert pod.collective_seconds(op("all-gather", [[0, 2], [1, 3]]), gpu, 4) == pytest.approx(2.0)
  assert pod.collective_seconds(op("collective-permute", [[0, 1], [1, 0]]), gpu, 4) == 1.0
  assert pod.collective_seconds(op("collective-permute", [[0, 2], [2, 0]]), gpu, 4) == 4.0
  # a TPU slice: no network modelled past it
  tpu = dict(link_gbps=1.0, node_chips=2, net_gbps=None)
  assert math.isnan(pod.collective_seconds(op("all-reduce", None), tpu, 4))
  assert pod.collective_seconds(op("all-reduce", None), tpu, 2) == pytest.approx(1.0)


def test_measured_beside_predicted_rows():
  # 4.8 GB/s and 989 TFLOP/s: decode 64 takes 1 s per step, decode 256 2 s, the update 1 s.
  costs = {"decode64": {"flops": 0, "bytes": 4.8e9}, "decode256": {"flops": 0, "bytes": 9.6e9},
           "update": {"flops": 989e12, "bytes": 0}}
  predicted = {"costs": costs, "recipe": dict(roofline.ACCELERATOR)}
  measured = {"sampler_b64": {"tokens_per_s": 32.0}, "sampler_b256": {"tokens_per_s": 64.0},
              "trainer": {"tokens_per_s": 5120.0, "mfu": 0.5}, "sync": {"seconds": 0.01}}
  rows = dict((n, (m, p)) for n, m, p in measured_vs_predicted.rows(
      measured, predicted, dict(tflops=989.0, hbm_gbps=4.8)))
  assert rows["decode tok/s, batch 64"] == (32.0, pytest.approx(64.0))
  assert rows["decode tok/s, batch 256"] == (64.0, pytest.approx(128.0))
  assert rows["update tok/s"] == (5120.0, pytest.approx(16 * 640))
  assert rows["update MFU %"] == (50.0, None)  # no prediction: the bound's is 100%
  # the publish's floor: float32 read + bfloat16 written, 6 bytes a parameter, at 4.8 GB/s
  n = model.count_params(roofline.architecture("rho-1b"))
  assert rows["weight publish s (float32 -> bfloat16)"] == (0.01, pytest.approx(6 * n / 4.8e9))


@pytest.mark.slow
def test_pod_compiles_the_trainer_step_and_searcher_decode_on_fake_devices(tiny_cfg):
  devices = jax.devices()
  compiled = pod.trainer_program(tiny_cfg, devices, 4, 2, 8, 8, 8, 2)
  mem = pod._memory(compiled)
  assert mem["args"] > 0 and mem["peak"] >= mem["args"]
  coll = pod.collectives(compiled.as_text())
  assert "all-reduce" in coll or "reduce-scatter" in coll  # the FSDP gradient reduction
  decode = pod.searcher_program(tiny_cfg, devices, 2, 4, 16)
  assert pod._memory(decode)["args"] > 0

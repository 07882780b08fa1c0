r"""How often task.verifier's two checkers agree, on every GSM8K test gold.

  python -m benchmarks.verifier_agreement [--data /work/shared/data/gsm8k] [--show 10]

Each test problem's reference solution ("... #### 72") is scored as if it were a
completion, against its own gold, by paper_regex (the paper's last-number rule) and
math_verify (HF's math-verify); then the same solution with its final number replaced
by gold + 1, which both should reject. Prints the agreement on each probe, the
(paper_regex, math_verify) verdict counts, and the first --show disagreements.
"""
from __future__ import annotations

import argparse
import collections
import re
import time


def _wrong(solution: str, gold: float) -> str:
  """The solution with the number after its "####" replaced by gold + 1."""
  head, _ = solution.rsplit("####", 1)
  wrong = gold + 1
  return f"{head}#### {int(wrong) if float(wrong).is_integer() else wrong}"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", default="/work/shared/data/gsm8k",
                      help="a directory with test.jsonl ('' = the Hugging Face hub)")
  parser.add_argument("--show", type=int, default=10, help="disagreements to print per probe")
  args = parser.parse_args()

  from tba_jax import verifiers
  from tba_jax.tasks import gsm8k
  problems = gsm8k.load("test", args.data or None)
  golds = [p.target for p in problems]
  probes = {"gold solution": [p.fields["answer"] for p in problems],
            "gold + 1": [_wrong(p.fields["answer"], p.target) for p in problems]}
  for name, texts in probes.items():
    t0 = time.perf_counter()
    a = verifiers.paper_regex(texts, golds)
    b = verifiers.math_verify(texts, golds)
    cells = collections.Counter(zip(a.astype(int).tolist(), b.astype(int).tolist()))
    agree = int((a == b).sum())
    print(f"{name}: {len(texts)} problems, agreement {agree}/{len(texts)} "
          f"({100 * agree / len(texts):.2f}%); (paper_regex, math_verify) counts "
          f"{dict(sorted(cells.items()))}; {time.perf_counter() - t0:.1f} s")
    for i in [i for i in range(len(texts)) if a[i] != b[i]][:args.show]:
      tail = re.sub(r"\s+", " ", texts[i][-90:])
      print(f"  test[{i}] gold {verifiers.gold_text(golds[i])!r}: paper_regex {int(a[i])}, "
            f"math_verify {int(b[i])}: ...{tail!r}")


if __name__ == "__main__":
  main()

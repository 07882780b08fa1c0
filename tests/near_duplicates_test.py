"""Token edit distances against the textbook recurrence (the buffer's near-duplicate filter
itself: replay_buffer_test.py)."""
import numpy as np

from tba_jax import near_duplicates


def _levenshtein(a, b):
  d = list(range(len(b) + 1))
  for i, x in enumerate(a, 1):
    prev, d[0] = d[0], i
    for j, y in enumerate(b, 1):
      prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
  return d[-1]


def test_edit_distances_match_the_textbook_recurrence():
  rng = np.random.default_rng(0)
  ys = [rng.integers(0, 4, rng.integers(0, 9)) for _ in range(200)]
  lengths = np.array([y.size for y in ys])
  padded = np.full((len(ys), 8), -1)
  for i, y in enumerate(ys):
    padded[i, :y.size] = y
  for x in (rng.integers(0, 4, n) for n in (0, 1, 5, 9)):
    np.testing.assert_array_equal(near_duplicates.edit_distances(x, padded, lengths),
                                  [_levenshtein(list(x), list(y)) for y in ys])

"""The one token layout: prompts right-aligned before column Tp, completions after it."""
import numpy as np

from tba_jax import batch


def test_token_rows_align_every_completion_at_the_same_column():
  tokens, attention = batch.token_rows([[5, 6], [7], []], [[8, 9, 1], [], []], tp=3, tc=4,
                                       pad_id=0)
  np.testing.assert_array_equal(tokens, [[0, 5, 6, 8, 9, 1, 0], [0, 0, 7, 0, 0, 0, 0],
                                         [0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(attention, [[0, 1, 1, 1, 1, 1, 0], [0, 0, 1, 0, 0, 0, 0],
                                            [0, 0, 0, 0, 0, 0, 0]])
  assert tokens.dtype == attention.dtype == np.int32

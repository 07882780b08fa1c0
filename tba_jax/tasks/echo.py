"""Echo: the model is asked to repeat a word. A task added from the command line in
three files (this one, configs/echo.py, experiments/echo.py; README, "Adding a task"),
offline with the byte tokenizer."""
from tba_jax.tasks import Problem, Task

WORDS = ("cat", "dog", "sun", "sea", "red", "map", "pen", "cup", "owl", "fig", "jam", "kit")


def reward(text: str, word: str) -> float:
  """The fraction of the word's letters the completion has in their places."""
  return sum(a == b for a, b in zip(text, word)) / len(word)


def make_task(num_test: int) -> Task:
  """The last `num_test` words are held out (ids are per split: the buffer's prompt ids)."""
  split = lambda words: [Problem(i, {"word": w}, target=w) for i, w in enumerate(words)]
  return Task(train=split(WORDS[:-num_test]), test=split(WORDS[-num_test:]),
              prompt=lambda p: f"Say {p.fields['word']}: ", reward=reward, name="echo")

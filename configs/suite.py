r"""The suite: offline tasks of graded difficulty for the embedded default model.

Usage: python -m experiments.gsm8k --config configs/suite.py:NAME --workdir DIR
       python -m experiments.gsm8k --config configs/suite.py:NAME,tiny --workdir DIR
       [--config.section.key=value ...]   (or NAME,key=value,... / NAME,tiny,key=value,...)

Each NAME is configs/gsm8k.py's `cpu` recipe (SmolLM2-135M-Instruct on 2 CPU devices,
no network) with only its task section changed (TASKS below); `NAME,tiny` is the same
task on the gsm8k `tiny` recipe (a random 2-layer model and the byte tokenizer, a token a
byte: its own max_prompt_len; seconds, for tests). Every task has train / validation / test splits (tasks/arithmetic.py: the
problems of the form shuffled with the seed and cut in that order); a run evaluates on
the validation split (eval.split), where settings are chosen, and the test split is read
once, with --config.eval.split=test.

  NAME        what the model is asked                             problems (train/val/test)
  add_mul_1d  What is 7 * 8?  (the cpu recipe's task)             64 / 32 / 32
  two_op      What is 3 + 4 * 2?  (+ and *, * first; 2..5)        128 / 64 / 64
  two_digit   What is 62 - 79?  (+ - *, 10..99; sparse)           1000 / 500 / 500 of 24,300
  word        Mia has 3 bags with 7 marbles in each bag. ...      156 / 78 / 78
  long_chat   add_mul_1d behind the chat template with a          64 / 32 / 32
              system prompt of four sentences (long prompts)

TASKS[NAME]: `description`, `task` (the overrides of c.task), `budget_s` (the wall-clock
a run of the task gets) and `target` (the held-out sampled accuracy that counts as
reached). The budgets and targets are initial guesses, by the expected climb (add_mul_1d
reaches 0.8 in ~8 updates, test split, configs/gsm8k.py; the others are expected to
take tens to hundreds), to be set from validation runs. Measured so far (validation;
benchmarks/results/LAB_LOG.md): two_op never reached 0.5 in 1,200 s (every arm stopped
near 0.15, seed 0); word reached 0.6 at 383-599 s of its 900 and ended at 0.72-0.73 (the
recipe, seeds 0-2) and 0.77-0.85 (optim.lr_control=drift at a constant lr, seeds 0-2) on
an AVX2 EPYC; on an AVX-512 EPYC TRL GRPO ended it at 0.83-0.86 (lr 2e-5, seeds 0-2) and
free-running searchers at 0.70 (seed 0) and free-running with an inverse-square-root
decay from lr 2e-5 (optim.schedule=rsqrt, optim.stable_steps=10) at 0.83-0.91 (seeds 0-2);
long_chat ended at 0.87-0.90, its peak, short of 0.9 (the recipe, seeds 0-2; TRL GRPO
at its better lr, 1e-5: 0.86-0.90, one seed reaching 0.9).

Base rates: the untrained model's validation accuracy, through the run's evaluator at the
cpu recipe's evaluation settings (32 new tokens; sampled pass@1 over 2 samples at T = 0.7)
plus greedy pass@1, on the first 32 validation problems:
  python -m benchmarks.base_rates --tasks all --num_problems 32
Measured 2026-12-05 on a 2-core Intel Xeon (AVX-512), shared with three other jobs (load
3-6), float32 on one CPU device, 12-25 s a task:

  task        greedy   sampled   other settings tried (measured the same way)
  add_mul_1d  0.469    0.375
  two_op      0.062    0.047     high=9: 0.000 / 0.016; low=1, high=4: 0.219 / 0.188 (its
                                 x 1 problems are free); 2..5 kept
  two_digit   0.062    0.000     128 problems: 0.070 / 0.027; ops=+- (64): 0.109 / 0.039
  word        0.281    0.141
  long_chat   0.750    0.438     (the system prompt keeps the answers short)

Most misses run past 32 tokens ("To solve this problem, we need to ...") or restate a
number after the answer (the reward reads the last number).
"""
from configs import common, gsm8k

# The cpu recipe's prompt: the chat template's user turn written out, no system turn.
_USER_TURN = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
_SHORT = " Answer with just the number."
_SYSTEM = ("You are a careful math tutor who checks arithmetic homework for school children. "
           "Read the question, work out the exact value and reply with the final number only. "
           "Do not repeat the question, show your steps or add any words or units. "
           "Short, correct answers are what matters here.")


def _asked(max_prompt_len: int, **arithmetic) -> dict:
  """A task section whose prompt is the cpu recipe's user turn with the short-answer ask."""
  return dict(prompt_style=_USER_TURN, question_suffix=_SHORT, max_prompt_len=max_prompt_len,
              arithmetic=arithmetic)


TASKS = {
    "add_mul_1d": dict(
        description="single-digit + and * (2..9): the cpu recipe's task",
        task=_asked(24, form="one_op", ops="+*", low=2, high=9),
        tiny_max_prompt_len=64, budget_s=600, target=0.9),
    "two_op": dict(
        description="two operations on 2..5 (+ and *, * binds first)",
        task=_asked(28, form="two_op", ops="+*", low=2, high=5),
        tiny_max_prompt_len=72, budget_s=1200, target=0.5),
    "two_digit": dict(
        description="two-digit + - * (10..99): sparse, a low base rate",
        task=_asked(28, form="one_op", ops="+-*", low=10, high=99, num_problems=2000),
        tiny_max_prompt_len=72, budget_s=1500, target=0.3),
    "word": dict(
        description="one-operation word problems (+ - * on 2..9, two templates each)",
        task=_asked(44, form="word", ops="+-*", low=2, high=9),
        tiny_max_prompt_len=152, budget_s=900, target=0.6),
    "long_chat": dict(
        description="add_mul_1d behind the chat template with a system prompt",
        task=dict(prompt_style="chat", system_prompt=_SYSTEM, question_suffix=_SHORT,
                  max_prompt_len=88, arithmetic=dict(form="one_op", ops="+*", low=2, high=9)),
        tiny_max_prompt_len=360, budget_s=900, target=0.9),
}


def _recipe(name: str, tiny: bool):
  def recipe(c):
    gsm8k.RECIPES["tiny" if tiny else "cpu"](c)
    c.task.update(TASKS[name]["task"])
    if tiny:  # the byte tokenizer: a token per byte
      c.task.update(max_prompt_len=TASKS[name]["tiny_max_prompt_len"])
      c.eval.update(split="validation")
  return recipe


def get_config(arg: str = "add_mul_1d"):
  """`arg`: "NAME", "NAME,tiny" (the gsm8k tiny recipe), then ",key=value,..." overrides."""
  name, *rest = arg.split(",")
  tiny = rest[:1] == ["tiny"]
  recipes = {n: _recipe(n, tiny) for n in TASKS}
  return common.from_recipes(",".join([name, *rest[tiny:]]), "configs/suite.py", recipes)

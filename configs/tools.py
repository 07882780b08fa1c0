"""Multi-turn tool use (tba_jax/turns.py, tasks/tool_use.py): the model calls a tool between
its turns; trajectory balance counts only its own tokens (Entry.model_mask).

  python -m experiments.tools --config configs/tools.py:tiny --workdir /tmp/tools_tiny

tiny     The GSM8K smoke test's random 2-layer model, byte tokenizer and schedule (6 steps,
         offline) on 1-digit products with the calculator. A random model writes no
         `<tool>` tags, so its turns end at any of 16 letters and the whole turn goes to the
         calculator (bare calls: mostly error replies); its scores mean nothing.
cpu      The embedded SmolLM2-135M-Instruct on 3-digit x 3-digit products, which it cannot
         do in its head, with the calculator (`<tool>123 * 456</tool>`, the prompt says how):
           python -m experiments.tools --config configs/tools.py:cpu --workdir DIR
         2 CPU devices (trainer / searcher), 16 steps. Measured 2026-12-05 (2-core Xeon,
         quiet, 10 min 7 s) with the model's own last turn scored: held-out greedy
         pass@1 on 64 problems 0.000 -> 0.000: after the tool's result the model ends
         its turn without an answer (BENCHMARKS.md, "Multi-turn tool use"). The earlier
         0.078 -> 0.984 scored the whole transcript (a copied tool result counted as the
         answer): superseded.
qwen_gsm8k  GSM8K with the sandboxed Python tool (tasks/tools.run_python) on
         Qwen2.5-1.5B-Instruct, one accelerator, alternate mode:
           python -m experiments.tools --config configs/tools.py:qwen_gsm8k --workdir DIR
         Not measured (no accelerator was lent to this work).

task.tools: the environment (tasks/environment.py): `call_format` (tag | hermes | auto: our
`<tool>` tag, or the chat template's own tool calls and tool turn, tasks/tool_calls.py;
qwen_gsm8k's Qwen template gets hermes), `tool` (calculator | python),
`max_turns`, `max_turn_tokens`, `max_reply_tokens`, `timeout_s` (the Python tool's limit),
`num_workers` (threads running tools beside the decode loop), `stop` (the tag format's
comma-separated stop strings; hermes stops at "</tool_call>"), `bare_calls` (tag only),
`score` (what the reward reads: "last_turn", the model's own final turn, or "transcript",
every turn and reply). sampler.max_new_tokens bounds the whole
trajectory, replies included.
Static and streaming searchers (sampler.num_slots > 0: a continuous.Stream with replies) both run turns.
"""
from configs import common, gsm8k
from tba_jax.choices import TOOL_CALL_FORMATS, TOOL_SCORES
from tba_jax.config_checks import declare, key

VARIANTS = ("tiny", "cpu", "qwen_gsm8k")


def _tools(c, **kw):
  c.task.tools = declare(dict(
      # how the model calls its tool (tasks/tool_calls.py): "tag" (<tool>...</tool>, ours),
      # "hermes" (the chat template's <tool_call> JSON and tool turn; needs prompt_style
      # "chat"), "auto" (hermes where the prompt is the template's and it writes <tool_call>)
      call_format=key("auto", TOOL_CALL_FORMATS),
      tool="calculator", max_turns=2, max_turn_tokens=48, max_reply_tokens=16, timeout_s=5.0,
      num_workers=8, stop="</tool>", bare_calls=False,
      # what the task's reward reads (tasks/environment.SCORES): "last_turn" = the model's own
      # final turn (a tool's printed result is not an answer), "transcript" = every turn and
      # every reply (a task whose reward reads the exchange)
      score=key("last_turn", TOOL_SCORES)), "task.tools.")
  c.task.tools.update(kw)
  c.task.update(digits=3, num_train=2000, num_test=64)  # tool_multiplication's problems


def _tiny(c):
  gsm8k.RECIPES["tiny"](c)
  c.task.update(name="tool_multiplication", prompt_style="{question}", max_prompt_len=192)
  _tools(c, max_turn_tokens=8, max_reply_tokens=8, stop=",".join("abcdefghijklmnop"),
         bare_calls=True)
  c.task.update(digits=1, num_train=48, num_test=8)
  c.sampler.update(max_new_tokens=24)
  c.eval.update(max_new_tokens=24)


def _cpu(c):
  gsm8k.RECIPES["cpu"](c)
  c.num_train_steps = 16  # the earlier run's length (its 0.078 -> 0.984 scored the transcript)
  # that run's optimiser and unpaced searcher (gsm8k's cpu recipe before it moved to a
  # decaying lr, no clipping and paced searchers)
  c.optim.update(learning_rate=1e-5, schedule="constant", grad_clip_norm=1.0)
  c.sync.update(paced=False)
  # The assistant's turn opens with "<tool>": SmolLM2 never wrote the tag itself (0 calls on
  # 16 test problems, greedy and sampled), so the recipe opens it and the model learns to
  # close the call, write the question's expression and use the result (bare calls: the turn
  # is the call). Measured base rate with the opened tag (16 test problems): greedy copies
  # the prompt's example (12 * 34) every time, 0 correct; sampled at T=0.7, 2 of 16 correct.
  c.task.update(name="tool_multiplication", question_suffix="", max_prompt_len=128,
                prompt_style="<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
                             "<tool>")
  _tools(c, bare_calls=True)
  c.sampler.update(max_new_tokens=64, num_samples_per_prompt=8, num_prompts_per_batch=4)
  c.eval.update(every=20, num_problems=64, greedy=True, num_samples=0, max_new_tokens=64)
  c.checkpoint.update(every=20)


def _qwen_gsm8k(c):
  gsm8k.RECIPES["qwen_lora"](c)
  c.task.update(name="gsm8k_python", question_suffix="")
  _tools(c, tool="python", max_turns=3, max_turn_tokens=256, max_reply_tokens=64)
  c.sampler.update(max_new_tokens=640)
  c.eval.update(max_new_tokens=640)


RECIPES = {"tiny": _tiny, "cpu": _cpu, "qwen_gsm8k": _qwen_gsm8k}
assert tuple(RECIPES) == VARIANTS


def get_config(arg: str = "tiny"):
  return common.from_recipes(arg, "configs/tools.py", RECIPES)

"""The config's named choices: one list each, which the runtime implements exactly."""
import pytest

from tba_jax import choices, config_builders, model_config, replay_buffer, verifiers
from tba_jax.tasks import arithmetic, environment, redteam

SEAMS = ("TASKS", "LOSSES", "SCHEDULES", "LR_CONTROLS")


@pytest.mark.parametrize("seam", SEAMS)
def test_each_seam_is_the_declared_dict_with_a_builder_for_every_name(seam):
  # The same object: a task an experiment registers in config_builders.TASKS is a name the
  # config's check of task.name allows.
  assert getattr(config_builders, seam) is getattr(choices, seam)
  assert all(callable(build) for build in getattr(choices, seam).values())


def test_the_runtime_takes_its_lists_of_names_from_the_declarations():
  assert model_config.LORA_TARGETS is choices.LORA_TARGETS
  assert model_config.ATTENTION_IMPLS is choices.ATTENTION_IMPLS
  assert verifiers.VERIFIERS is choices.VERIFIERS == tuple(verifiers.CHECKERS)
  assert replay_buffer.EVICTION_POLICIES is choices.EVICTION_POLICIES
  assert replay_buffer.PRIORITIES is choices.PRIORITIES
  assert (redteam.JUDGES, redteam.PROMPT_STYLES) == (choices.REDTEAM_JUDGES,
                                                     choices.REDTEAM_PROMPT_STYLES)
  assert tuple(arithmetic.FORMS) == choices.ARITHMETIC_FORMS
  assert tuple(environment.SCORES) == choices.TOOL_SCORES


def test_builders_for_other_names_than_the_declared_ones_are_refused():
  build = lambda section: None
  for builders in ({"a": build}, {"a": build, "b": build, "c": build}, {"b": build, "a": build}):
    seam = dict.fromkeys(("a", "b"))
    with pytest.raises(ValueError, match=r"declares \['a', 'b'\]: declare each name there"):
      choices.fill(seam, builders)
    assert seam == {"a": None, "b": None}  # left as it was
  seam = dict.fromkeys(("a", "b"))
  assert choices.fill(seam, {"a": build, "b": build}) is seam and seam["b"] is build

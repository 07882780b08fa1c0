"""The pipeline model (benchmarks/pipeline_model.py): its invariants, its closed-form limits,
the planner against the paper's split, and the validation file it writes."""
import json
import math

import pytest

from benchmarks import pipeline_costs, pipeline_validation, plan
from benchmarks.pipeline_model import Costs, Engine, Layout, RunConfig, Wait, Work, simulate

COSTS = Costs(search_batch_s=3.0, update_s=2.0, sync_s=0.25)


def _config(**kw) -> RunConfig:
  base = dict(num_prompts=4, samples_per_prompt=4, samples_per_search=6, prompts_per_search=2,
              sync_every=2, m=0.95, prefill=16, num_train_prompts=40)
  return RunConfig(**{**base, **kw})


def closed_form(layout: Layout, c: RunConfig, costs: Costs) -> dict:
  """The steady state where one side sets the pace, by hand: async on separate devices (the
  trainer never waits: update + sync / k a step; unpaced searchers never idle) and alternate
  (a window's round, k updates and a publish, one after another)."""
  per_batch = c.prompts_per_search * c.samples_per_search
  if layout.mode == "async":
    return {"seconds_per_update": costs.update_s + costs.sync_s / c.sync_every,
            "produced_per_second": layout.num_searchers * per_batch / costs.search_batch_s}
  batches = math.ceil(c.window_prompts / (layout.num_searchers * c.prompts_per_search))
  window = (batches * layout.num_searchers * costs.search_batch_s
            + c.sync_every * costs.update_s + costs.sync_s)
  return {"seconds_per_update": window / c.sync_every}


LAYOUTS = {"async": Layout(num_searchers=2), "paced": Layout(num_searchers=2),
           "alternate": Layout(num_searchers=2, mode="alternate"),
           "shared": Layout(num_searchers=1, shared=True, shared_throughput=1.3)}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_trained_samples_never_exceed_produced_and_idle_fractions_are_fractions(name):
  r = simulate(LAYOUTS[name], _config(paced=name == "paced"), COSTS, 24)
  assert r.samples_trained == 24 * 4 * 4
  assert 0 < r.distinct_trained <= r.samples_produced
  assert 0.0 <= r.fresh_per_update <= r.samples_per_update == 16
  assert 0.0 <= r.trainer_idle <= 1.0 and 0.0 <= r.searcher_idle <= 1.0
  assert sum(r.staleness_hist.values()) == r.samples_trained and min(r.staleness_hist) >= 0


def test_synchronous_on_policy_training_has_zero_staleness_and_matches_its_closed_form():
  # alternate, k=1, m=1, S=K, one round of B prompts a step, K entries kept per prompt.
  c = _config(samples_per_search=4, prompts_per_search=4, sync_every=1, m=1.0,
              max_per_prompt=4)
  layout = Layout(num_searchers=1, mode="alternate")
  r = simulate(layout, c, COSTS, 12)
  assert r.staleness_hist == {0: 12 * 16}
  assert r.distinct_trained == r.samples_trained  # nothing reused
  form = closed_form(layout, c, COSTS)
  assert r.seconds_per_update == pytest.approx(form["seconds_per_update"])
  assert r.seconds_per_update == pytest.approx(3.0 + 2.0 + 0.25)


def test_alternate_windows_match_their_closed_form():
  layout, c = LAYOUTS["alternate"], _config(sync_every=4)
  r = simulate(layout, c, COSTS, 40)
  # A window: ceil(max(B, ceil(k B m)) / (searchers x P)) batches a searcher, k updates, a sync.
  assert r.seconds_per_update == pytest.approx((4 * 2 * 3.0 + 4 * 2.0 + 0.25) / 4)
  assert r.seconds_per_update == pytest.approx(
      closed_form(layout, c, COSTS)["seconds_per_update"])


def test_async_trainer_never_waits_and_unpaced_searchers_never_idle():
  layout, c = LAYOUTS["async"], _config()
  for costs in (COSTS, Costs(30.0, 2.0, 0.25), Costs(0.1, 2.0, 0.25)):  # slow and fast searchers
    r = simulate(layout, c, costs, 40)
    form = closed_form(layout, c, costs)
    assert r.seconds_per_update == pytest.approx(form["seconds_per_update"])
    assert r.trainer_idle == pytest.approx(costs.sync_s / c.sync_every / r.seconds_per_update)
    assert r.searcher_idle == pytest.approx(0.0, abs=1e-9)
    # Whole batches by the end: within one batch per searcher of the closed-form rate.
    assert abs(r.samples_produced - form["produced_per_second"] * r.wall_seconds) <= 2 * 2 * 6


def test_roles_sharing_devices_split_them_by_their_throughput():
  c = _config()
  for throughput in (1.0, 1.5):
    layout = Layout(num_searchers=1, shared=True, shared_throughput=throughput)
    r = simulate(layout, c, COSTS, 30)
    # An unpaced searcher is always busy: each update runs at throughput / 2 of its speed.
    assert r.update_seconds == pytest.approx(2.0 * 2 / throughput)


def test_paced_searchers_keep_staleness_within_one_window_of_lag():
  fast = Costs(search_batch_s=0.5, update_s=2.0, sync_s=0.1)
  for k in (1, 2, 4):
    r = simulate(LAYOUTS["paced"], _config(paced=True, m=1.0, sync_every=k), fast, 40)
    assert r.staleness_max <= 2 * k - 1, (k, r.staleness_hist)
  # Unpaced searchers slower than a window let staleness grow past it: the bound is not vacuous.
  slow = simulate(LAYOUTS["async"], _config(m=1.0, sync_every=2), Costs(20.0, 2.0, 0.1), 40)
  assert slow.staleness_max > 2 * 2 - 1


def test_paced_searchers_produce_about_what_the_m_branch_takes():
  fast = Costs(search_batch_s=0.5, update_s=2.0, sync_s=0.1)
  paced = simulate(LAYOUTS["paced"], _config(paced=True), fast, 40)
  unpaced = simulate(LAYOUTS["async"], _config(), fast, 40)
  c = _config()
  per_window = 2 * math.ceil(c.window_prompts / 2) * c.samples_per_search  # 2 searchers
  assert paced.samples_produced <= (40 // c.sync_every + 1) * per_window + c.prefill + 2 * 12
  assert unpaced.samples_produced > 3 * paced.samples_produced


def test_bad_inputs_are_refused_naming_the_problem():
  with pytest.raises(ValueError, match="m"):
    _config(m=1.5)
  with pytest.raises(ValueError, match="mode"):
    Layout(mode="sync")
  with pytest.raises(ValueError, match="update_s"):
    Costs(1.0, 0.0, 0.0)
  with pytest.raises(ValueError, match="num_updates"):
    simulate(Layout(), _config(), COSTS, 3)
  with pytest.raises(ValueError, match="chip"):
    pipeline_costs.role_model("rho-1b", "B200")


def test_an_engine_whose_actors_all_wait_reports_a_deadlock():
  engine = Engine({})

  def stuck():
    yield Work("a", 1.0, "x")
    yield Wait(lambda: False)

  engine.add("a", stuck())
  with pytest.raises(RuntimeError, match="deadlock"):
    engine.run(lambda: False, horizon=100.0)


def test_decode_steps_interpolate_between_measured_points():
  role = pipeline_costs.role_model("rho-1b", "H200")
  assert role.decode_step_s(8) == pytest.approx(2.69e-3)
  assert role.decode_step_s(4) == pytest.approx(2.69e-3)       # the weights' read floor
  assert role.decode_step_s(160) == pytest.approx((3.43e-3 + 5.81e-3) / 2)
  assert role.decode_step_s(512) == pytest.approx(2 * 5.81e-3)  # the last point's tokens/s
  a100 = pipeline_costs.role_model("rho-1b", "A100")
  assert a100.update_s(140, 832, 2) < a100.update_s(140, 832, 1)
  assert any("predicted" in how for _, how in a100.sources)


TINY = plan.Task(4, 4, 5, 2, 2, 0.95, 32, 64, 64, 1, 200, "gsm8k", False, 100, "a tiny test task")


def test_the_planner_trains_at_least_as_fast_as_the_papers_split_within_the_bound():
  roles = plan.Roles(pipeline_costs.role_model("rho-1b", "A100"))
  best, r, (paper, pr), sync, bound = plan.plan(roles, TINY, 4, num_updates=12)
  assert bound == pr.latest_staleness_mean  # by default the paper split's staleness
  assert r.fresh_per_second >= pr.fresh_per_second
  assert r.latest_staleness_mean <= pr.latest_staleness_mean + 1e-9
  assert best.trainers + best.searchers == 4
  assert sync.staleness_hist == {0: sync.samples_trained}
  # A tight bound the paper's split misses is met by another split or by none.
  best_tight, r_tight, _, _, _ = plan.plan(roles, TINY, 4, max_staleness=0.5, num_updates=12)
  assert best_tight is None or r_tight.latest_staleness_mean <= 0.5


def test_the_validation_file_is_what_the_model_computes_today():
  with open(pipeline_validation.OUT) as f:
    stored = json.load(f)
  assert stored == pipeline_validation.rows(), \
      "rerun python -m benchmarks.pipeline_validation and commit its JSON"
  assert len(stored) >= 4 and all("in_sample" in row and "source" in row for row in stored)

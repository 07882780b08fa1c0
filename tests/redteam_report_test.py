"""The red-teaming report: a run's successful attacks, most toxic first, with the replies."""
from tba_jax.tasks import redteam_report


def test_the_attack_report_lists_the_last_evaluations_distinct_successes_most_toxic_first():
  row = lambda text, p, replies: {"completion": text, "attack_success_rate": float(p > 0.5),
                                  "toxicity": p, "replies": replies,
                                  "reply_toxicity": [p] * len(replies)}
  first = [row(" Bake bread", 0.1, ["Sure."]), row(" Insult me", 0.6, ["You idiot"])]
  last = [row(" Insult me", 0.7, ["You fool"]), row(" Insult me ", 0.9, ["Shut up, idiot"]),
          row(" Swear", 0.8, ["damn"]), row(" Bake bread", 0.2, ["Sure."])]
  text = redteam_report.attack_report({0: first, 30: last})
  assert "step 0: 1 of 2 sampled attacks succeeded, 1 distinct" in text
  assert "step 30: 3 of 4 sampled attacks succeeded, 2 distinct" in text
  listing = text.split("most toxic first")[1]
  assert listing.index("'Insult me'") < listing.index("'Swear'")  # by p: 0.9, then 0.8
  assert "[p = 0.900] 'Insult me'" in listing and "'Shut up, idiot'" in listing
  assert "You fool" not in listing and "Bake bread" not in listing  # one row per attack

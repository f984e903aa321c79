"""The embedded family's problem space: every level holds >= 10,000 distinct problems by canonical form, the
canonical form identifies every rendering of one problem, and splits and fresh sets are disjoint by it."""

import collections
import random

import pytest

from agentrl_jax.tasks import arithmetic


@pytest.mark.parametrize("a,b", [
    ("3+5", "5+3"), ("3+5", " 3 + 5 "), ("37*(2+5)", "(5+2)*37"), ("(12+7)*(30-4)", "(30-4)*(7+12)"),
    ("(2*3)*(4+5)", "(5+4)*(3*2)"), ("(2*3)*(4+5)", "2*(3*(5+4))"), ("((41))", "41"), ("(9-4)*(7+1)", "(1+7)*(9-4)"),
])
def test_equivalent_renderings_share_a_canonical_form(a, b):
  assert arithmetic.canonical(a) == arithmetic.canonical(b)


@pytest.mark.parametrize("a,b", [("30-4", "4-30"), ("3+5", "3*5"), ("(2+3)*4", "2+3*4"), ("12", "21"),
                                 ("(9-4)*(7+1)", "(4-9)*(7+1)")])
def test_different_problems_keep_different_forms(a, b):
  assert arithmetic.canonical(a) != arithmetic.canonical(b)


def test_questions_in_any_wording_and_bad_text():
  key = arithmetic.canonical("372+58")
  for q in ("Compute 372+58.", "What is 58 + 372?", "calculate (58)+(372)", "Evaluate: 372+58"):
    assert arithmetic.canonical_question(q) == key, q
  assert arithmetic.canonical_question("Write 4821.") == "4821"
  for bad in ("Tell me a story.", "Compute 3+.", "Compute __import__('os').", "Compute 2**10."):
    with pytest.raises(ValueError):
      arithmetic.canonical_question(bad)


def test_every_level_has_at_least_10000_canonical_problems():
  """30,000 draws per level from the generator itself reach >= 10,000 distinct canonical forms each, and no
  level's canonical forms look like another's."""
  rng = random.Random(0)
  for level in arithmetic.LEVELS:
    keys = {arithmetic.make_problem(rng, level).key for _ in range(30_000)}
    assert len(keys) >= 10_000, (level, len(keys))
    assert {arithmetic.level_of(k) for k in keys} == {level}
    assert arithmetic.LEVEL_SPACE[level] >= 10_000


@pytest.mark.slow
def test_level_space_counts_are_exact():
  """Each level's whole space enumerated by canonical form (levels 0-2 exactly through `canonical`; level 3's
  13.8M renderings through the same rules written out, checked against `canonical` on a sample)."""
  lo, hi = arithmetic.ADD_RANGE
  assert len({arithmetic.canonical(f"{a}+{b}") for a in range(lo, hi + 1) for b in range(a, hi + 1)}) == \
      arithmetic.LEVEL_SPACE[1]
  small, large = range(arithmetic.MUL_SMALL[0], arithmetic.MUL_SMALL[1] + 1), range(*arithmetic.MUL_LARGE)
  keys = {arithmetic.canonical(f"{a}*{b}") for a in small for b in range(large.start, large.stop + 1)}
  assert len(keys | {arithmetic.canonical(f"{b}*{a}") for a in small for b in small}) == arithmetic.LEVEL_SPACE[2]
  assert arithmetic.LEVEL_SPACE[0] == sum(9 * 10 ** (d - 1) for d in arithmetic.COPY_DIGITS)
  nums = [str(x) for x in range(arithmetic.EXPR_RANGE[0], arithmetic.EXPR_RANGE[1] + 1)]

  def key(a, op1, b, c, op2, d):
    right = "(" + "+".join(sorted((c, d))) + ")" if op2 == "+" else f"({c}-{d})"
    left = [a, b] if op1 == "*" else ["(" + "+".join(sorted((a, b))) + ")" if op1 == "+" else f"({a}-{b})"]
    return "(" + "*".join(sorted([*left, right])) + ")"

  rng = random.Random(0)
  for _ in range(5000):
    a, b, c, d = (rng.choice(nums) for _ in range(4))
    op1, op2 = rng.choice("+-*"), rng.choice("+-")
    assert key(a, op1, b, c, op2, d) == arithmetic.canonical(f"({a}{op1}{b})*({c}{op2}{d})")
  count = len({key(a, op1, b, c, op2, d) for a in nums for b in nums for c in nums for d in nums
               for op1 in "+-*" for op2 in "+-"})
  assert count == arithmetic.LEVEL_SPACE[3]


def test_splits_are_disjoint_by_canonical_form():
  sizes = {"heldout": 512, "sft": 256, "rl": 768}
  splits = arithmetic.make_splits(sizes, level_weights={0: 0.1, 1: 0.2, 2: 0.35, 3: 0.35}, seed=0)
  assert {k: len(v) for k, v in splits.items()} == sizes
  keys = collections.Counter(p.key for split in splits.values() for p in split)
  assert len(keys) == sum(sizes.values()) and max(keys.values()) == 1
  for p in splits["heldout"]:
    assert str(eval(p.expression)) == p.answer  # noqa: S307 (own text)


def test_operand_order_repeats_are_rejected_and_excluded_forms_never_drawn():
  """A level of one operand pair shows the rejection at work: every split holds each pair once in one order."""
  few = {0: 1.0}
  seen = {p.key for p in arithmetic.make_splits({"a": 300}, level_weights=few, seed=1)["a"]}
  fresh = arithmetic.make_fresh(300, level_weights=few, seed=1, exclude=seen)
  assert not {p.key for p in fresh} & seen and len({p.key for p in fresh}) == 300
  # A rendering the generator never writes ("58+372" for a drawn "372+58") is excluded all the same.
  drawn = arithmetic.make_problems(200, levels=(1, 2, 3), seed=4)
  swapped = {arithmetic.canonical_question(f"What is {'+'.join(reversed(p.expression.split('+')))}?")
             for p in drawn if p.level == 1}
  fresh = arithmetic.make_fresh(5000, level_weights={1: 1.0}, seed=4, exclude=swapped)
  assert not {p.key for p in fresh} & swapped


def test_exhausted_levels_and_impossible_requests():
  with pytest.raises(ValueError, match="after exclusions"):
    arithmetic.make_splits({"a": arithmetic.LEVEL_SPACE[0] + 1}, level_weights={0: 1.0})
  with pytest.raises(ValueError, match="level_weights"):
    arithmetic.make_splits({"a": 1}, level_weights={9: 1.0})

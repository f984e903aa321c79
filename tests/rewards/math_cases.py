"""Labelled math-answer cases by class, written for this project (not copied from any verifier's suite).

Each case is (response, ground truth, expected): `response` is the model's whole response (most through `boxed`).
`tests/rewards/test_rewards_math.py` checks every case; `tests/rewards/measure_math_verifiers.py` measures the
agreement of a checker (ours, or Math-Verify where installed) with these labels per class.
"""

from __future__ import annotations


def boxed(answer: str) -> str:
  return f"Let me think... the computation gives the result.\n\nFinal answer: \\boxed{{{answer}}}."


def _cases(rows, box=True):
  return [(boxed(p) if box else p, t, e) for p, t, e in rows]


CLASSES: dict[str, list[tuple[str, str, bool]]] = {
    # A list of answers (',', ';', 'and', \\text{ and }: roots, solutions, pairs) is a multiset: any order, but a
    # missing, extra or repeated answer is wrong; sets (braces, 'or', \\pm) ignore repeats; one tuple is ordered,
    # and so is a list whose items are labelled on one side only.
    "sets and lists": _cases([
        ("6 \\text{ and } 8", "6, 8", True), ("8, 6", "6, 8", True), ("3; 1; 2", "1, 2, 3", True),
        ("2 \\text{ or } -3", "-3, 2", True), ("x = 2 \\text{ or } x = -3", "-3, 2", True),
        ("x=-3 \\text{ or } x=2", "x = 2, x = -3", True), ("1, 2, and 4", "4, 2, 1", True),
        ("5, 7 \\text{ and } 11", "5, 7, 11", True), ("\\{4, -1\\}", "-1, 4", True), ("-1, 4", "\\{4,-1\\}", True),
        ("(1, 2), (3, 4)", "(3, 4), (1, 2)", True), ("(0;1;2)", "(0, 1, 2)", True),
        ("\\pm 3", "3, -3", True), ("6, 8", "6, 8", True), ("1; 2; 3", "1, 2, 3", True),
        ("-2 \\text{ or } 1", "1, -2", True), ("\\{8, 6\\}", "\\{6, 8\\}", True),
        ("1 \\pm \\sqrt{2}", "1 - \\sqrt{2}, 1 + \\sqrt{2}", True),
        ("\\frac{1}{2} \\text{ and } 2", "2, \\frac12", True), ("-2,1", "1, -2", True),
        ("-10,-8,4", "a=4,\\,-8,\\,-10", True), ("(5,2),(7,2)", "p=5,q=2;p=7,q=2", True),
        ("(4, 0, 6), (0, -2, 0), (0, 0, 0)", "(0;0;0),(0;-2;0),(4;0;6)", True),
        ("x = 2, x = -3", "-3, 2", True), ("q=2, p=5; q=2, p=7", "p=5,q=2;p=7,q=2", True),
        # ... and their wrong neighbours: a repeated, missing or extra answer, another answer, a reordered tuple.
        ("6, 6", "6, 8", False), ("6, 8, 8", "6, 8", False), ("8", "6, 8", False), ("6, 8, 10", "6, 8", False),
        ("1, 1, 2", "1, 2, 2", False), ("-2, 1, 1", "1, -2", False), ("-10, -8, 5", "a=4,-8,-10", False),
        ("(1, 2), (4, 3)", "(3, 4), (1, 2)", False), ("(2, 1)", "(1, 2)", False), ("2, 1", "(1, 2)", False),
        ("(2, 1)", "1, 2", False), ("x = 1, y = 2", "2, 1", False), ("y = 2, x = 1", "x = 2, y = 1", False),
        ("(2,5),(7,2)", "p=5,q=2;p=7,q=2", False), ("(5,2),(7,2),(7,2)", "p=5,q=2;p=7,q=2", False),
        ("5,2;2,7", "p=5,q=2;p=7,q=2", False), ("(3,3,2,3), (3,17,3,7), (3,17,3,7)", "(3,17,3,7),(3,3,2,3)", False),
        ("2, 3", "2, 3, 5", False), ("6 \\text{ or } 8", "6", False), ("(2, 1), (3, 4)", "(1, 2), (3, 4)", False),
        ("\\pm 3", "3", False), ("\\{1, 2\\}", "(1, 2)", False), ("1, 2, 3", "1, 2, 4", False),
    ]),
    # Several boxes that together form the answer; a hedge across boxes is a list, not its last item.
    "several boxes": _cases([
        ("So the pairs are \\boxed{(2,2)} \\text{ and } \\boxed{(6,2)}.", "(2, 2), (6, 2)", True),
        ("Hence \\boxed{-2}, \\boxed{1}.", "-2, 1", True), ("Hence \\boxed{-2}, \\boxed{1}.", "1, -2", True),
        ("Hence \\boxed{-2}, \\boxed{-2}.", "1, -2", False), ("\\boxed{1}, \\boxed{-2}, \\boxed{3}", "1, -2", False),
        ("$\\boxed{7}$ and $\\boxed{9}$", "7, 9", True),
        ("\\boxed{x = 1} \\quad \\text{and} \\quad \\boxed{x = 5}", "1, 5", True),
        ("First I got \\boxed{4}, but that was wrong. Redoing the sum gives \\boxed{5}.", "5", True),
        ("\\boxed{5}\n\n**Final Answer**\n\\boxed{5}", "5", True),
        ("It is \\boxed{3} or \\boxed{5}.", "5", False), ("\\boxed{3}, \\boxed{5}", "3", False),
        ("\\boxed{(2,2)} \\text{ and } \\boxed{(6,3)}", "(2, 2), (6, 2)", False),
    ], box=False),
    # Labelled answers and equation chains.
    "labels and chains": _cases([
        ("(3,2)", "(p,q)=(3,2)", True), ("(m, n) = (5, 1)", "(5, 1)", True), ("AB = 4", "4", True),
        ("4", "AB=4", True), ("BC = 7, CA = 9", "7, 9", True), ("x = 2 = 2.0", "2", True),
        ("x = 3 + 4 = 7", "7", True), ("a_{10} = 512", "512", True), ("f(x) = 3x - 1", "3x-1", True),
        ("\\frac{AP}{PB} = \\frac{2}{3}", "\\frac{2}{3}", True), ("x \\approx 2.5", "2.5", True),
        ("11a + c", "7 = 11a + c", False), ("1", "2x + y = 1", False), ("0", "a + 3z = 0", False),
        ("x = 3 = 4", "3", False), ("(p, q) = (2, 3)", "(3, 2)", False),
        ("a_{37} = 19, a_3 = 2", "a_3 = 2, a_{37} = 19", True), ("a_{37} = 2, a_3 = 19", "a_3 = 2, a_{37} = 19", False),
    ]),
    # Intervals, inequalities (flipped, negated, as intervals, either side) and equations equal after rearranging or
    # scaling.
    "relations and intervals": _cases([
        ("x \\in [1, 5]", "[1, 5]", True), ("[1, 5]", "x \\in [1,5]", True), ("(-3, 10)", "-3 < a < 10", True),
        ("-3 < x < 10", "(-3, 10)", True), ("[2, \\infty)", "x \\geq 2", True), ("x > 2", "(2, \\infty)", True),
        ("5 \\geq x", "x \\leq 5", True), ("x \\le 5", "(-\\infty, 5]", True), ("-x > -1", "x < 1", True),
        ("2y = 4x + 6", "y = 2x + 3", True), ("3x + 6y = 9", "x + 2y - 3 = 0", True),
        ("-34x - 45y + 20z = 100", "34x + 45y - 20z + 100 = 0", True), ("10 > x > 2", "2 < x < 10", True),
        ("(-\\infty, 1) \\cup (2, \\infty)", "(2, \\infty) \\cup (-\\infty, 1)", True),
        ("x \\in (1, 5)", "[1, 5]", False), ("[-3, 10)", "-3 < a < 10", False), ("x \\geq 5", "x \\leq 5", False),
        ("x > -1", "x < 1", False), ("y = 2x + 4", "y = 2x + 3", False), ("x^2 = 4", "x = 2", False),
        ("(-\\infty, 1) \\cup (2, \\infty)", "(-\\infty, 1] \\cup (2, \\infty)", False),
        ("2x < 10", "(-\\infty, 10)", False),
        ("-2 \\le x \\le 7", "x \\in [-2,7]", True), ("x \\in [-2,7]", "-2 \\le x \\le 7", True),
        ("z \\in \\left[-\\frac{3}{2}, -1\\right] \\cup \\left[1, \\frac{3}{2}\\right]", "1\\leq|z|\\leq \\frac{3}{2}", True),
        ("|x| < 2", "(-2, 2)", True), ("|x| > 2", "(-\\infty, -2) \\cup (2, \\infty)", True),
        ("-2 < x \\le 7", "x \\in [-2,7]", False), ("-2 \\le x < 7", "x \\in [-2,7]", False),
        ("-2 \\le x \\le 8", "x \\in [-2,7]", False), ("x \\ge 5", "(5, \\infty)", False),
        ("x \\in (-2, 7)", "-2 \\le x \\le 7", False), ("x \\le 7", "x \\in [-2,7]", False),
        ("z \\in (-\\frac{3}{2}, -1] \\cup [1, \\frac{3}{2}]", "1\\leq|z|\\leq \\frac{3}{2}", False),
        ("[1, \\frac{3}{2}]", "1\\leq|z|\\leq \\frac{3}{2}", False), ("|x| \\le 2", "(-2, 2)", False),
        ("|x| > 2", "(-\\infty, -2] \\cup (2, \\infty)", False), ("-2 \\le |x| \\le 2", "[-2, 2]", False),
    ]),
    # Percent as words, \textnormal{} and other unit markup.
    "percent and units": _cases([
        ("28 percent", "28\\%", True), ("28 \\text{ percent}", "28", True), ("28 pct", "28\\%", True),
        ("12 \\textnormal{ cm}", "12", True), ("5 \\textnormal{m}^2", "5", True), ("7\\,\\mathrm{kg}", "7", True),
        ("15 \\text{ dollars}", "15", True), ("\\textnormal{odd}", "\\text{odd}", True),
        ("30 percent", "28\\%", False), ("12 \\textnormal{ cm}", "13", False), ("\\text{odd}", "\\text{even}", False),
        ("5 \\textnormal{m}^2", "25", False),
    ]),
    # Decimal commas; a decimal against an exact or irrational value is that value rounded or truncated to the
    # decimal's own last place, with at least three significant digits.
    "numbers": _cases([
        ("3,14", "3.14", True), ("0,5", "\\frac{1}{2}", True), ("1000,25", "1000.25", True),
        ("0.0833333333", "\\frac{1}{12}", True), ("0.6666667", "\\frac{2}{3}", True), ("1.4142136", "\\sqrt{2}", True),
        ("3.1415927", "\\pi", True), ("2.5", "\\frac{5}{2}", True), ("1,000,000", "1000000", True),
        ("0.08333", "\\frac{1}{12}", True), ("0.33", "\\frac{1}{3}", False), ("1.41", "\\sqrt{2}", True),
        ("3.1416", "\\pi", True), ("3,14", "314", False), ("0.3333", "\\frac{1}{3}", True),
        ("(0.6, 2.6667]", "(\\frac{3}{5},\\frac{8}{3}]", True), ("-0.6667", "-\\frac{2}{3}", True),
        ("0.1666", "\\frac{1}{6}", True), ("3.1415", "\\pi", True),
        # ... and their wrong neighbours: outside the last place, too few digits, a zero that claims a place.
        ("0.3334", "\\frac{1}{3}", False), ("0.3332", "\\frac{1}{3}", False), ("0.3330", "\\frac{1}{3}", False),
        ("0.3", "\\frac{1}{3}", False), ("0.1665", "\\frac{1}{6}", False), ("3.1417", "\\pi", False),
        ("3.15", "\\pi", False), ("(0.6, 2.6667)", "(\\frac{3}{5},\\frac{8}{3}]", False),
        ("(0.6, 2.6668]", "(\\frac{3}{5},\\frac{8}{3}]", False), ("(0.61, 2.6667]", "(\\frac{3}{5},\\frac{8}{3}]", False),
        ("0.6667", "-\\frac{2}{3}", False), ("2.999", "3", False), ("3.001", "3", False),
        ("1.50", "\\frac{151}{100}", False), ("2.70", "e", False), ("2.73", "e", False), ("2.72", "e", True),
        ("2.718", "e", True),
    ]),
    # Matrices entry by entry, whitespace-insensitive.
    "matrices": _cases([
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
        ("\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", True),
        ("\\begin{pmatrix} 0.5 & 1 \\end{pmatrix}", "\\begin{pmatrix} \\frac12 & 1\\end{pmatrix}", True),
        ("\\begin{pmatrix} \\sqrt{4} & 0 \\\\ 0 & 2 \\end{pmatrix}", "\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}", True),
        ("\\left[\\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array}\\right]", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
         True),
        ("\\begin{pmatrix} 1 \\\\ 2 \\\\ \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
        ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", False),
        ("\\begin{pmatrix}1 & 2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False),
        ("\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False),
    ]),
    # Near numbers and chains: an integer answer is exact, a decimal is a rounding only within its last place and
    # six significant digits, irrationals beyond float noise are other numbers, a chain states nothing unless
    # every member is equal.
    "near numbers and chains": _cases([
        ("999999.5", "1000000", False), ("33.00001", "33", False), ("3 = 5 = 7", "7", False),
        ("x = 5 = 7", "7", False), ("1000000.4", "1000000.5", False), ("0.9999999", "1", False),
        ("1", "0.9999999", False), ("\\frac{355}{452}", "\\frac{\\pi}{4}", False), ("0.67", "\\frac{2}{3}", False),
        ("33.0", "33", True), ("2.50", "\\frac52", True), ("\\sqrt{2}^2", "2", True), ("e^{\\ln 7}", "7", True),
        ("\\frac{1}{3}", "0.3333333", True), ("x = 3 + 4 = 7", "7", True), ("1 000", "1000", True),
        ("1.22", "1,22", True), ("0.111", "0,111", True),
    ]),
    # Sums and products commute, also inside a sum; nothing else about a sum is assumed.
    "commutativity": _cases([
        ("F_n = \\sum_{k=0}^{n-1} F_{n-k-1} F_k", "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", True),
        ("\\sum_{k=1}^{n} (k+1)k", "\\sum_{k=1}^{n} k(k+1)", True), ("1 + \\sum_{k=1}^{n} k", "\\sum_{k=1}^{n} k + 1", True),
        ("yx + z", "z + xy", True), ("\\prod_{k=1}^{n} (2k+1)", "\\prod_{k=1}^{n} (1+2k)", True),
        ("F_n = \\sum_{k=0}^{n-1} F_{n-k} F_k", "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", False),
        ("F_n = \\sum_{k=0}^{n} F_{n-k-1} F_k", "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", False),
        ("F_n = \\sum_{k=1}^{n-1} F_{n-k-1} F_k", "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", False),
        ("F_n = \\prod_{k=0}^{n-1} F_k F_{n-k-1}", "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", False),
        ("F_{n+1} = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", False),
        ("2\\sum_{k=1}^{n} k", "\\sum_{k=1}^{n} k", False), ("\\sum_{k=1}^{3} a_k", "3a_k", False),
        ("\\sum_{k=1}^{n} k^2 + k", "\\sum_{k=1}^{n} k(k+1)", False), ("ab - c", "c - ba", False),
        ("\\sum_{k=1}^{n} k", "7", False), ("g(x) = 3x - 1", "f(x) = 3x - 1", False), ("BA = 4", "AB = 4", True),
    ]),
    # False accepts to close: joined numbers and lists read as one number; legitimate readings stay accepted.
    "false accepts": _cases([
        ("32, 349", "32349", False), ("1213", "12 \\text{ and } 13", False), ("12 13", "1213", False),
        ("100, 200", "100200", False), ("100200", "100, 200", False), ("1,5", "15", False), ("1.5", "1, 5", False),
        ("\\frac{1}{2} \\text{ or } \\frac{1}{3}", "\\frac{1}{2}", False), ("2 \\text{ and } 3", "23", False),
        ("1234", "(1, 234)", False), ("123,456", "123, 456, 789", False),
        ("32,349", "32349", True), ("32,349", "32, 349", True), ("12 \\text{ and } 13", "12, 13", True),
        ("100,200", "100, 200", True), ("1,234", "(1, 234)", True),
    ]),
}

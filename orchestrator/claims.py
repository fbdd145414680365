"""Claims and checks of a reproduction, and how ladder judges them across seeds.

A workload exports two lists of functions over the finished trials of one seed of its
reproduction (one dict per trial: its config fields and its final metrics), each returning
`(holds, measured)`:

- `CLAIMS`: effects the paper reports. Declare each with `@claim(...)`: which measured number is
  the effect (a difference or ratio between the method and its baseline, within one seed, so the
  comparison is paired), the threshold it is judged at, the paper's own number or statement, and
  where the threshold comes from (the paper, or which seeds we calibrated it on: never the seeds a
  reproduction judges).
- `CHECKS`: invariants and mechanism sanity (a merge that is exact, a state that does not grow, a
  gradient that is zero): they hold by construction when the code is right, whatever training
  does, so they are correctness tests, not evidence for the paper. A check must hold at every seed.

Judgement over K seeds (`ladder reproduce NAME --seeds K`):

- A declared claim: the effect's mean over the seeds with a two-sided 95% Student-t interval
  (mean +- t(0.975, K-1) * sd / sqrt(K); the seeds are independent replicates and each value is
  already a within-seed difference, so this is the paired t-interval). **holds** when the whole
  interval is on the paper's side of the threshold, **fails** when it is wholly on the other side,
  **inconclusive** otherwise. One seed gives no interval: inconclusive, whatever its value.
- A claim without a declaration (say, a workload of one's own written before `@claim`): judged on
  how often it held, with a 95% Clopper-Pearson interval on that rate; holds when the interval is
  above 1/2, fails when below, inconclusive otherwise (at least 6 seeds are needed to conclude).
- A claim that returns `holds=None` at every seed could not be decided at this size: **not
  judged**. Seeds where it returned None are left out of the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

CONFIDENCE = 0.95
FULL_SEEDS = 5
"""Seeds a full-size reproduction runs unless told otherwise (a smoke run: 1)."""
SIZES = ("smoke", "bench", "full")
"""The sizes a reproduction may be built at, smallest first (`orchestrator.reproduction.reproduce`)."""
HOLDS, FAILS, INCONCLUSIVE, NOT_JUDGED = "holds", "fails", "inconclusive", "not judged"


@dataclass(frozen=True)
class Spec:
    """How a claim is judged: `effect` (a key of what the claim measures) compared with a threshold."""

    effect: str
    threshold: float
    direction: str
    """'>=' (the effect must be at least the threshold) or '<='."""
    paper: str
    """The paper's own number or statement for this effect."""
    source: str
    """Where the threshold comes from: 'paper', or how we calibrated it (on which seeds)."""

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.direction == ">=" else value <= self.threshold

    @property
    def describe(self) -> str:
        return f"{self.effect} {self.direction} {self.threshold:g}"


def claim(effect: str, *, at_least: float | None = None, at_most: float | None = None, paper: str,
          threshold_from: str = "paper") -> Callable[[Callable], Callable]:
    """Declare what a claim function measures and how it is judged across seeds:

        @claim("gain", at_least=0.10, paper="+12.3 points over LoRA on 2:4 sparsity (Table 2)",
               threshold_from="calibrated on seeds 100-104")
        def method_beats_baseline(trials): ...

    `effect` must be a key of the dict the function returns; give exactly one of `at_least` and
    `at_most`. `threshold_from` is 'paper' when the threshold is the paper's, else how we chose it.
    """
    if (at_least is None) == (at_most is None):
        raise ValueError(f"claim({effect!r}): give exactly one of at_least= and at_most=")
    if not str(paper).strip():
        raise ValueError(f"claim({effect!r}): paper= must state the paper's number or statement for this effect")
    threshold, direction = (at_least, ">=") if at_least is not None else (at_most, "<=")
    spec = Spec(str(effect), float(threshold), direction, str(paper).strip(), str(threshold_from).strip() or "paper")

    def mark(fn: Callable) -> Callable:
        fn.ladder_claim = spec
        return fn

    return mark


def spec_of(fn: Any) -> Spec | None:
    spec = getattr(fn, "ladder_claim", None)
    return spec if isinstance(spec, Spec) else None


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int


def t_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean and two-sided Student-t interval; one value gives (-inf, inf)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        raise ValueError("t_interval of no values")
    mean = sum(xs) / n
    if n == 1:
        return Interval(mean, -math.inf, math.inf, 1)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def rate_interval(k: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """The share k/n with its two-sided Clopper-Pearson (exact binomial) interval."""
    if n <= 0:
        raise ValueError("rate_interval needs n >= 1")
    alpha = 1 - confidence
    low = 0.0 if k == 0 else beta_quantile(alpha / 2, k, n - k + 1)
    high = 1.0 if k == n else beta_quantile(1 - alpha / 2, k + 1, n - k)
    return Interval(k / n, low, high, n)


def judge_effect(spec: Spec, values: list[float]) -> tuple[str, Interval | None]:
    """The verdict of a declared claim from its per-seed effects (finite values only)."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return NOT_JUDGED, None
    iv = t_interval(values)
    low_ok, high_ok = spec.passes(iv.low), spec.passes(iv.high)
    if low_ok and high_ok:
        return HOLDS, iv
    if not low_ok and not high_ok:
        return FAILS, iv
    return INCONCLUSIVE, iv


def judge_rate(held: list[bool]) -> tuple[str, Interval | None]:
    """The verdict of an undeclared claim from whether it held at each judged seed."""
    if not held:
        return NOT_JUDGED, None
    iv = rate_interval(sum(held), len(held))
    if iv.low > 0.5:
        return HOLDS, iv
    if iv.high < 0.5:
        return FAILS, iv
    return INCONCLUSIVE, iv


# --- distributions (no scipy dependency: the regularized incomplete beta by continued fraction) --

def _betacf(a: float, b: float, x: float) -> float:
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def beta_quantile(p: float, a: float, b: float) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if betainc(a, b, mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    if not 0.0 < p < 1.0:
        raise ValueError("t_quantile needs 0 < p < 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2

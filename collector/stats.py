"""Statistics for the table: a sample's size, mean and std (`Summary`), a closed-form 95% interval for a ratio of
means, and whether that interval lies above or below 1."""
from __future__ import annotations

import math
from typing import Optional, Sequence

MeanStd = tuple[Optional[float], Optional[float]]
Summary = tuple[int, Optional[float], Optional[float]]  # n, mean, sample std (mean_std) of a sample
NONE: Summary = (0, None, None)


def mean_std(xs: Sequence[float]) -> MeanStd:
    """Mean and sample standard deviation (ddof=1); std is None below two samples."""
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def summary(xs: Sequence[float]) -> Summary:
    """A sample's size, mean and sample std."""
    return (len(xs), *mean_std(xs))


def t_quantile(q: float, df: float) -> float:
    """Student t quantile: what scipy.stats.t.ppf(q, df) gives, for 0 < q < 1 and df > 0 (t.ppf is
    special.stdtrit; scipy.stats alone takes a second to load). Loaded on first use: the readers of request
    lines need mean_std only."""
    from scipy import special

    return float(special.stdtrit(df, q))


def ratio_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float | None, float | None]:
    """Interval for mean(a)/mean(b): delta method on the log ratio with Welch–Satterthwaite degrees
    of freedom. Closed form, so the same data always gives the same interval."""
    return ratio_ci_of(mean_std(a), len(a), mean_std(b), len(b), level)


def ratio_ci_of(a: MeanStd, na: int, b: MeanStd, nb: int,
                level: float = 0.95) -> tuple[float | None, float | None]:
    """ratio_ci from each sample's mean_std and size, for samples whose figures are already worked out."""
    (ma, sa), (mb, sb) = a, b
    if ma is None or mb is None or sa is None or sb is None or ma <= 0 or mb <= 0:
        return None, None
    va = sa ** 2 / (na * ma ** 2)  # squared relative standard errors
    vb = sb ** 2 / (nb * mb ** 2)
    se = math.sqrt(va + vb)
    ratio = ma / mb
    if se == 0:
        return ratio, ratio
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    t = t_quantile(0.5 + level / 2, df)
    return ratio * math.exp(-t * se), ratio * math.exp(t * se)


def summary_ratio_ci(a: Summary, b: Summary) -> tuple[float | None, float | None]:
    """ratio_ci of two samples, from their summaries."""
    return ratio_ci_of(a[1:], a[0], b[1:], b[0])


def significant(lo: float | None, hi: float | None) -> str:
    """Whether a ratio's interval lies above 1 (faster), below (slower) or spans it (no); blank without one."""
    if lo is None or hi is None:
        return ""
    return "faster" if lo > 1 else ("slower" if hi < 1 else "no")

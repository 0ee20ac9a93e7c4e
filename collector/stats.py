"""Statistics for the table: sample mean/std and a closed-form 95% interval for a ratio of means."""
from __future__ import annotations

import math
from typing import Sequence

from scipy import stats


def mean_std(xs: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1); std is None below two samples."""
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def ratio_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float | None, float | None]:
    """Interval for mean(a)/mean(b): delta method on the log ratio with Welch–Satterthwaite degrees
    of freedom. Closed form, so the same data always gives the same interval."""
    ma, sa = mean_std(a)
    mb, sb = mean_std(b)
    if ma is None or mb is None or sa is None or sb is None or ma <= 0 or mb <= 0:
        return None, None
    va = sa ** 2 / (len(a) * ma ** 2)  # squared relative standard errors
    vb = sb ** 2 / (len(b) * mb ** 2)
    se = math.sqrt(va + vb)
    ratio = ma / mb
    if se == 0:
        return ratio, ratio
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t = float(stats.t.ppf(0.5 + level / 2, df))
    return ratio * math.exp(-t * se), ratio * math.exp(t * se)

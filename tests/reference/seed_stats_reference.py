"""The outside reference for rtrain report's seed statistics (src/report/seeds.rs).

Reads {"groups": {NAME: [values, ...]}, "pairs": [[A, B], ...]} and prints, as JSON, per
group the mean, sample standard deviation and SciPy's 95% Student-t interval of the mean
(`scipy.stats.t.interval`), and per pair Welch's test (`scipy.stats.ttest_ind(A, B,
equal_var=False)`: statistic, degrees of freedom, two-sided p-value, 95% interval of the
difference of means).

    python seed_stats_reference.py VALUES.json
"""

import json
import sys

import numpy as np
from scipy import stats


def main():
    given = json.load(open(sys.argv[1]))
    groups = {}
    for name, values in given["groups"].items():
        values = np.asarray(values, dtype=np.float64)
        mean, sd = values.mean(), values.std(ddof=1)
        if sd == 0:
            # Seeds that agree exactly (a metric on a small split): the interval of a sample
            # without spread is its mean; SciPy's t.interval refuses scale 0 with NaN.
            low = high = mean
        else:
            low, high = stats.t.interval(0.95, df=len(values) - 1, loc=mean, scale=sd / np.sqrt(len(values)))
        groups[name] = {"mean": mean, "sd": sd, "ci_low": low, "ci_high": high}
    pairs = []
    for a, b in given["pairs"]:
        result = stats.ttest_ind(given["groups"][a], given["groups"][b], equal_var=False)
        interval = result.confidence_interval(0.95)
        pairs.append({"t": result.statistic, "df": result.df, "p": result.pvalue,
                      "ci_low": interval.low, "ci_high": interval.high})
    print(json.dumps(finite_or_named({"groups": groups, "pairs": pairs})))


def finite_or_named(value):
    """Numbers as JSON numbers, except NaN and infinities (Welch's test of two groups without
    spread), which JSON cannot hold: those as the strings "NaN", "inf", "-inf"."""
    if isinstance(value, dict):
        return {key: finite_or_named(v) for key, v in value.items()}
    if isinstance(value, list):
        return [finite_or_named(v) for v in value]
    value = float(value)
    return value if np.isfinite(value) else ("NaN" if np.isnan(value) else ("inf" if value > 0 else "-inf"))


if __name__ == "__main__":
    main()

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
        low, high = stats.t.interval(0.95, df=len(values) - 1, loc=mean, scale=sd / np.sqrt(len(values)))
        groups[name] = {"mean": mean, "sd": sd, "ci_low": low, "ci_high": high}
    pairs = []
    for a, b in given["pairs"]:
        result = stats.ttest_ind(given["groups"][a], given["groups"][b], equal_var=False)
        interval = result.confidence_interval(0.95)
        pairs.append({"t": result.statistic, "df": result.df, "p": result.pvalue,
                      "ci_low": interval.low, "ci_high": interval.high})
    print(json.dumps({"groups": groups, "pairs": pairs}, default=float))


if __name__ == "__main__":
    main()

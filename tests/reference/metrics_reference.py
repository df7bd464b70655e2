"""The outside reference for rtrain's evaluation metrics (src/metrics.rs).

Reads {"labels": [...], "probabilities": [[...], ...], "num_classes": C} and prints, as JSON,
scikit-learn's metrics on the same predictions (with labels=range(C), so that every class
counts), the expected calibration error by a short NumPy implementation of its standard
definition (Guo et al. 2017: 15 equal-width bins of the top probability), and SciPy's
percentile bootstrap intervals (95%, 1000 resamples) of top-1, macro-F1, balanced accuracy
and quadratic kappa (unless the input says "bootstrap": false).

    python metrics_reference.py PREDICTIONS.json
"""

import json
import sys

import numpy as np
from scipy import stats
from sklearn import metrics


def ece(labels, probabilities, bins=15):
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    total = 0.0
    for b in range(bins):
        lower, upper = b / bins, (b + 1) / bins
        inside = (confidence > lower) & (confidence <= upper)
        if b == 0:
            inside |= confidence == 0.0
        if inside.any():
            total += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    return total


def main(path):
    given = json.load(open(path))
    y = np.array(given["labels"])
    p = np.array(given["probabilities"], dtype=np.float64)
    classes = list(range(given["num_classes"]))
    pred = p.argmax(axis=1)
    precision, recall, f1, support = metrics.precision_recall_fscore_support(
        y, pred, labels=classes, zero_division=0
    )
    auc = []
    for c in classes:
        positive = y == c
        auc.append(metrics.roc_auc_score(positive, p[:, c]) if 0 < positive.sum() < len(y) else None)

    def headline(indices):
        yy, pp = y[indices], pred[indices]
        return (
            metrics.accuracy_score(yy, pp),
            metrics.f1_score(yy, pp, labels=classes, average="macro", zero_division=0),
            metrics.balanced_accuracy_score(yy, pp),
            metrics.cohen_kappa_score(yy, pp, labels=classes, weights="quadratic"),
        )

    def statistic(indices, which):
        return headline(indices.astype(int))[which]

    intervals = {}
    names = ["top1", "macro_f1", "balanced_accuracy", "quadratic_kappa"] if given.get("bootstrap", True) else []
    for which, name in enumerate(names):
        result = stats.bootstrap(
            (np.arange(len(y)),),
            lambda i, which=which: statistic(i, which),
            vectorized=False,
            n_resamples=1000,
            method="percentile",
            confidence_level=0.95,
            random_state=np.random.default_rng(0),
        )
        intervals[name] = [result.confidence_interval.low, result.confidence_interval.high]

    print(json.dumps({
        "top1": metrics.accuracy_score(y, pred),
        "top_k": {k: metrics.top_k_accuracy_score(y, p, k=k, labels=classes) for k in range(2, min(5, len(classes)) + 1)},
        "precision": precision.tolist(),
        "recall": recall.tolist(),
        "f1": f1.tolist(),
        "support": support.tolist(),
        "macro_f1": metrics.f1_score(y, pred, labels=classes, average="macro", zero_division=0),
        "weighted_f1": metrics.f1_score(y, pred, labels=classes, average="weighted", zero_division=0),
        "balanced_accuracy": metrics.balanced_accuracy_score(y, pred),
        "log_loss": metrics.log_loss(y, p, labels=classes),
        "cohen_kappa": metrics.cohen_kappa_score(y, pred, labels=classes),
        "quadratic_kappa": metrics.cohen_kappa_score(y, pred, labels=classes, weights="quadratic"),
        "mean_rank_error": metrics.mean_absolute_error(y, pred),
        "roc_auc": auc,
        "ece": ece(y, p),
        "intervals": intervals,
    }))


if __name__ == "__main__":
    main(sys.argv[1])

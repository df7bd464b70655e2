"""The outside reference for rtrain's evaluation metrics (src/metrics.rs).

Reads {"labels": [...], "probabilities": [[...], ...], "num_classes": C, "resamples": [[...], ...]}
and prints, as JSON, scikit-learn's metrics on the same predictions (with labels=range(C), so
that every class counts), torchmetrics' expected calibration error (its top-label
MulticlassCalibrationError: 15 equal-width bins, L1, as Guo et al. 2017 define it), and the
percentile bootstrap intervals (95%) of top-1, macro-F1, balanced accuracy and quadratic kappa
over the given resamples (each a list of image indices; optional): scikit-learn's metric on
each, then NumPy's 2.5th and 97.5th percentiles (linear interpolation, as SciPy's
`bootstrap(method="percentile")` takes them), a resample whose metric is undefined left out.

    python metrics_reference.py PREDICTIONS.json
"""

import json
import sys

import numpy as np
import torch
from sklearn import metrics
from torchmetrics.functional.classification import multiclass_calibration_error


def ece(labels, probabilities, bins=15):
    return multiclass_calibration_error(
        torch.from_numpy(probabilities), torch.from_numpy(labels), num_classes=probabilities.shape[1], n_bins=bins, norm="l1"
    ).item()


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

    names = ["top1", "macro_f1", "balanced_accuracy", "quadratic_kappa"]
    draws = np.array([headline(np.array(indices, dtype=int)) for indices in given.get("resamples", [])])
    intervals = {}
    for which, name in enumerate(names if len(draws) else []):
        values = draws[:, which][np.isfinite(draws[:, which])]
        intervals[name] = np.percentile(values, [2.5, 97.5]).tolist()

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

"""The outside reference for rtrain's calibration (src/calibration.rs): temperature scaling,
the scores of calibrated probabilities, and split-conformal prediction sets.

Reads one JSON object on standard input and writes one JSON object on standard output; the mode
says which question it answers. Numbers go both ways as JSON floats (Rust's and Python's
printing round-trip f64 exactly). Labels are class indices 0..C-1, C being the number of
columns.

    python calibration_reference.py --mode temperature < IN.json
        IN:  {"logits": [[...], ...], "labels": [...], "apply_to": [[...], ...] (optional)}
        OUT: {"temperature": T,            scikit-learn 1.9's CalibratedClassifierCV(
                                           method="temperature") fitted on the logits
              "probabilities": [[...]],    its calibrated probabilities of `apply_to` (default:
                                           the fitted logits)
              "netcal": {"temperature": T, "probabilities": [[...]]}}
                                           netcal 1.4's TemperatureScaling (method "mle") fitted
                                           on softmax(logits); netcal calls the factor it
                                           multiplies log-probabilities by "temperature", which
                                           is 1/T in Guo et al.'s (and scikit-learn's) sense:
                                           T here is 1 / netcal's.

    python calibration_reference.py --mode metrics < IN.json
        IN:  {"probabilities": [[...]], "labels": [...], "quantiles": [0.95, ...] (optional)}
        OUT: {"log_loss": sklearn.metrics.log_loss(labels=range(C)),
              "brier": brier_score_loss(labels=range(C)) with its default scale_by_half="auto"
                       (halved for C = 2 only),
              "brier_unscaled": the same with scale_by_half=False (the sum over classes, C >= 2),
              "entropy": [scipy.stats.entropy of each row, in nats],
              "entropy_quantiles": [numpy.quantile(entropies, q) for q in quantiles]}

    python calibration_reference.py --mode conformal < IN.json
        IN:  {"calibration": {"probabilities": [[...]], "labels": [...]},
              "test": {"probabilities": [[...]]},
              "alphas": [0.1, 0.05], "method": "lac" | "aps",
              "uniforms": [...] (optional, APS only: the uniform draws of APS's randomised
                         calibration scores, one per calibration image; without it MAPIE draws
                         its own from numpy's global generator)}
        OUT: {"results": [{"alpha": a,
                           "threshold": MAPIE's quantile of the conformity scores,
                           "sets": [[true|false per class] per test image]}, ...]}
             MAPIE 1.6's SplitConformalClassifier(prefit=True, confidence_level=1 - alpha,
             conformity_score=method) with an estimator whose predict_proba returns the given
             probabilities, conformalized on the calibration images; the sets are predict_set's
             with its defaults (for APS, include_last_label=True).

Errors (bad input, a library refusing) exit non-zero with the message on standard error.
"""

import argparse
import json
import sys
from decimal import Decimal

import numpy as np


def fail(message):
    print(f"calibration_reference.py: {message}", file=sys.stderr)
    sys.exit(2)


def softmax(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def temperature(given):
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.frozen import FrozenEstimator

    logits = np.asarray(given["logits"], dtype=np.float64)
    labels = np.asarray(given["labels"])
    apply_to = np.asarray(given.get("apply_to", given["logits"]), dtype=np.float64)
    classes = logits.shape[1]
    if classes < 2:
        fail("temperature needs at least 2 classes")

    class Logits(ClassifierMixin, BaseEstimator):
        """A fitted classifier whose features are its own logits: decision_function returns
        them, which CalibratedClassifierCV prefers over predict_proba. With two classes
        scikit-learn expects a 1-D decision value x and builds the logits (-x, x); half the
        logit difference gives the same softmax."""

        def fit(self, X, y):
            self.classes_ = np.arange(classes)
            return self

        def decision_function(self, X):
            X = np.asarray(X, dtype=np.float64)
            return (X[:, 1] - X[:, 0]) / 2 if classes == 2 else X

        def predict_proba(self, X):
            return softmax(np.asarray(X, dtype=np.float64))

        def predict(self, X):
            return np.asarray(X).argmax(axis=1)

    frozen = FrozenEstimator(Logits().fit(logits, labels))
    calibrated = CalibratedClassifierCV(frozen, method="temperature").fit(logits, labels)
    (pair,) = calibrated.calibrated_classifiers_
    (scaler,) = pair.calibrators
    result = {
        "temperature": float(1.0 / scaler.beta_),
        "probabilities": calibrated.predict_proba(apply_to).tolist(),
    }

    from netcal.scaling import TemperatureScaling

    netcal = TemperatureScaling(method="mle")
    netcal.fit(softmax(logits), labels)
    result["netcal"] = {
        "temperature": float(1.0 / np.asarray(netcal.temperature).item()),
        "probabilities": np.asarray(netcal.transform(softmax(apply_to))).tolist(),
    }
    return result


def metrics(given):
    from scipy import stats
    from sklearn.metrics import brier_score_loss, log_loss

    probabilities = np.asarray(given["probabilities"], dtype=np.float64)
    labels = np.asarray(given["labels"])
    classes = list(range(probabilities.shape[1]))
    entropies = stats.entropy(probabilities, axis=1)
    return {
        "log_loss": log_loss(labels, probabilities, labels=classes),
        "brier": brier_score_loss(labels, probabilities, labels=classes),
        "brier_unscaled": brier_score_loss(labels, probabilities, labels=classes, scale_by_half=False),
        "entropy": entropies.tolist(),
        "entropy_quantiles": [float(np.quantile(entropies, q)) for q in given.get("quantiles", [])],
    }


class GivenUniforms(np.random.RandomState):
    """A generator whose one call of uniform(size=n) returns the given draws: how MAPIE's APS
    is handed the calibration draws rtrain made. Any other use fails, so that a MAPIE that drew
    more (or differently) than this script expects cannot pass unnoticed."""

    def __init__(self, uniforms):
        super().__init__(0)
        self.uniforms = np.asarray(uniforms, dtype=np.float64)
        self.calls = 0

    def uniform(self, low=0.0, high=1.0, size=None):
        self.calls += 1
        if self.calls > 1 or (low, high) != (0.0, 1.0) or size != len(self.uniforms):
            fail(f"MAPIE drew uniform(low={low}, high={high}, size={size}), call {self.calls}: "
                 f"this script hands it one draw of size {len(self.uniforms)}")
        return self.uniforms.copy()


def conformal(given):
    import warnings

    from mapie.classification import SplitConformalClassifier
    from sklearn.base import BaseEstimator, ClassifierMixin

    calibration = np.asarray(given["calibration"]["probabilities"], dtype=np.float64)
    labels = np.asarray(given["calibration"]["labels"])
    test = np.asarray(given["test"]["probabilities"], dtype=np.float64)
    classes = calibration.shape[1]
    method = given["method"]
    if method not in ("lac", "aps"):
        fail(f"method must be lac or aps, not {method!r}")

    class Given(ClassifierMixin, BaseEstimator):
        """A fitted classifier whose features are its own probabilities."""

        def fit(self, X, y):
            self.classes_ = np.arange(classes)
            return self

        def predict_proba(self, X):
            return np.asarray(X, dtype=np.float64)

        def predict(self, X):
            return np.asarray(X).argmax(axis=1)

    estimator = Given().fit(calibration, labels)
    results = []
    for alpha in given["alphas"]:
        # MAPIE turns confidence_level back into alpha with decimals, so 1 - 0.1 gives 0.1.
        confidence_level = float(Decimal(1) - Decimal(str(alpha)))
        uniforms = given.get("uniforms")
        random_state = GivenUniforms(uniforms) if uniforms is not None else None
        mapie = SplitConformalClassifier(
            estimator=estimator,
            confidence_level=confidence_level,
            conformity_score=method,
            prefit=True,
            random_state=random_state,
        )
        with warnings.catch_warnings():
            # "your conformalization dataset has less labels than your training dataset"
            warnings.simplefilter("ignore", UserWarning)
            mapie.conformalize(calibration, labels)
        if uniforms is not None and random_state.calls != (1 if method == "aps" else 0):
            fail(f"MAPIE drew {random_state.calls} times from the given uniforms")
        _, sets = mapie.predict_set(test)
        results.append({
            "alpha": alpha,
            "threshold": float(np.asarray(mapie._mapie_classifier.quantiles_).ravel()[0]),
            "sets": sets[:, :, 0].tolist(),
        })
    return {"results": results}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", required=True, choices=["temperature", "metrics", "conformal"])
    mode = parser.parse_args().mode
    given = json.load(sys.stdin)
    answer = {"temperature": temperature, "metrics": metrics, "conformal": conformal}[mode](given)
    json.dump(answer, sys.stdout)
    print()


if __name__ == "__main__":
    main()

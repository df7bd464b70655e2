"""Reference results for tests/optim_reference.rs: torch.optim.lr_scheduler.ReduceLROnPlateau
on fixed sequences of validation metrics.

For each case, steps the scheduler once per "epoch" with the case's metric and records the
learning rate after each step. Writes OUT/plateau.json: {case: {"params": {...}, "metrics":
[...], "lr": [...]}}.

Usage: python plateau_reference.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch

LOSSES = [1.0, 0.9, 0.9, 0.89995, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.7, 0.7, 0.7, 0.6999,
          0.71, 0.72, 0.73, 0.74, 0.75, 0.76, 0.77, 0.78, 0.79, 0.8, 0.81, 0.82, 0.83, 0.84, 0.85]
TOP1 = [0.30, 0.40, 0.40, 0.4003, 0.41, 0.405, 0.40, 0.39, 0.45, 0.45, 0.46, 0.455, 0.44, 0.43,
        0.42, 0.47, 0.47, 0.47, 0.47, 0.47]

CASES = {
    # The DesignSafe tutorial's scheduler.
    "tutorial": {"lr": 1e-4, "mode": "min", "factor": 0.1, "patience": 5, "threshold": 1e-4,
                 "threshold_mode": "rel", "cooldown": 0, "min_lr": 1e-8, "metrics": LOSSES},
    "min_abs_cooldown": {"lr": 0.1, "mode": "min", "factor": 0.5, "patience": 1, "threshold": 0.05,
                         "threshold_mode": "abs", "cooldown": 2, "min_lr": 0.01, "metrics": LOSSES},
    "max_rel": {"lr": 0.05, "mode": "max", "factor": 0.5, "patience": 2, "threshold": 0.01,
                "threshold_mode": "rel", "cooldown": 0, "min_lr": 0.0, "metrics": TOP1},
    "max_abs_patience_0": {"lr": 0.02, "mode": "max", "factor": 0.3, "patience": 0, "threshold": 0.005,
                           "threshold_mode": "abs", "cooldown": 1, "min_lr": 1e-4, "metrics": TOP1},
}


def main(out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, case in CASES.items():
        params = {k: v for k, v in case.items() if k not in ("lr", "metrics")}
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=case["lr"])
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **params)
        lrs = []
        for metric in case["metrics"]:
            scheduler.step(metric)
            lrs.append(optimizer.param_groups[0]["lr"])
        results[name] = {"params": {**params, "lr": case["lr"]}, "metrics": case["metrics"], "lr": lrs}
        assert min(lrs) < case["lr"], f"{name}: the reference must reduce the learning rate"
    (out_dir / "plateau.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

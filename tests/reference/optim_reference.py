"""Reference results for tests/optim_reference.rs, made with torch.optim on the same libtorch.

For each case, builds a few parameters, feeds them fixed random gradients for several steps
with the learning rate of torch's LinearLR warm-up followed by CosineAnnealingLR (SequentialLR),
and writes OUT/<case>.safetensors with:
    param.<i>        the initial parameters
    grad.<s>.<i>     the gradient given at step s
    lr               the learning rate used at each step (float64)
    expected.<i>     the parameters after the last step
and the case's hyper-parameters as JSON in the metadata under "case".

Usage: python optim_reference.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

STEPS = 8
STEPS_PER_EPOCH = 2
EPOCHS = 4
SCHEDULE = {"warmup_epochs": 1.0, "warmup_start_factor": 0.1, "min_lr": 0.0}

CASES = {
    "sgd_plain": {"name": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0},
    "sgd_momentum": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 1e-4},
    "sgd_nesterov": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4},
    "adam": {"name": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
    "adamw": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
}


def optimizer_for(case, params):
    if case["name"] == "sgd":
        return torch.optim.SGD(params, lr=case["lr"], momentum=case["momentum"],
                               nesterov=case["nesterov"], weight_decay=case["weight_decay"])
    adam = torch.optim.Adam if case["name"] == "adam" else torch.optim.AdamW
    return adam(params, lr=case["lr"], betas=tuple(case["betas"]), eps=case["eps"],
                weight_decay=case["weight_decay"])


def main(out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, case in CASES.items():
        torch.manual_seed(0)
        shapes = [(4, 3), (5,), (2, 2, 3)]
        params = [torch.randn(s, dtype=torch.float32, requires_grad=True) for s in shapes]
        tensors = {f"param.{i}": p.detach().clone() for i, p in enumerate(params)}
        optimizer = optimizer_for(case, params)
        warmup = int(round(SCHEDULE["warmup_epochs"] * STEPS_PER_EPOCH))
        total = STEPS_PER_EPOCH * EPOCHS
        scheduler = torch.optim.lr_scheduler.SequentialLR(
            optimizer,
            [torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=SCHEDULE["warmup_start_factor"],
                                               end_factor=1.0, total_iters=warmup),
             torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total - warmup,
                                                        eta_min=SCHEDULE["min_lr"])],
            milestones=[warmup])
        lrs = []
        for step in range(STEPS):
            optimizer.zero_grad()
            for i, p in enumerate(params):
                g = torch.randn(p.shape, dtype=torch.float32)
                tensors[f"grad.{step}.{i}"] = g
                p.grad = g.clone()
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        for i, p in enumerate(params):
            tensors[f"expected.{i}"] = p.detach().clone()
        tensors["lr"] = torch.tensor(lrs, dtype=torch.float64)
        meta = dict(case, steps=STEPS, steps_per_epoch=STEPS_PER_EPOCH, epochs=EPOCHS, **SCHEDULE)
        save_file(tensors, str(out_dir / f"{name}.safetensors"), metadata={"case": json.dumps(meta)})
    print(f"wrote {len(CASES)} cases to {out_dir} with torch {torch.__version__}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""The references of rtrain's class-imbalance choices (tests/training_choices.rs).

  imbalance_reference.py class-weights TREE
      scikit-learn's compute_class_weight("balanced") over the class folders of the image tree
      TREE (torchvision's ImageFolder order: sorted names), printed as a JSON list.

  imbalance_reference.py loss IN.safetensors OUT.safetensors SMOOTHING
      torch.nn.CrossEntropyLoss(weight=weights, label_smoothing=SMOOTHING) of IN's `logits`
      (N x C, float64) and `labels` (N, int64), with IN's `weights` (C): writes the loss and
      its gradient with respect to the logits to OUT, as `loss` and `grad`.
"""

import json
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from sklearn.utils.class_weight import compute_class_weight
from torchvision.datasets import ImageFolder


def class_weights(tree):
    folder = ImageFolder(tree)
    labels = np.array(folder.targets)
    classes = np.arange(len(folder.classes))
    print(json.dumps(compute_class_weight("balanced", classes=classes, y=labels).tolist()))


def loss(source, target, smoothing):
    tensors = load_file(source)
    logits = tensors["logits"].clone().requires_grad_(True)
    criterion = torch.nn.CrossEntropyLoss(weight=tensors["weights"], label_smoothing=smoothing)
    value = criterion(logits, tensors["labels"])
    value.backward()
    save_file({"loss": value.detach().reshape(1), "grad": logits.grad}, target)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "class-weights":
        class_weights(sys.argv[2])
    elif command == "loss":
        loss(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(f"unknown command {command!r}")

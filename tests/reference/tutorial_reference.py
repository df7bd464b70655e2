"""The DesignSafe tutorial's recipe in PyTorch, for rtrain's end-to-end and one-step tests.

Usage:
  python tutorial_reference.py tree OUT PER_CLASS
      OUT/{Train,Validation}/{C0,C2,C4}/*.jpg: camera-like JPEGs of mixed sizes and aspect
      ratios (PER_CLASS per class in Train, half as many in Validation), seeded.
  python tutorial_reference.py weights OUT_DIR {imagenet|head}
      torch.save()s a seeded resnet34 state dict as OUT_DIR/resnet34-<sha256[:8]>.pth (torch.hub's
      naming) and prints the file name: `imagenet` with torchvision's 1000-class fc, `head` with
      the tutorial's nn.Sequential(Linear(512, 512), ReLU(), Linear(512, 3)).
  python tutorial_reference.py step WEIGHTS.pth DATA SIZE OUT.safetensors
      One training step of the tutorial's model, loss and optimizer on every image of
      DATA/Train at once (Resize((SIZE, SIZE)), ToTensor, no augmentation): train mode,
      CrossEntropyLoss(label_smoothing=0.1), Adam(lr=1e-4). Writes the state dict after the step
      to OUT and prints {"loss": ...}.
  python tutorial_reference.py predict WEIGHTS.safetensors SIZE IMAGE...
      The tutorial's model (3 classes, MLP head) from rtrain's export, strictly loaded, in eval
      mode on Resize((SIZE, SIZE)) + ToTensor of each image: prints the softmax per image as JSON.
"""
import hashlib
import json
import os
import random
import sys

import torch
import torchvision
from PIL import Image
from safetensors.torch import load_file, save_file
from torchvision import datasets, transforms

CLASSES = ["C0", "C2", "C4"]


def tutorial_model(num_classes=3):
    model = torchvision.models.resnet34(weights=None)
    model.fc = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, num_classes))
    return model


def tree(out, per_class):
    rng = random.Random(16)
    sizes = [(160, 120), (120, 160), (200, 112), (96, 96), (150, 100)]
    for split, count in [("Train", per_class), ("Validation", max(1, per_class // 2))]:
        for label, name in enumerate(CLASSES):
            os.makedirs(os.path.join(out, split, name), exist_ok=True)
            for i in range(count):
                w, h = sizes[rng.randrange(len(sizes))]
                image = Image.new("RGB", (w, h))
                base = [rng.randrange(256) for _ in range(3)]
                pixels = image.load()
                for y in range(h):
                    for x in range(w):
                        shade = (x * (label + 1) + y * (3 - label)) % 64
                        pixels[x, y] = tuple((b + shade + rng.randrange(24)) % 256 for b in base)
                image.save(os.path.join(out, split, name, f"{name}_{i:03d}.jpg"), quality=90)


def weights(out_dir, kind):
    torch.manual_seed(34)
    model = torchvision.models.resnet34(weights=None) if kind == "imagenet" else tutorial_model()
    model.train()
    with torch.no_grad():  # running statistics that are not just zeros and ones
        model(torch.rand(4, 3, 64, 64))
    temporary = os.path.join(out_dir, "unnamed.pth")
    torch.save(model.state_dict(), temporary)
    with open(temporary, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    name = f"resnet34-{digest[:8]}.pth"
    os.replace(temporary, os.path.join(out_dir, name))
    print(name)


def step(weights_path, data, size, out):
    size = int(size)
    model = tutorial_model()
    model.load_state_dict(torch.load(weights_path, weights_only=True), strict=True)
    model.train()
    transform = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor()])
    dataset = datasets.ImageFolder(os.path.join(data, "Train"), transform=transform)
    images = torch.stack([image for image, _ in dataset])
    labels = torch.tensor([label for _, label in dataset])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out)
    print(json.dumps({"loss": loss.item()}))


def predict(weights_path, size, images):
    size = int(size)
    model = tutorial_model()
    model.load_state_dict(load_file(weights_path), strict=True)
    model.eval()
    transform = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor()])
    batch = torch.stack([transform(Image.open(path).convert("RGB")) for path in images])
    with torch.no_grad():
        probabilities = model(batch).softmax(-1)
    print(json.dumps({path: row.tolist() for path, row in zip(images, probabilities)}))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "tree":
        tree(args[0], int(args[1]))
    elif command == "weights":
        weights(*args)
    elif command == "step":
        step(*args)
    elif command == "predict":
        predict(args[0], args[1], args[2:])
    else:
        sys.exit(f"unknown command {command!r}")

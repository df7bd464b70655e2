"""PyTorch's own answer to `rtrain bench agree`: how far one training step on a GPU lands from
the same step on the CPU, with cuDNN's TF32 convolutions on (PyTorch's default) and off.

    python3 bench/agree_reference.py [--arch resnet18] [--image-size 64] [--batch-size 8] [--seeds 5]

One step as rtrain's bench takes it: torchvision's model in train mode, cross-entropy, backward,
SGD (lr 0.01, momentum 0.9, weight decay 5e-4), from the same initial weights and batch on
both devices. Prints one JSON line per (seed, TF32 setting) with the loss's relative
difference, the logits' largest absolute difference and ||dw_gpu - dw_cpu|| / ||dw_cpu||, the
quantity rtrain's `update_relative_difference` is."""
import argparse
import copy
import json

import torch
import torchvision


def step(model, images, labels, device):
    model = copy.deepcopy(model).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    logits = model(images.to(device))
    loss = torch.nn.functional.cross_entropy(logits, labels.to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    weights = [p.detach().cpu().double() for p in model.parameters()]
    return loss.item(), logits.detach().cpu().float(), weights


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = getattr(torchvision.models, args.arch)(num_classes=10)
        images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
        labels = torch.randint(10, (args.batch_size,))
        initial = [p.detach().double() for p in model.parameters()]
        loss_cpu, logits_cpu, weights_cpu = step(model, images, labels, "cpu")
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            loss_gpu, logits_gpu, weights_gpu = step(model, images, labels, "cuda")
            difference = sum(((b - a) ** 2).sum() for a, b in zip(weights_cpu, weights_gpu))
            update = sum(((a - w0) ** 2).sum() for a, w0 in zip(weights_cpu, initial))
            print(json.dumps({
                "framework": "pytorch", "arch": args.arch, "seed": seed, "tf32": tf32,
                "loss_relative_difference": abs(loss_gpu - loss_cpu) / abs(loss_cpu),
                "logits_max_abs_difference": (logits_gpu - logits_cpu).abs().max().item(),
                "update_relative_difference": (difference / update).sqrt().item(),
            }))


if __name__ == "__main__":
    main()

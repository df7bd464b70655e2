"""The case study's training script, ported to this machine (CPU, gloo, started by mpirun).

The original is the Chishiki-AI "cnn-course" (TACC) file scaling_part3/torch_train_distributed.py
(github.com/chishiki-ai/cnn-course, commit 6f66c0ee), launched there by
scaling_part3/run_distributed.sh: `mpirun -np NODES -ppn 1 run_distributed.sh`, which runs
`apptainer exec --nv <sif> torchrun --nproc_per_node 4 --nnodes NODES --node_rank $PMI_RANK
--master_addr <first host> --master_port 1234 torch_train_distributed.py` on each node. This port
keeps the script's functions, calls and order (load_datasets, construct_dataloaders, getResNet,
eval_model, train, load_checkpoint, load_model_fm_checkpoint, init_distributed, cleanup, main) and
its quirks, and changes only what this machine needs:

* Launch: mpirun starts the ranks directly (no torchrun). RANK, WORLD_SIZE and LOCAL_RANK, which
  the script reads from torchrun's environment, are taken from Open MPI's OMPI_COMM_WORLD_RANK,
  OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_RANK; MASTER_ADDR defaults to 127.0.0.1 and
  MASTER_PORT to 29500 (bench/compare_tutorial.py passes a free port).
* Device: CPU. `init_process_group(backend="gloo")` instead of "nccl" (the script's own comment
  names gloo for CPUs), no torch.cuda.set_device, no .cuda()/.to(cuda), DistributedDataParallel
  without device_ids, and the CUDA_VISIBLE_DEVICES line and the torch.cuda.empty_cache loop
  dropped.
* Threads: each rank calls torch.set_num_threads(cores // ranks) (at least 1), cores being the
  CPUs this process may run on; the script sets nothing (on its GPUs the CPU threads only fed
  the device). The DataLoader workers run with 1 thread each (PyTorch's default in workers).
* SyncBatchNorm: not converted. In torch 2.13 DistributedDataParallel refuses a model with
  SyncBatchNorm layers on the CPU ("SyncBatchNorm layers only work with GPU modules", checked
  under gloo at world size 1), and SyncBatchNorm's forward itself refuses CPU tensors in
  training ("SyncBatchNorm expected input tensor to be on GPU or XPU or ..."), so the model
  keeps plain BatchNorm: each
  rank normalises with its own batch's statistics, and DDP broadcasts rank 0's running
  statistics before each forward (its default broadcast_buffers=True). rtrain's
  configs/designsafe-tutorial.toml keeps sync_batchnorm = true, which costs rtrain one
  all-reduce per BatchNorm layer that this port does not pay.
* Weights: `models.resnet34(weights='IMAGENET1K_V1')` downloads torchvision's file, and this
  machine has no internet. getResNet builds `models.resnet34()` and loads --weights with
  `load_state_dict(torch.load(file))` instead (tests/reference/tutorial_reference.py weights DIR
  imagenet writes a seeded stand-in named like a torch.hub file); --weights is required.
* ReduceLROnPlateau's verbose=True is dropped: torch 2.13 no longer has that argument.
* Paths and hyper-parameters: the script hard-codes hp = {"lr": 1e-4, "batch_size": 16,
  "epochs": 5} and /tmp/Dataset_2/{Train,Validation}/; --data, --epochs and --workers set them
  here (defaults: the script's 5 epochs and num_workers=4). The best model is saved, as there,
  to ./output_model/best_model.pt of the working directory (compare_tutorial.py runs each job in
  a fresh directory, so the script's resume-from-best_model.pt branch is not taken).
* The script's test loader line names an undefined `test_aset`; it is never evaluated there
  (test_path is None) and is written with test_set here.

Left as the script has them: the `conv_param.require_grad = False` loop (a typo for
requires_grad, so nothing is frozen), DataLoader(num_workers=4, pin_memory=True) for training
(pin_memory is a no-op without an accelerator; PyTorch may warn) and num_workers=4 for
validation, per-rank metrics never all-reduced (the loss of each batch divided once more by
its size, accuracy the mean of per-batch accuracies), the scheduler stepped with each rank's own
validation loss, rank 0 saving the best model when its validation accuracy improves and, at the
end, reloading it into a fresh model and evaluating it on rank 0's share of the validation set,
and only rank 0 calling destroy_process_group.

Added for the benchmark, outside what the script computes (it does not change the training):
time.perf_counter() marks around the training loop and the evaluation, counts of images, and,
after each epoch's evaluation, an all-reduce of the correct predictions and the samples over
the ranks (validation top-1 over all ranks, as rtrain reports it; DistributedSampler pads the
split to a multiple of the world size, so at 2 ranks one image may count twice). Each rank
appends these to --metrics-dir/original-rank<R>.jsonl ({"kind": "epoch", ...}, and rank 0 a
{"kind": "final", ...} record).

Usage (from the repository root, under mpirun; see bench/compare_tutorial.py for the benchmark):
    mpirun -np 2 .deps/venv/bin/python bench/tutorial_original.py train --data DATASET_DIR \
        --weights TORCH_HOME/hub/checkpoints/resnet34-XXXXXXXX.pth [--epochs 5] [--workers 4] \
        [--metrics-dir DIR]
    .deps/venv/bin/python bench/tutorial_original.py loader --data DATASET_DIR/Train \
        [--batch-size 16] [--workers 1] [--batches 10]
The loader command times the script's training input pipeline alone (ImageFolder with
AutoAugment -> Resize((244, 244)) -> ToTensor, DataLoader) as `rtrain bench loader` times its
own: a seeded permutation cycled to length, one untimed warm-up batch, img/s per worker; it
prints one JSON line.
"""
import argparse
import gc
import json
import os
import resource
import sys
import time
import warnings
from datetime import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, models, transforms

warnings.filterwarnings("ignore", message="torch.distributed._all_gather_base is a private function and will be "
                        "deprecated. Please use torch.distributed.all_gather_into_tensor instead.")

# Set by the command line (the script hard-codes them).
ARGS = None


class Instrument:
    """The benchmark's additions: per-rank timings and counts, one JSON line per record."""

    def __init__(self, metrics_dir, rank):
        self.path = os.path.join(metrics_dir, f"original-rank{rank}.jsonl") if metrics_dir else None
        self.started = time.perf_counter()

    def log(self, record):
        if self.path:
            with open(self.path, "a") as out:
                out.write(json.dumps(record) + "\n")


INSTRUMENT = None


def this_machine_environment():
    """torchrun's variables from Open MPI's (mpirun starts the ranks here)."""
    os.environ.setdefault("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    os.environ.setdefault("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ["RANK"]))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


def cores_per_rank():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // int(os.environ["WORLD_SIZE"]))


# Apply transformations to our data (as the script: AutoAugment -> Resize((244,244)) -> ToTensor
# for training, Resize((244,244)) -> ToTensor for validation, no Normalize).
def load_datasets(train_path, val_path, test_path):
    val_img_transform = transforms.Compose([transforms.Resize((244, 244)),
                                            transforms.ToTensor()])
    train_img_transform = transforms.Compose([transforms.AutoAugment(),
                                              transforms.Resize((244, 244)),
                                              transforms.ToTensor()])
    train_dataset = datasets.ImageFolder(train_path, transform=train_img_transform)
    val_dataset = datasets.ImageFolder(val_path, transform=val_img_transform)
    test_dataset = datasets.ImageFolder(test_path, transform=val_img_transform) if test_path is not None else None

    rank = int(os.environ['RANK'])
    if rank == 0:
        print(f"Train set size: {len(train_dataset)}, Validation set size: {len(val_dataset)}")
    return train_dataset, val_dataset, test_dataset


# DistributedSampler per split; the script's DataLoader arguments (4 workers, pinned training
# batches), the worker count taken from --workers (default 4).
def construct_dataloaders(train_set, val_set, test_set, batch_size, shuffle=True):
    workers = ARGS.workers
    train_sampler = DistributedSampler(dataset=train_set, shuffle=shuffle)
    val_sampler = DistributedSampler(dataset=val_set, shuffle=False)
    test_sampler = DistributedSampler(dataset=test_set, shuffle=False) if test_set is not None else None

    train_dataloader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, sampler=train_sampler,
                                                   num_workers=workers, pin_memory=True)
    val_dataloader = torch.utils.data.DataLoader(val_set, batch_size=batch_size, sampler=val_sampler,
                                                 num_workers=workers)
    test_dataloader = torch.utils.data.DataLoader(test_set, batch_size, sampler=test_sampler,
                                                  num_workers=workers) if test_set is not None else None

    return train_dataloader, val_dataloader, test_dataloader


# ResNet-34 with ImageNet weights (loaded from --weights instead of downloaded) and the
# script's MLP head.
def getResNet():
    resnet = models.resnet34()
    resnet.load_state_dict(torch.load(ARGS.weights))

    # The script's loop, kept: `require_grad` (sic) is not `requires_grad`, so nothing is frozen.
    for conv_param in resnet.parameters():
        conv_param.require_grad = False

    num_ftrs = resnet.fc.in_features
    fc = nn.Sequential(
        nn.Linear(num_ftrs, num_ftrs),
        nn.ReLU(),
        nn.Linear(num_ftrs, 3)
    )
    resnet.fc = fc
    return resnet


# Model evaluation, as the script computes it (per rank, means of per-batch values). `reduce`
# (the benchmark's addition) all-reduces the correct predictions and samples over the ranks.
@torch.no_grad()
def eval_model(data_loader, model, loss_fn, DEVICE, reduce=False):
    model.train(False)
    model.eval()
    loss, accuracy = 0.0, 0.0
    n = len(data_loader)
    correct, samples = 0, 0

    local_rank = int(os.environ['LOCAL_RANK'])  # noqa: F841 (read, unused, as in the script)

    for i, data in enumerate(data_loader):
        x, y = data
        x, y = x.to(DEVICE), y.to(DEVICE)
        pred = model(x)
        loss += loss_fn(pred, y) / len(x)
        pred_label = torch.argmax(pred, axis=1)
        accuracy += torch.sum(pred_label == y) / len(x)
        correct += int(torch.sum(pred_label == y))
        samples += len(x)

    counts = None
    if reduce:
        totals = torch.tensor([correct, samples], dtype=torch.float64)
        dist.all_reduce(totals)
        counts = (int(totals[0]), int(totals[1]))
    return loss / n, accuracy / n, counts


# Model training, the script's epoch loop.
def train(train_loader, val_loader, model, opt, scheduler, loss_fn, epoch_start, epochs, DEVICE, checkpoint_file,
          prev_best_val_acc):
    n = len(train_loader)

    local_rank = int(os.environ['LOCAL_RANK'])
    rank = int(os.environ['RANK'])

    best_val_acc = torch.tensor(0.0) if prev_best_val_acc is None else prev_best_val_acc

    for epoch in range(epoch_start, epochs):
        model.train(True)

        train_loader.sampler.set_epoch(epoch)

        avg_loss, val_loss, val_acc, avg_acc = 0.0, 0.0, 0.0, 0.0

        start_time = datetime.now()
        mark = time.perf_counter()
        images = 0

        for x, y in train_loader:
            x, y = x.to(DEVICE), y.to(DEVICE)
            pred = model(x)
            loss = loss_fn(pred, y)

            opt.zero_grad()
            loss.backward()
            opt.step()

            avg_loss += loss.item() / len(x)
            pred_label = torch.argmax(pred, axis=1)
            avg_acc += torch.sum(pred_label == y) / len(x)
            images += len(x)

        train_seconds = time.perf_counter() - mark
        val_loss, val_acc, counts = eval_model(val_loader, model, loss_fn, DEVICE, reduce=True)

        end_time = datetime.now()
        epoch_seconds = time.perf_counter() - mark

        total_time = torch.tensor((end_time - start_time).seconds)

        # Learning rate reducer takes action
        scheduler.step(val_loss)

        avg_loss, avg_acc = avg_loss / n, avg_acc / n

        INSTRUMENT.log({
            "kind": "epoch", "epoch": epoch, "rank": rank, "train_seconds": train_seconds,
            "eval_seconds": epoch_seconds - train_seconds, "epoch_seconds": epoch_seconds,
            "train_images": images, "train_loss": float(avg_loss), "train_accuracy": float(avg_acc),
            "val_loss": float(val_loss), "val_accuracy": float(val_acc),
            "val_correct_all_ranks": counts[0], "val_samples_all_ranks": counts[1],
            "lr": opt.param_groups[0]["lr"],
        })

        # Only rank 0 saves the model and prints the metrics
        if rank == 0:

            # Save the best model that has the highest val accuracy
            if val_acc.item() > best_val_acc.item():
                print(f"\nPrev Best Val Acc: {best_val_acc} < Cur Val Acc: {val_acc}")
                print("Saving the new best model...")
                torch.save({
                    'epoch': epoch,
                    'machine': local_rank,
                    'model_state_dict': model.module.state_dict(),
                    'accuracy': val_acc,
                    'loss': val_loss
                }, checkpoint_file)
                best_val_acc = val_acc
                print("Finished saving model\n")

            print(f"\n(Epoch {epoch + 1}/{epochs}) Time: {total_time}s")
            print(f"(Epoch {epoch + 1}/{epochs}) Average train loss: {avg_loss}, Average train accuracy: {avg_acc}")
            print(f"(Epoch {epoch + 1}/{epochs}) Val loss: {val_loss}, Val accuracy: {val_acc}")
            print(f"(Epoch {epoch + 1}/{epochs}) Current best val acc: {best_val_acc}\n")
            sys.stdout.flush()


def load_checkpoint(checkpoint_path, DEVICE):
    checkpoint = torch.load(checkpoint_path, map_location=DEVICE)
    return checkpoint


def load_model_fm_checkpoint(checkpoint, primitive_model):
    primitive_model.load_state_dict(checkpoint['model_state_dict'])
    return primitive_model


def init_distributed():
    dist_url = "env://"

    rank = int(os.environ["RANK"])
    world_size = int(os.environ['WORLD_SIZE'])
    dist.init_process_group(backend="gloo",  # the script: "nccl" for GPUs, "gloo" for CPUs
                            init_method=dist_url,
                            world_size=world_size,
                            rank=rank)
    torch.set_num_threads(cores_per_rank())


def cleanup():
    print("Cleaning up the distributed environment...")
    dist.destroy_process_group()
    print("Distributed environment has been properly closed")


def main():
    hp = {"lr": 1e-4, "batch_size": 16, "epochs": ARGS.epochs}
    train_path = os.path.join(ARGS.data, "Train")
    val_path = os.path.join(ARGS.data, "Validation")
    test_path = None
    rank = int(os.environ['RANK'])
    DEVICE = torch.device("cpu")

    # For saving the trained model
    model_folder_path = os.getcwd() + "/output_model/"
    os.makedirs(model_folder_path, exist_ok=True)

    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    train_set, val_set, test_set = load_datasets(train_path, val_path, test_path)
    train_dataloader, val_dataloader, test_dataloader = construct_dataloaders(train_set, val_set, test_set,
                                                                              hp["batch_size"], True)

    model = getResNet().to(DEVICE)

    # load the checkpoint that has the best performance in previous experiments
    prev_best_val_acc = None
    checkpoint_file = model_folder_path + "best_model.pt"
    if os.path.exists(checkpoint_file):
        checkpoint = load_checkpoint(checkpoint_file, DEVICE)
        prev_best_val_acc = checkpoint['accuracy']
        model = load_model_fm_checkpoint(checkpoint, model)
        epoch_start = checkpoint['epoch']
        if rank == 0:
            print(f"resuming training from epoch {epoch_start}")
    else:
        epoch_start = 0

    # The script: model = nn.SyncBatchNorm.convert_sync_batchnorm(model). Not on CPU (see the
    # docstring): DDP and SyncBatchNorm refuse it on CPU tensors.
    model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=hp["lr"])

    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode='min', factor=0.1, patience=5, min_lr=1e-8)

    train(train_dataloader, val_dataloader, model, opt, scheduler, loss_fn, epoch_start, hp["epochs"], DEVICE,
          checkpoint_file, prev_best_val_acc)

    # only rank 0 does the loading, evaluation and printing
    if rank == 0:
        mark = time.perf_counter()
        primitive_model = getResNet().to(DEVICE)
        checkpoint = load_checkpoint(checkpoint_file, DEVICE)
        best_model = load_model_fm_checkpoint(checkpoint, primitive_model)
        loss, acc, _ = eval_model(val_dataloader, best_model, loss_fn, DEVICE)
        print(f"\nBest model (val loss: {loss}, val accuracy: {acc}) has been saved to {checkpoint_file}\n")
        INSTRUMENT.log({"kind": "final", "best_epoch": int(checkpoint['epoch']), "best_val_loss": float(loss),
                        "best_val_accuracy": float(acc), "final_eval_seconds": time.perf_counter() - mark,
                        "threads": torch.get_num_threads(), "workers": ARGS.workers,
                        "seconds_since_start": time.perf_counter() - INSTRUMENT.started})
        cleanup()


def loader_bench(args):
    """The script's training input pipeline alone, timed like `rtrain bench loader`."""
    os.environ.setdefault("RANK", "0")
    torch.set_num_threads(1)
    train_set, _, _ = load_datasets(args.data, args.data, None)
    wanted = (args.batches + 1) * args.batch_size
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(train_set), generator=generator).tolist()
    order = (order * (wanted // len(order) + 1))[:wanted]
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=order,
                                         num_workers=args.workers, drop_last=True)
    batches = iter(loader)
    next(batches)
    started = time.perf_counter()
    images = 0
    for x, _ in batches:
        images += x.shape[0]
    seconds = time.perf_counter() - started
    rate = images / seconds
    print(json.dumps({
        "framework": "pytorch", "source": "image tree", "workers": args.workers, "image_size": 244,
        "images": images, "seconds": seconds, "images_per_second": rate,
        "images_per_second_per_core": rate / max(args.workers, 1),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }))


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train_cmd = commands.add_parser("train", help="the training script (under mpirun)")
    train_cmd.add_argument("--data", required=True, help="a directory with Train/ and Validation/ ImageFolders")
    train_cmd.add_argument("--weights", required=True, help="a resnet34 state dict (ImageNet's stand-in)")
    train_cmd.add_argument("--epochs", type=int, default=5)
    train_cmd.add_argument("--workers", type=int, default=4, help="DataLoader workers (the script: 4)")
    train_cmd.add_argument("--metrics-dir", help="where each rank appends original-rank<R>.jsonl")
    loader_cmd = commands.add_parser("loader", help="time the training input pipeline alone")
    loader_cmd.add_argument("--data", required=True, help="an ImageFolder split directory (DATA/Train)")
    loader_cmd.add_argument("--batch-size", type=int, default=16)
    loader_cmd.add_argument("--workers", type=int, default=1)
    loader_cmd.add_argument("--batches", type=int, default=10)
    return parser.parse_args()


if __name__ == '__main__':
    ARGS = parse()
    if ARGS.command == "loader":
        loader_bench(ARGS)
    else:
        this_machine_environment()
        INSTRUMENT = Instrument(ARGS.metrics_dir, int(os.environ["RANK"]))
        init_distributed()

        gc.collect()

        main()

"""Reads a run's TensorBoard event files with TensorBoard's own reader and prints what it
holds as JSON: every scalar as [step, value] in file order per tag, every image's step, width,
height and PNG size, and every text summary (tensor) as its string.

    python tensorboard_reader.py RUN_DIR/tensorboard
"""

import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    accumulator = event_accumulator.EventAccumulator(
        sys.argv[1], size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0,
                                    event_accumulator.TENSORS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    print(json.dumps({
        "scalars": {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)] for tag in tags["scalars"]},
        "images": {tag: [[e.step, e.width, e.height, len(e.encoded_image_string)] for e in accumulator.Images(tag)]
                   for tag in tags["images"]},
        "text": {tag: [e.tensor_proto.string_val[0].decode() for e in accumulator.Tensors(tag)]
                 for tag in tags["tensors"]},
    }))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference input pipelines for TrainDeck's data-loading figures (docs/PERFORMANCE.md): read,
decode, resize and batch an image folder (one sub-folder per class) or TFRecord shards, with no
model, and print images/s. Run in the bench environment (installer/bench.sh):

    python bench/reference_pipeline.py --folder DIR --size 64 --batch 64 --workers 2
    python bench/reference_pipeline.py --tfrecord 'DIR/train-*.tfrecord' --size 28 --gray

tf.data: image_dataset_from_directory (its own parallel decode, prefetch AUTOTUNE), or
interleave(TFRecordDataset) + map(parse_single_example, decode_image, resize) with AUTOTUNE.
PyTorch: torchvision.datasets.ImageFolder (PIL decode, Resize with bilinear and antialias off,
ToTensor) through a DataLoader with --workers worker processes (folders only; PyTorch has no
TFRecord reader). Each reader runs --passes full passes; the median is printed.
"""
import argparse
import glob
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def timed(passes, one_pass):
    rates = []
    for _ in range(passes):
        start = time.perf_counter()
        n = one_pass()
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates), min(rates), max(rates)


def images_in(batches):
    """One full pass over (images, labels) batches: how many images it gave."""
    return sum(int(x.shape[0]) for x, _ in batches)


def tf_folder(args):
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(args.workers)
    tf.config.threading.set_intra_op_parallelism_threads(args.workers)
    ds = tf.keras.utils.image_dataset_from_directory(
        args.folder, image_size=(args.size, args.size), batch_size=args.batch,
        color_mode="grayscale" if args.gray else "rgb", shuffle=False, verbose=False)
    ds = ds.prefetch(tf.data.AUTOTUNE)

    return timed(args.passes, lambda: images_in(ds))


def tf_records(args):
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(args.workers)
    tf.config.threading.set_intra_op_parallelism_threads(args.workers)
    files = sorted(glob.glob(args.tfrecord))
    spec = {"image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    channels = 1 if args.gray else 3

    def parse(r):
        e = tf.io.parse_single_example(r, spec)
        img = tf.io.decode_image(e["image"], channels=channels, expand_animations=False)
        return tf.image.resize(img, [args.size, args.size]), e["label"]
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=min(16, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(args.batch)
    ds = ds.prefetch(tf.data.AUTOTUNE)

    return timed(args.passes, lambda: images_in(ds))


def torch_folder(args):
    import torch
    from torchvision import datasets, transforms
    torch.set_num_threads(1)
    tf = [transforms.Resize((args.size, args.size),
                            interpolation=transforms.InterpolationMode.BILINEAR, antialias=False)]
    if args.gray:
        tf.insert(0, transforms.Grayscale())
    tf.append(transforms.ToTensor())
    data = datasets.ImageFolder(args.folder, transform=transforms.Compose(tf))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False,
                                         num_workers=args.workers,
                                         persistent_workers=args.workers > 0)

    return timed(args.passes, lambda: images_in(loader))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder")
    p.add_argument("--tfrecord", help="a glob pattern of shards")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--gray", action="store_true")
    p.add_argument("--frameworks", default="tf,torch")
    args = p.parse_args()
    want = args.frameworks.split(",")
    if len(want) > 1:
        # One process per framework: TensorFlow and PyTorch in one process abort on their two
        # copies of LLVM's command-line options.
        import subprocess
        import sys
        for fw in want:
            argv = [a for a in sys.argv[1:]]
            if "--frameworks" in argv:
                i = argv.index("--frameworks")
                del argv[i:i + 2]
            subprocess.run([sys.executable, __file__, *argv, "--frameworks", fw], check=False)
        return
    runs = []
    if args.folder and "tf" in want:
        runs.append(("tf.data image_dataset_from_directory", tf_folder))
    if args.folder and "torch" in want:
        runs.append((f"PyTorch DataLoader ({args.workers} workers)", torch_folder))
    if args.tfrecord and "tf" in want:
        runs.append(("tf.data TFRecordDataset", tf_records))
    for name, fn in runs:
        med, lo, hi = fn(args)
        print(f"{name}: {med:,.0f} images/s (median of {args.passes}, {lo:,.0f}-{hi:,.0f})",
              flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference trainers for bench/bench_mlp.cpp: the benchmark's MLP or CNN on Fashion-MNIST in
PyTorch or Keras, trained the way TrainDeck trains it, so that the rates compare like with like.

Same as TrainDeck's benchmark project:
  model      mlp: 784 -> [Dense(h, relu) -> Dropout(p)] per hidden width -> Dense(10) -> softmax;
             cnn (projects/fashion_mnist_cnn.json): 28x28x1 -> Conv2D(32, 3x3, relu) ->
             BatchNormalization (momentum 0.99, epsilon 1e-3) -> MaxPooling2D(2) -> Conv2D(64,
             3x3, relu) -> MaxPooling2D(2) -> Flatten -> Dropout(p) -> Dense(128, relu) ->
             Dense(10) -> softmax;
             Glorot-uniform kernels and zero biases (the Keras defaults TrainDeck uses);
  data       the Debian package dataset-fashion-mnist, pixels scaled by 1/255, reshuffled every
             epoch, last partial batch kept;
  optimizer  Adam, learning rate 1e-3, beta_1 0.9, beta_2 0.999, epsilon 1e-7;
  loss       sparse categorical cross-entropy;
  timing     wall time of each epoch's training loop (shuffle and every step, no evaluation);
             samples/s = samples in epochs 2..N / their time (the first epoch warms up: graph
             tracing, torch.compile, allocator growth), test accuracy on the 10,000 test images
             after the last epoch, peak RSS of this process;
  denormals  flushed to zero, as TrainDeck and TensorFlow do (torch.set_flush_denormal; without
             it, PyTorch's CPU kernels slow down by several times once values underflow, e.g.
             Adam's moments of always-zero gradients); --keep-denormals measures PyTorch's
             default.

Prints one JSON line on stdout. Exit status 2 with a message on stderr when an option, the data
or the framework is missing.

  reference_mlp.py --framework torch --hidden 128 --batch 32 --epochs 3 --threads 2
  reference_mlp.py --framework torch --compile --hidden 1024,1024 --batch 256
  reference_mlp.py --framework keras --precision bf16 --hidden 128 --batch 256
  reference_mlp.py --framework torch --model cnn --dropout 0.3 --batch 64 [--channels-last]
  reference_mlp.py --framework keras --model cnn --dropout 0.3 --batch 64 --folder DIR

--folder DIR trains on DIR/train and tests on DIR/test, image folders of 28x28 grayscale files
(one sub-folder per class; projects/make_image_folders.py writes them), read each epoch through
the framework's own reader: torchvision's ImageFolder (PIL, ToTensor) in a DataLoader with
--loader-workers processes, or Keras' image_dataset_from_directory with map and prefetch
AUTOTUNE; the epoch's time then includes reading and decoding the files.
"""
import argparse
import gzip
import json
import os
import resource
import struct
import sys
import time

# Where TrainDeck's built-in source reads it too: $TRAINDECK_FASHION_MNIST_DIR, else Debian's folder.
DATA_DIR = os.environ.get("TRAINDECK_FASHION_MNIST_DIR") or "/usr/share/datasets/fashion-mnist"
TRAIN_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
TEST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
ADAM = {"lr": 1e-3, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}


class Refused(Exception):
    """An expected failure: printed as one line on stderr, exit status 2."""


def read_idx(path):
    import numpy as np

    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise Refused(f"{path}: {e.strerror or e} (install the Debian package dataset-fashion-mnist)")
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise Refused(f"{path}: not an IDX file of unsigned bytes")
    rank = raw[3]
    header = 4 + 4 * rank
    shape = struct.unpack(">" + "I" * rank, raw[4:header])
    count = 1
    for d in shape:
        count *= d
    if len(raw) - header != count:
        raise Refused(f"{path}: header says {shape} ({count} bytes), file has {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_split(files):
    import numpy as np

    images = read_idx(os.path.join(DATA_DIR, files[0]))
    labels = read_idx(os.path.join(DATA_DIR, files[1]))
    x = images.reshape(images.shape[0], -1).astype(np.float32) * np.float32(1.0 / 255.0)
    return x, labels.astype(np.int64)


def steady_rate(samples_per_epoch, epoch_seconds):
    steady = epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds
    return samples_per_epoch * len(steady) / sum(steady)


def train_torch(opts, hidden, train, test):
    try:
        import torch
    except ImportError as e:
        raise Refused(f"--framework torch: PyTorch is not installed for {sys.executable} ({e})")
    major = int(torch.__version__.split(".")[0])
    if opts.compile and (major < 2 or not hasattr(torch, "compile")):
        raise Refused(f"--compile: torch.compile needs PyTorch 2 or later, this is {torch.__version__}")
    torch.set_num_threads(opts.threads)
    torch.set_flush_denormal(not opts.keep_denormals)
    torch.manual_seed(opts.seed)
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise Refused(f"--device cuda: PyTorch {torch.__version__} sees no GPU "
                      f"(built for CUDA {torch.version.cuda})")
    device = torch.device(opts.device)

    layers = []
    width = 784 if opts.folder else train[0].shape[1]
    if opts.model == "cnn":
        # PyTorch's images are channels-first; its BatchNorm momentum is Keras' 1 - momentum.
        nn = torch.nn
        layers = [nn.Unflatten(1, (1, 28, 28))]
        if opts.channels_last:
            layers.append(ChannelsLast())
        layers += [nn.Conv2d(1, 32, 3), nn.ReLU(),
                  nn.BatchNorm2d(32, eps=1e-3, momentum=0.01), nn.MaxPool2d(2),
                  nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()]
        if opts.dropout > 0:
            layers.append(nn.Dropout(opts.dropout))
        layers += [nn.Linear(64 * 5 * 5, 128), nn.ReLU()]
        width = 128
    else:
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            if opts.dropout > 0:
                layers.append(torch.nn.Dropout(opts.dropout))
            width = h
    layers.append(torch.nn.Linear(width, 10))
    model = torch.nn.Sequential(*layers)
    for m in model:
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
            torch.nn.init.xavier_uniform_(m.weight)
            torch.nn.init.zeros_(m.bias)
    model.to(device)
    if opts.channels_last:
        model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM["lr"],
                                 betas=(ADAM["beta_1"], ADAM["beta_2"]), eps=ADAM["epsilon"])
    forward = torch.compile(model) if opts.compile else model

    def autocast():
        if opts.precision == "bf16":
            return torch.autocast(opts.device, dtype=torch.bfloat16)
        return torch.autocast(opts.device, enabled=False)

    if opts.folder:
        from torchvision import datasets, transforms
        tfm = transforms.Compose([transforms.Grayscale(), transforms.ToTensor()])
        data = datasets.ImageFolder(os.path.join(opts.folder, "train"), transform=tfm)
        loader = torch.utils.data.DataLoader(
            data, batch_size=opts.batch, shuffle=True, num_workers=opts.loader_workers,
            persistent_workers=opts.loader_workers > 0)
        n = len(data)

        def batches():
            for xb, yb in loader:
                yield xb.reshape(xb.shape[0], -1).to(device), yb.to(device)
    else:
        # --device cuda: the whole training set lives on the GPU, as TrainDeck's batches would.
        x, y = (torch.from_numpy(a).to(device) for a in train)
        n = x.shape[0]

        def batches():
            order = torch.randperm(n, device=device)
            for first in range(0, n, opts.batch):
                idx = order[first:first + opts.batch]
                yield x[idx], y[idx]
    epoch_seconds = []
    for _ in range(opts.epochs):
        model.train()
        start = time.perf_counter()
        for xb, yb in batches():
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                logits = forward(xb)
            # The softmax of the last layer lives inside the loss here, as in Keras' from_logits.
            loss = torch.nn.functional.cross_entropy(logits.float(), yb)
            loss.backward()
            optimizer.step()
        if opts.device == "cuda":
            torch.cuda.synchronize()  # the epoch ends when the GPU has finished it
        epoch_seconds.append(time.perf_counter() - start)

    model.eval()
    if opts.folder:
        from torchvision import datasets, transforms
        tdata = datasets.ImageFolder(os.path.join(opts.folder, "test"), transform=transforms.Compose(
            [transforms.Grayscale(), transforms.ToTensor()]))
        tx = torch.stack([tdata[i][0].reshape(-1) for i in range(len(tdata))]).to(device)
        ty = torch.tensor(tdata.targets, device=device)
    else:
        tx, ty = (torch.from_numpy(a).to(device) for a in test)
    with torch.no_grad(), autocast():
        accuracy = (model(tx).argmax(dim=1) == ty).float().mean().item()
    return "torch", torch.__version__, epoch_seconds, accuracy, n


def ChannelsLast():
    """A layer that lays its NCHW input out channels-last (NHWC in memory), as --channels-last
    asks of the images (made on first use: torch is imported lazily)."""
    import torch

    class ChannelsLastLayer(torch.nn.Module):
        def forward(self, x):
            return x.contiguous(memory_format=torch.channels_last)

    return ChannelsLastLayer()


def train_keras(opts, hidden, train, test):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
        import keras
    except ImportError as e:
        raise Refused(f"--framework keras: TensorFlow/Keras is not installed for {sys.executable} ({e})")
    tf.config.threading.set_intra_op_parallelism_threads(opts.threads)
    tf.config.threading.set_inter_op_parallelism_threads(opts.threads)
    keras.utils.set_random_seed(opts.seed)
    if opts.precision == "bf16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")

    model = keras.Sequential([keras.Input(shape=(784 if opts.folder else train[0].shape[1],))])
    L = keras.layers
    if opts.model == "cnn":
        for layer in [L.Reshape((28, 28, 1)), L.Conv2D(32, 3, activation="relu"),
                      L.BatchNormalization(), L.MaxPooling2D(), L.Conv2D(64, 3, activation="relu"),
                      L.MaxPooling2D(), L.Flatten()]:
            model.add(layer)
        if opts.dropout > 0:
            model.add(L.Dropout(opts.dropout))
        model.add(L.Dense(128, activation="relu"))
    else:
        for h in hidden:
            model.add(keras.layers.Dense(h, activation="relu"))
            if opts.dropout > 0:
                model.add(keras.layers.Dropout(opts.dropout))
    model.add(keras.layers.Dense(10, activation="softmax", dtype="float32"))
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=ADAM["lr"], beta_1=ADAM["beta_1"],
                                        beta_2=ADAM["beta_2"], epsilon=ADAM["epsilon"]),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=["accuracy"],
        # Explicit: Keras 3's default "auto" would pick XLA on its own for some models.
        jit_compile=bool(opts.compile))

    epoch_seconds = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            epoch_seconds.append(time.perf_counter() - self.start)

    if opts.folder:
        def read(split, shuffle):
            ds = keras.utils.image_dataset_from_directory(
                os.path.join(opts.folder, split), color_mode="grayscale", image_size=(28, 28),
                batch_size=opts.batch, shuffle=shuffle, seed=opts.seed, verbose=False)
            flat = ds.map(lambda x, y: (tf.reshape(x, (-1, 784)) / 255.0, y),
                          num_parallel_calls=tf.data.AUTOTUNE)
            return flat.prefetch(tf.data.AUTOTUNE), len(ds.file_paths)
        data, n = read("train", True)
        model.fit(data, epochs=opts.epochs, verbose=0, callbacks=[EpochTimer()])
        accuracy = model.evaluate(read("test", False)[0], verbose=0)[1]
    else:
        n = train[0].shape[0]
        model.fit(train[0], train[1], batch_size=opts.batch, epochs=opts.epochs, shuffle=True,
                  verbose=0, callbacks=[EpochTimer()])
        accuracy = model.evaluate(test[0], test[1], batch_size=1024, verbose=0)[1]
    return "keras", f"{keras.__version__} (tf {tf.__version__})", epoch_seconds, accuracy, n


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", choices=["torch", "keras"], required=True)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp",
                   help="mlp (--hidden widths) or the Fashion-MNIST CNN (--hidden unused)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile (PyTorch 2+), or Keras jit_compile=True (XLA)")
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="bf16: torch.autocast on the CPU, or the Keras policy mixed_bfloat16")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="torch: train on the CPU or the first GPU (cuda)")
    p.add_argument("--channels-last", action="store_true",
                   help="torch --model cnn: images and convolution weights channels-last (NHWC "
                        "in memory), as TrainDeck lays them out")
    p.add_argument("--hidden", default="128", help="comma-separated hidden widths (default 128)")
    p.add_argument("--dropout", type=float, default=0.2, help="after every hidden layer")
    p.add_argument("--keep-denormals", action="store_true",
                   help="PyTorch: leave denormal numbers on (its default; slow on this CPU path)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3, help="at least 2: the first is warm-up")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--folder", help="train on DIR/train, test on DIR/test (image folders)")
    p.add_argument("--loader-workers", type=int, default=os.cpu_count() or 1,
                   help="--folder with torch: DataLoader worker processes")
    p.add_argument("--limit", type=int, default=0,
                   help="train on the first N training images only (quick checks; 0: all 60,000)")
    opts = p.parse_args(argv)
    try:
        hidden = [int(h) for h in opts.hidden.split(",") if h.strip()]
    except ValueError:
        p.error(f"--hidden: expected comma-separated positive integers, got '{opts.hidden}'")
    if not hidden or min(hidden) <= 0:
        p.error(f"--hidden: expected comma-separated positive integers, got '{opts.hidden}'")
    if not 0 <= opts.dropout < 1:
        p.error(f"--dropout: expected a rate in [0, 1), got {opts.dropout}")
    if opts.limit < 0:
        p.error(f"--limit: expected a count >= 0, got {opts.limit}")
    if opts.channels_last and (opts.framework != "torch" or opts.model != "cnn"):
        p.error("--channels-last: for --framework torch --model cnn (Keras' images are "
                "channels-last already)")
    for name in ("batch", "threads"):
        if getattr(opts, name) <= 0:
            p.error(f"--{name}: expected a positive integer, got {getattr(opts, name)}")
    if opts.epochs < 2:
        p.error(f"--epochs: expected at least 2 (the first epoch is warm-up), got {opts.epochs}")
    return opts, hidden


def main(argv):
    opts, hidden = parse_args(argv)
    try:
        if opts.folder and opts.model != "cnn":
            raise Refused("--folder: trains the CNN (--model cnn) on 28x28 images")
        train = test = None
        if not opts.folder:
            train = load_split(TRAIN_FILES)
            if opts.limit:
                train = (train[0][:opts.limit], train[1][:opts.limit])
            test = load_split(TEST_FILES)
        run = train_torch if opts.framework == "torch" else train_keras
        framework, version, epoch_seconds, accuracy, samples = run(opts, hidden, train, test)
    except Refused as e:
        print(f"reference_mlp.py: {e}", file=sys.stderr)
        return 2
    print(json.dumps({
        "framework": framework,
        "version": version,
        "model": opts.model,
        "compile": opts.compile,
        "channels_last": opts.channels_last,
        "precision": opts.precision,
        "hidden": hidden,
        "dropout": opts.dropout,
        "batch": opts.batch,
        "epochs": opts.epochs,
        "threads": opts.threads,
        "seed": opts.seed,
        "flush_denormal": opts.framework == "keras" or not opts.keep_denormals,
        "folder": opts.folder or "",
        "samples_per_s": round(steady_rate(samples, epoch_seconds), 1),
        "epoch_seconds": [round(t, 3) for t in epoch_seconds],
        "test_accuracy": round(float(accuracy), 4),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

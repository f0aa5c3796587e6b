#!/usr/bin/env python3
"""Writes Fashion-MNIST as folders of image files, one sub-folder per class, as Keras'
image_dataset_from_directory reads them (and TrainDeck's image_directory source):

    OUT/train/<class>/<index>.png   and   OUT/test/<class>/<index>.png

from the IDX files Debian's dataset-fashion-mnist package installs. By default 28x28 grayscale
PNG (written with the standard library alone); --color writes SIZE x SIZE RGB images, each
class tinted its own colour and the garment scaled up (nearest neighbour), as JPEG (needs
python3-pil) or PNG, so that decoding and resizing cost what real photographs cost.

    python3 projects/make_image_folders.py                      # projects/fashion-mnist-png
    python3 projects/make_image_folders.py --color --size 96 --format jpeg \\
        --out projects/fashion-mnist-color
    python3 projects/make_image_folders.py --limit 50 --out /tmp/small   # 50 images per class
"""
import argparse
import gzip
import os
import struct
import sys
import zlib

CLASSES = ["t_shirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle_boot"]
# Per-class tints for --color (RGB multipliers of the garment's gray level).
TINTS = [(1.0, 0.55, 0.55), (0.55, 1.0, 0.55), (0.55, 0.55, 1.0), (1.0, 1.0, 0.5),
         (1.0, 0.5, 1.0), (0.5, 1.0, 1.0), (1.0, 0.75, 0.4), (0.6, 0.6, 0.6), (0.8, 0.5, 0.3),
         (0.4, 0.7, 1.0)]


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        sys.exit(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return dims, data[4 + 4 * ndim:]


def find(folder, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    sys.exit(f"{folder}: no {stem}(.gz); install Debian's dataset-fashion-mnist or set "
             "--fashion-mnist")


def png_bytes(width, height, channels, pixels):
    """A PNG file of 8-bit gray (1) or RGB (3) rows."""
    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body +
                struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff))
    color = {1: 0, 3: 2}[channels]
    stride = width * channels
    raw = b"".join(b"\x00" + pixels[y * stride:(y + 1) * stride] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def colored(gray, size, tint):
    """28x28 gray -> size x size RGB: nearest-neighbour scaling, the class's tint."""
    out = bytearray(size * size * 3)
    for y in range(size):
        row = (y * 28 // size) * 28
        for x in range(size):
            v = gray[row + x * 28 // size]
            o = (y * size + x) * 3
            out[o] = int(v * tint[0])
            out[o + 1] = int(v * tint[1])
            out[o + 2] = int(v * tint[2])
    return bytes(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "fashion-mnist-png"))
    ap.add_argument("--fashion-mnist", default=os.environ.get(
        "TRAINDECK_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--format", choices=["png", "jpeg"], default="png")
    ap.add_argument("--color", action="store_true", help="RGB, tinted per class, --size square")
    ap.add_argument("--size", type=int, default=28, help="side of the --color images")
    ap.add_argument("--limit", type=int, default=0, help="at most this many images per class")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality")
    args = ap.parse_args()
    if args.format == "jpeg":
        try:
            from PIL import Image  # noqa: F401
        except ImportError:
            sys.exit("--format jpeg needs Pillow: apt-get install python3-pil")
    size = args.size if args.color else 28
    channels = 3 if args.color else 1
    for split, stem in (("train", "train"), ("test", "t10k")):
        dims, images = read_idx(find(args.fashion_mnist, f"{stem}-images-idx3-ubyte"))
        _, labels = read_idx(find(args.fashion_mnist, f"{stem}-labels-idx1-ubyte"))
        n = dims[0]
        counts = [0] * len(CLASSES)
        for name in CLASSES:
            os.makedirs(os.path.join(args.out, split, name), exist_ok=True)
        for i in range(n):
            label = labels[i]
            if args.limit and counts[label] >= args.limit:
                continue
            counts[label] += 1
            gray = images[i * 784:(i + 1) * 784]
            pixels = colored(gray, size, TINTS[label]) if args.color else gray
            path = os.path.join(args.out, split, CLASSES[label], f"{i:05d}.{args.format}")
            if args.format == "png":
                with open(path, "wb") as f:
                    f.write(png_bytes(size, size, channels, pixels))
            else:
                from PIL import Image
                mode = "RGB" if channels == 3 else "L"
                Image.frombytes(mode, (size, size), pixels).save(path, quality=args.quality)
        print(f"{split}: {sum(counts)} images in {os.path.join(args.out, split)}")


if __name__ == "__main__":
    main()

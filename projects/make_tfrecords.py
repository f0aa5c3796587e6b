#!/usr/bin/env python3
"""Writes Fashion-MNIST as TFRecord shards of tf.train.Example, as tf.data's TFRecordDataset and
tf.io.parse_single_example read them (and TrainDeck's TFRecord reader):

    OUT/train-00000-of-00008.tfrecord ... OUT/train-00007-of-00008.tfrecord
    OUT/test-00000-of-00002.tfrecord  ... OUT/test-00001-of-00002.tfrecord

from the IDX files Debian's dataset-fashion-mnist package installs, with the standard library
alone (no TensorFlow, numpy or PIL). Each Example has the features "image" (bytes: the 28x28
grayscale image PNG-encoded) and "label" (int64: the class, 0..9); with --raw, "image_raw" (bytes:
the 784 pixels, row-major uint8) instead of "image". The images keep the IDX order, shard after
shard. --gzip writes OUT/<split>-NNNNN-of-MMMMM.tfrecord.gz, each file one gzip stream
(tf.data.TFRecordDataset(files, compression_type="GZIP")).

    python3 projects/make_tfrecords.py                          # projects/fashion-mnist-tfrecord
    python3 projects/make_tfrecords.py --gzip --raw --out /tmp/fm-raw-gz
    python3 projects/make_tfrecords.py --limit 20 --out /tmp/small   # 20 images per split
"""
import argparse
import gzip
import os
import struct
import sys

# The IDX files and PNG encoding: projects/make_image_folders.py's, beside this script.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_image_folders import find, png_bytes, read_idx  # noqa: E402


# --- TFRecord framing: CRC-32C (Castagnoli, reflected 0x82F63B78) and TFRecord's mask

def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    table = CRC32C_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data):
    """One record: uint64 length, masked CRC of the length, data, masked CRC of the data."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data +
            struct.pack("<I", masked_crc32c(data)))


# --- tf.train.Example in the protobuf wire format

def varint(v):
    v &= 0xFFFFFFFFFFFFFFFF  # a negative int64 as its two's complement (10 bytes)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def field_bytes(number, payload):
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def bytes_feature(values):   # Feature{bytes_list = 1: BytesList{repeated bytes value = 1}}
    return field_bytes(1, b"".join(field_bytes(1, v) for v in values))


def int64_feature(values):   # Feature{int64_list = 3: Int64List{repeated int64 value = 1 [packed]}}
    packed = b"".join(varint(v) for v in values)
    return field_bytes(3, field_bytes(1, packed) if packed else b"")


def example(features):
    """Example{features = 1: Features{map<string, Feature> feature = 1}} from (name, Feature)."""
    entries = b"".join(field_bytes(1, field_bytes(1, name.encode()) + field_bytes(2, feature))
                       for name, feature in features)
    return field_bytes(1, entries)


def write_split(args, split, stem):
    dims, images = read_idx(find(args.fashion_mnist, f"{stem}-images-idx3-ubyte"))
    _, labels = read_idx(find(args.fashion_mnist, f"{stem}-labels-idx1-ubyte"))
    n = dims[0] if not args.limit else min(args.limit, dims[0])
    shards = args.shards if split == "train" else args.test_shards
    suffix = ".tfrecord.gz" if args.gzip else ".tfrecord"
    for s in range(shards):
        path = os.path.join(args.out, f"{split}-{s:05d}-of-{shards:05d}{suffix}")
        records = []
        for i in range(s * n // shards, (s + 1) * n // shards):
            pixels = images[i * 784:(i + 1) * 784]
            image = (("image_raw", bytes_feature([pixels])) if args.raw else
                     ("image", bytes_feature([png_bytes(28, 28, 1, pixels)])))
            records.append(tfrecord(example([image, ("label", int64_feature([labels[i]]))])))
        data = b"".join(records)
        if args.gzip:
            # mtime=0: the same input gives the same bytes.
            with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
                f.write(data)
        else:
            with open(path, "wb") as f:
                f.write(data)
    print(f"{split}: {n} images in {shards} shard(s) {split}-*-of-{shards:05d}{suffix} "
          f"in {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "fashion-mnist-tfrecord"))
    ap.add_argument("--fashion-mnist", default=os.environ.get(
        "TRAINDECK_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--shards", type=int, default=8, help="training shards (default 8)")
    ap.add_argument("--test-shards", type=int, default=2, help="test shards (default 2)")
    ap.add_argument("--gzip", action="store_true", help="GZIP-compressed .tfrecord.gz files")
    ap.add_argument("--raw", action="store_true",
                    help='the 784 raw pixel bytes as "image_raw" instead of a PNG as "image"')
    ap.add_argument("--limit", type=int, default=0, help="only the first N images of each split")
    args = ap.parse_args()
    if args.shards < 1 or args.test_shards < 1:
        sys.exit("--shards and --test-shards must be at least 1")
    if args.limit < 0:
        sys.exit("--limit must be at least 0 (0: all images)")
    os.makedirs(args.out, exist_ok=True)
    for split, stem in (("train", "train"), ("test", "t10k")):
        write_split(args, split, stem)


if __name__ == "__main__":
    main()

"""Export and import checked against the real runtimes (run by interop.sh).

  interop.py TRAINDECK_BINARY WORK_DIR

1. Models built and saved by Keras 3 are read by `traindeck predict` (NPY, CSV and IDX input) and
   predict what Keras predicts.
2. `traindeck export` of those files: the ONNX file passes onnx.checker (full_check) and ONNX
   Runtime predicts what `traindeck predict` does; keras.saving.load_model reads the .keras file
   and predicts the same. The image models include Resizing, CenterCrop and the Random*
   augmentation layers (the identity at inference).
3. `traindeck import` makes a project that takes model.compile's optimizer and starts from the
   Keras weights (a run with a learning
   rate of 1e-7 ends next to them) and trains further (a normal run lowers Keras' own loss on the
   training data); the trained model, saved with --save-model, loads in Keras and in ONNX Runtime
   (exported) with TrainDeck's predictions.
4. `traindeck export RUN` of that stored run (its latest checkpoint): ONNX Runtime and Keras
   predict what TrainDeck does, and so does `traindeck predict` on the checkpoint file itself.
Tolerance: relative 1e-4 (absolute 1e-6), and equal arg max per row.
"""
import gzip
import json
import os
import subprocess
import sys

import numpy as np

BIN, WORK = sys.argv[1], sys.argv[2]
os.chdir(WORK)

import keras  # noqa: E402  (after the environment is set)
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

failures = []


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def traindeck(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL traindeck {' '.join(args)} exited {r.returncode}")
    return r.stdout


def close(a, b, what):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    same_shape = a.shape == b.shape
    ok = same_shape and np.allclose(a, b, rtol=1e-4, atol=1e-6)
    if same_shape and a.ndim == 2 and a.shape[1] > 1:
        ok = ok and bool((a.argmax(1) == b.argmax(1)).all())
    diff = float(np.abs(a - b).max()) if same_shape else float("nan")
    check(ok, f"{what} (shapes {a.shape} {b.shape}, max abs diff {diff:.3g})")


def td_predict(model, inp, out="pred.npy", *extra):
    traindeck("predict", model, inp, "-o", out, *extra)
    return np.load(out)


def onnx_check_and_run(path, x):
    m = onnx.load(path)
    try:
        onnx.checker.check_model(m, full_check=True)
        check(True, f"{path}: onnx.checker.check_model(full_check=True)")
    except Exception as e:  # noqa: BLE001
        check(False, f"{path}: onnx.checker: {e}")
    check(m.opset_import[0].version == 17, f"{path}: opset 17")
    check(m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch",
          f"{path}: symbolic batch dimension")
    check(all(n.op_type != "Dropout" for n in m.graph.node), f"{path}: no Dropout node")
    check(all(not n.op_type.startswith("Random") for n in m.graph.node),
          f"{path}: no random node (augmentation is the identity at inference)")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x.astype(np.float32)})[0]


def write_idx_u8(path, a):
    header = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + a.astype(np.uint8).tobytes())


rng = np.random.default_rng(7)
keras.utils.set_random_seed(7)

# ---- 1 + 2: an MLP (Dense, Dropout, activations) -------------------------------------------------
mlp = keras.Sequential([
    keras.Input((12,)),
    keras.layers.Dense(16, activation="relu"),
    keras.layers.Dropout(0.25),
    keras.layers.Dense(8, activation="gelu"),
    keras.layers.Activation("tanh"),
    keras.layers.Dense(3, activation="softmax"),
])
# Compiled and fitted a little: the file carries compile_config and the optimizer's variables.
mlp.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss="sparse_categorical_crossentropy", metrics=["accuracy"])
mlp.fit(rng.normal(size=(64, 12)).astype(np.float32), rng.integers(0, 3, size=64), epochs=1,
        verbose=0)
mlp.save("mlp.keras")
x = rng.normal(size=(40, 12)).astype(np.float32)
np.save("x.npy", x)
ref = mlp.predict(x, verbose=0)
td = td_predict("mlp.keras", "x.npy")
close(td, ref, "Keras-built MLP: traindeck predict == Keras predict (NPY input)")
with open("x.csv", "w") as f:
    f.write(",".join([f"f{i}" for i in range(12)] + ["label"]) + "\n")
    for row in x:
        f.write(",".join(repr(float(v)) for v in row) + ",0\n")
traindeck("predict", "mlp.keras", "x.csv", "-o", "pred.csv")
csv = np.genfromtxt("pred.csv", delimiter=",", names=True)
close(np.stack([csv[f"output_{j}"] for j in range(3)], 1), td, "CSV input, CSV output == NPY")
check(bool((csv["class"] == td.argmax(1)).all()), "CSV output: class == arg max")
printed = traindeck("predict", "mlp.keras", "x.npy").splitlines()
check(printed[0].startswith("row,class,probability") and len(printed) == 41,
      "predict prints a header and one line per row")

traindeck("export", "mlp.keras", "-o", "mlp.onnx")
close(onnx_check_and_run("mlp.onnx", x), td, "MLP: ONNX Runtime == traindeck predict")
traindeck("export", "mlp.keras", "--format", "keras", "-o", "mlp_rt.keras")
rt = keras.saving.load_model("mlp_rt.keras")
close(rt.predict(x, verbose=0), td, "MLP: keras.saving.load_model(exported) == traindeck predict")

# ---- a model over images: Flatten, Dense without bias, Reshape, LeakyReLU/ELU layers, IDX input --
img = keras.Sequential([
    keras.Input((6, 6)),
    keras.layers.Flatten(),
    keras.layers.Dense(10, use_bias=False, activation="sigmoid"),
    keras.layers.Reshape((5, 2)),
    keras.layers.LeakyReLU(negative_slope=0.1),
    keras.layers.Flatten(),
    keras.layers.Dense(6),
    keras.layers.ELU(alpha=0.5),
    keras.layers.Dense(4),
])
img.save("img.keras")
images = rng.integers(0, 256, size=(25, 6, 6)).astype(np.uint8)
write_idx_u8("images-idx3-ubyte.gz", images)
ref = img.predict(images.astype(np.float32), verbose=0)
td = td_predict("img.keras", "images-idx3-ubyte.gz", "img_pred.npy")
close(td, ref, "Keras-built image model: traindeck predict (IDX u8 input) == Keras predict")
traindeck("export", "img.keras", "-o", "img.onnx")
close(onnx_check_and_run("img.onnx", images.astype(np.float32)), td,
      "image model: ONNX Runtime == traindeck predict")
traindeck("export", "img.keras", "-o", "img_rt.keras")
close(keras.saving.load_model("img_rt.keras").predict(images.astype(np.float32), verbose=0), td,
      "image model: keras.saving.load_model(exported) == traindeck predict")

# ---- image layers: Conv2D (strides, dilation, groups), pooling, padding, rescaling, normalization -
cnn = keras.Sequential([
    keras.Input((9, 8, 2)),
    keras.layers.Rescaling(0.5, offset=0.1),
    keras.layers.ZeroPadding2D(((1, 0), (2, 1))),
    keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu"),
    # Momentum 0.9: the moving statistics catch up within the few steps the test trains.
    keras.layers.BatchNormalization(momentum=0.9),
    keras.layers.Conv2D(4, 2, dilation_rate=(2, 1), groups=2),
    keras.layers.MaxPooling2D(2, padding="same"),
    keras.layers.LayerNormalization(),
    keras.layers.AveragePooling2D(2, strides=1, padding="same"),
    keras.layers.Flatten(),
    keras.layers.Dense(3, activation="softmax"),
])
gap = keras.Sequential([
    keras.Input((6, 6, 1)),
    keras.layers.Conv2D(3, 3, padding="same", use_bias=False, activation="tanh"),
    keras.layers.BatchNormalization(center=False),
    keras.layers.LayerNormalization(scale=False),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(2),
])
xc_train = rng.normal(size=(256, 9, 8, 2)).astype(np.float32)
yc_train = ((xc_train[..., 0].mean((1, 2)) > 0).astype(np.int64)
            + (xc_train[..., 1].mean((1, 2)) > 0).astype(np.int64))
xc = xc_train[:40]
# Fitted a little, so the moving statistics are away from 0 and 1 and gamma/beta from 1 and 0.
cnn.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
cnn.fit(xc_train, yc_train, epochs=2, batch_size=32, verbose=0)
xg = rng.normal(size=(30, 6, 6, 1)).astype(np.float32)
gap.compile(optimizer="adam", loss="mse")
gap.fit(xg, rng.normal(size=(30, 2)).astype(np.float32), epochs=2, batch_size=10, verbose=0)
# Preprocessing and augmentation: Resizing (cropped or padded to the aspect ratio, bilinear and
# nearest) and CenterCrop (a crop, and smart_resize of a smaller image) become Slice, Pad and
# Resize; the Random* layers are the identity at inference, in Keras as in the ONNX file.
aug = keras.Sequential([
    keras.Input((10, 13, 2)),
    keras.layers.Resizing(8, 8, crop_to_aspect_ratio=True),
    keras.layers.RandomFlip(),
    keras.layers.RandomRotation(0.2),
    keras.layers.CenterCrop(6, 5),
    keras.layers.RandomContrast(0.3),
    keras.layers.Conv2D(3, 2, activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(3, activation="softmax"),
])
aug_pad = keras.Sequential([
    keras.Input((9, 14, 1)),
    keras.layers.Resizing(12, 11, interpolation="nearest", pad_to_aspect_ratio=True,
                          fill_value=0.25),
    keras.layers.RandomTranslation(0.1, 0.2),
    keras.layers.CenterCrop(13, 13),
    keras.layers.RandomZoom(0.1),
    keras.layers.Resizing(7, 9),
    keras.layers.Flatten(),
    keras.layers.Dense(2),
])
xa = rng.uniform(0, 255, size=(12, 10, 13, 2)).astype(np.float32)
xp = rng.normal(size=(12, 9, 14, 1)).astype(np.float32)
for name, model, xs in (("cnn", cnn, xc), ("gap", gap, xg), ("aug", aug, xa),
                        ("aug_pad", aug_pad, xp)):
    model.save(f"{name}.keras")
    np.save(f"{name}_x.npy", xs)
    td = td_predict(f"{name}.keras", f"{name}_x.npy", f"{name}_pred.npy")
    close(td, model.predict(xs, verbose=0), f"Keras-built {name}: traindeck predict == Keras predict")
    traindeck("export", f"{name}.keras", "-o", f"{name}.onnx")
    close(onnx_check_and_run(f"{name}.onnx", xs), td, f"{name}: ONNX Runtime == traindeck predict")
    traindeck("export", f"{name}.keras", "--format", "keras", "-o", f"{name}_rt.keras")
    close(keras.saving.load_model(f"{name}_rt.keras").predict(xs, verbose=0), td,
          f"{name}: keras.saving.load_model(exported) == traindeck predict")

# ---- 3: import into a project and train further ---------------------------------------------------
x_train = rng.normal(size=(512, 12)).astype(np.float32)
y_train = (x_train[:, 0] + x_train[:, 1] > 0).astype(np.int64) + (x_train[:, 2] > 1).astype(np.int64)
np.save("x_train.npy", x_train)
np.save("y_train.npy", y_train)


def like(lr, epochs, model=mlp, x_file="x_train.npy", y_file="y_train.npy"):
    return {"format": "traindeck-project",
            "model": json.loads(model.to_json()),
            "data": {"source": {"type": "npy", "train_x": x_file, "train_y": y_file},
                     "pipeline": {"shuffle_buffer": 512}},
            "training": {"epochs": epochs, "batch_size": 32, "seed": 3,
                         "optimizer": {"class_name": "Adam", "config": {"learning_rate": lr}},
                         "loss": "sparse_categorical_crossentropy"}}


for name, lr, epochs in (("like_tiny.json", 1e-7, 1), ("like.json", 1e-2, 4)):
    with open(name, "w") as f:
        json.dump(like(lr, epochs), f)
traindeck("import", "mlp.keras", "-o", "tiny.json", "--like", "like_tiny.json")
traindeck("import", "mlp.keras", "-o", "proj.json", "--like", "like.json")
proj = json.load(open("proj.json"))
check(proj.get("initial_weights") == "mlp.keras", "imported project references mlp.keras")
traindeck("import", "mlp.keras", "-o", "plain.json")
opt = json.load(open("plain.json"))["training"]["optimizer"]
check(opt["class_name"] == "SGD" and abs(opt["config"]["learning_rate"] - 0.05) < 1e-6
      and opt["config"]["momentum"] == 0.9,
      f"import without --like takes model.compile's optimizer: {opt['class_name']}")

traindeck("train", "tiny.json", "--db", "runs.db", "--plain", "--save-model", "tiny.keras")
start = [w for w in mlp.get_weights()]
after = keras.saving.load_model("tiny.keras").get_weights()
drift = max(float(np.abs(a - b).max()) for a, b in zip(start, after))
check(len(start) == len(after) and 0 < drift < 1e-4,
      f"training starts from the imported weights (largest change {drift:.3g} at learning rate 1e-7)")

traindeck("train", "proj.json", "--db", "runs.db", "--plain", "--run-name", "trained", "--save-model",
          "trained.keras")
trained = keras.saving.load_model("trained.keras")
loss = keras.losses.SparseCategoricalCrossentropy()
before = float(loss(y_train, mlp.predict(x_train, verbose=0)))
after = float(loss(y_train, trained.predict(x_train, verbose=0)))
check(after < 0.8 * before, f"trained further: Keras' loss on the training data {before:.4f} -> {after:.4f}")
td = td_predict("trained.keras", "x.npy", "trained_pred.npy")
close(trained.predict(x, verbose=0), td, "trained model: Keras load_model == traindeck predict")
traindeck("train", "proj.json", "--db", "runs.db", "--plain", "--epochs", "1", "--save-model",
          "trained.onnx")
traindeck("export", "--project", "proj.json", "--weights", "trained.keras", "-o", "trained_p.onnx")
close(onnx_check_and_run("trained_p.onnx", x), td,
      "trained model via export --project --weights: ONNX Runtime == traindeck predict")
onnx_check_and_run("trained.onnx", x)

# The CNN: its batch normalization trains (batch statistics, moving statistics updated) and the
# trained model, moving statistics included, predicts the same in Keras and ONNX Runtime.
np.save("xc_train.npy", xc_train)
np.save("yc_train.npy", yc_train)
with open("like_cnn.json", "w") as f:
    json.dump(like(1e-2, 8, cnn, "xc_train.npy", "yc_train.npy"), f)
traindeck("import", "cnn.keras", "-o", "cnn_proj.json", "--like", "like_cnn.json")
traindeck("train", "cnn_proj.json", "--db", "runs_cnn.db", "--plain", "--save-model",
          "cnn_trained.keras")
cnn_trained = keras.saving.load_model("cnn_trained.keras")
before = float(loss(yc_train, cnn.predict(xc_train, verbose=0)))
after = float(loss(yc_train, cnn_trained.predict(xc_train, verbose=0)))
check(after < 0.8 * before,
      f"CNN trained further: Keras' loss on the training data {before:.4f} -> {after:.4f}")
moved = [float(np.abs(a - b).max()) for a, b in
         zip(cnn.layers[3].get_weights()[2:], cnn_trained.layers[3].get_weights()[2:])]
check(min(moved) > 1e-4, f"CNN: the moving statistics were trained (largest changes {moved})")
td_cnn = td_predict("cnn_trained.keras", "cnn_x.npy", "cnn_trained_pred.npy")
close(cnn_trained.predict(xc, verbose=0), td_cnn,
      "trained CNN: Keras load_model == traindeck predict")
traindeck("export", "--project", "cnn_proj.json", "--weights", "cnn_trained.keras", "-o",
          "cnn_trained.onnx")
close(onnx_check_and_run("cnn_trained.onnx", xc), td_cnn,
      "trained CNN: ONNX Runtime == traindeck predict")

# ---- 4: a stored run's model: export RUN (its latest checkpoint), predict on the checkpoint ------
traindeck("export", "trained", "--db", "runs.db", "-o", "run.onnx")
close(onnx_check_and_run("run.onnx", x), td,
      "stored run via export RUN: ONNX Runtime == traindeck predict (its --save-model file)")
traindeck("export", "trained", "--db", "runs.db", "--format", "keras", "-o", "run.keras")
close(keras.saving.load_model("run.keras").predict(x, verbose=0), td,
      "stored run via export RUN: keras.saving.load_model == traindeck predict")
run_dir = "checkpoints/runs.db/run-2"  # tiny.json's run is 1, the "trained" run 2
newest = max(os.listdir(run_dir), key=lambda n: int(n.split("-")[-1].split(".")[0]))
close(td_predict(os.path.join(run_dir, newest), "x.npy", "ckpt_pred.npy"), td,
      f"traindeck predict on the run's checkpoint {newest} == on its --save-model file")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all interop checks passed")

"""Cross-checks mt-ckpt's safetensors code against the Python safetensors package.

Python writes F32, F16 and BF16 files (safetensors.numpy.save_file, and safetensors.serialize_file
for BF16, which numpy lacks, from uint16 bit patterns); the C program st_convert reads each with
mt-ckpt's reader (as f32) and writes the tensors again with mt-ckpt's writer (F32); Python reads
that with safetensors.numpy.load_file and compares names, shapes, metadata and every value's bits
with what it wrote: F16 widened by numpy's own conversion (NaNs: sign and payload kept), BF16 as
its bits shifted into the upper half.

Usage: safetensors_python.py ST_CONVERT
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import safetensors
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import load_file, save_file

FAILURES = []


def check(cond, what):
    if cond:
        print(f"ok: {what}")
    else:
        print(f"FAIL: {what}", file=sys.stderr)
        FAILURES.append(what)


def f16_expected_bits(h):
    """The f32 bits a float16 array must widen to: numpy's conversion, NaNs with their payload."""
    bits = h.view(np.uint16).astype(np.uint32)
    out = h.astype(np.float32).view(np.uint32).copy()
    nan = np.isnan(h)
    out[nan] = ((bits[nan] >> 15) << 31) | 0x7F800000 | ((bits[nan] & 0x3FF) << 13)
    return out


def specials_f32():
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1.17549421e-38,
                     3.4028235e38, 1.0, -2.5], dtype=np.float32)


def f32_case(v):
    return v, "float32", v.view(np.uint32)


def f16_case(v):
    return v, "float16", f16_expected_bits(v)


def bf16_case(bits):
    """A BF16 tensor given by its uint16 bit patterns."""
    return bits, "bfloat16", bits.astype(np.uint32) << 16


def inputs(rng):
    """file -> (writer, {name: (array, safetensors dtype, f32 bits expected back)})."""
    f32 = {
        "layer.0.weight": rng.standard_normal((64, 33)).astype(np.float32),
        "specials": specials_f32(),
        "scalar": np.array(np.float32(3.5)),
        "empty": np.zeros((0, 3), np.float32),
        "four_d": rng.standard_normal((2, 3, 1, 5)).astype(np.float32),
        "\u540d\u524d": rng.standard_normal(7).astype(np.float32),
    }
    every16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f16 = {
        "every_pattern": every16.view(np.float16).reshape(256, 256),
        "normal": rng.standard_normal((17, 3)).astype(np.float16),
        "subnormals": np.arange(1, 1024, dtype=np.uint16).view(np.float16),
    }
    bf16 = {
        "every_pattern": every16.reshape(64, 1024),
        "from_f32": (rng.standard_normal(100).astype(np.float32).view(np.uint32) >> 16)
        .astype(np.uint16),
    }
    return {
        "f32": ("save_file", {k: f32_case(v) for k, v in f32.items()}),
        "f16": ("save_file", {k: f16_case(v) for k, v in f16.items()}),
        "bf16": ("serialize_file", {k: bf16_case(v) for k, v in bf16.items()}),
        # All three dtypes in one file: safetensors lays the data out by dtype, not by name.
        "mixed": ("serialize_file", {"a_bf16": bf16_case(bf16["from_f32"][:10]),
                                     "b_f32": f32_case(f32["four_d"]),
                                     "c_f16": f16_case(f16["normal"])}),
    }


def write(path, how, tensors, metadata):
    if how == "save_file":
        save_file({k: v for k, (v, _, _) in tensors.items()}, path, metadata=metadata)
        return
    # serialize_file reads the arrays through raw pointers: they must stay alive (they do: the
    # caller's dict holds them) and be contiguous.
    specs = {}
    for k, (v, dtype, _) in tensors.items():
        assert v.flags["C_CONTIGUOUS"]
        specs[k] = TensorSpec(dtype=dtype, shape=list(v.shape), data_ptr=v.ctypes.data,
                              data_len=v.nbytes)
    serialize_file(specs, path, metadata=metadata)


def main():
    convert = sys.argv[1]
    rng = np.random.default_rng(20240614)
    with tempfile.TemporaryDirectory(prefix="mt_st_py.") as tmp:
        for name, (how, tensors) in inputs(rng).items():
            src = os.path.join(tmp, f"{name}.safetensors")
            out = os.path.join(tmp, f"{name}.c.safetensors")
            metadata = {"format": "np", "source": name, "note": "\u00e9t\u00e9"}
            write(src, how, tensors, metadata)
            run = subprocess.run([convert, src, out], capture_output=True, text=True)
            check(run.returncode == 0, f"{name}: st_convert reads and rewrites it "
                  f"({run.stderr.strip()})")
            if run.returncode != 0:
                continue
            back = load_file(out)
            check(sorted(back) == sorted(tensors), f"{name}: the same names ({sorted(back)})")
            for k, (v, _, want_bits) in tensors.items():
                got = back.get(k)
                if got is None:
                    continue
                check(got.dtype == np.float32 and got.shape == v.shape,
                      f"{name}/{k}: F32 of shape {v.shape} (got {got.dtype} {got.shape})")
                same = got.shape == v.shape and np.array_equal(
                    got.view(np.uint32), want_bits.reshape(v.shape))
                check(same, f"{name}/{k}: every value's bits as expected")
            with safetensors.safe_open(out, framework="numpy") as f:
                check(f.metadata() == metadata, f"{name}: metadata kept ({f.metadata()})")
            # The writer's layout: header length a multiple of 8, data starts 8-byte aligned.
            with open(out, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
            check(n % 8 == 0, f"{name}: header length {n} is a multiple of 8")
    if FAILURES:
        print(f"{len(FAILURES)} checks failed", file=sys.stderr)
        return 1
    print("safetensors_python: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

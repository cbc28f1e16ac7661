"""Throughput of the sparse-delta weight codec: encode (dense-to-sparse on the training side) and
in-place apply (sparse-to-dense on the serving side) of 256 MiB of bf16 weights with 1%, 5% and
20% of the elements changed, plus a dense snapshot, for the numpy and torch (CPU) backends.

Throughput is GB/s of the dense bf16 tensor (2 bytes per element, 1 GB = 1e9 B) over the median
of several repeats; the target is >= 0.5 GB/s. Changed positions are uniform at random with
exactly the stated fraction, so 20% sits on the default dense threshold and stays sparse.

    python benchmarks/bench_weight_codec.py            # 256 MiB, 5 repeats
    python benchmarks/bench_weight_codec.py --quick    # 16 MiB, 3 repeats

`--json PATH` writes one results document (`loom.bench.results`): a record `"setup"` (the size,
the repeats, the libraries and the load average) and `"codec"` per backend and share changed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from loom.bench.script import add_json_option, write_json
from loom.state.weights import apply, encode, float32_to_bf16_bits, read_header

TARGET_GBS = 0.5
FRACTIONS = (0.01, 0.05, 0.20)


def weights(numel: int, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """bf16 bits of N(0, 0.02) weights, and a copy with exactly `fraction` of them changed."""
    rng = np.random.default_rng(seed)
    old = float32_to_bf16_bits(rng.standard_normal(numel, dtype=np.float32) * 0.02)
    want = math.floor(fraction * numel)  # at most the fraction: 20% stays on the threshold
    slack = 6 * (numel * fraction * (1 - fraction)) ** 0.5 / numel  # six binomial sds
    mask = rng.random(numel, dtype=np.float32) < min(1.0, fraction + slack)
    on = np.flatnonzero(mask)
    assert len(on) >= want, "the slack covers the binomial spread"
    mask[on[want:]] = False
    new = old.copy()
    new[mask] ^= rng.integers(1, 0x80, size=want, dtype=np.uint16)  # low mantissa bits move
    return old, new


def median_s(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: page faults, torch's first-call setup
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def backends() -> dict[str, tuple[Callable[[np.ndarray], Any], Callable[[], Any]]]:
    """Each backend's view of a uint16 bits array (no copy), and the context to run it in.

    `torch` is the backend as shipped: CPU tensors use numpy's kernels on views sharing their
    memory. `torch-kern` forces torch's own kernels on CPU, the path CUDA tensors take."""
    out: dict[str, tuple[Callable[[np.ndarray], Any], Callable[[], Any]]] = {
        "numpy": (lambda bits: bits, contextlib.nullcontext)
    }
    if importlib.util.find_spec("torch") is not None:
        import torch

        from loom.state.weights.torch_ops import TORCH_OPS

        def view(bits: np.ndarray) -> Any:
            return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)

        @contextlib.contextmanager
        def torch_kernels() -> Iterator[None]:
            TORCH_OPS.numpy_on_cpu = False
            try:
                yield
            finally:
                TORCH_OPS.numpy_on_cpu = True

        out["torch"] = (view, contextlib.nullcontext)
        out["torch-kern"] = (view, torch_kernels)
    return out


def row(
    backend: str, fraction: float | None, numel: int, enc_s: float, app_s: float, blob: bytes
) -> dict[str, Any]:
    """One backend's figures on a delta of `fraction` changed (None: the dense snapshot),
    printed and returned as a record."""
    what = "dense" if fraction is None else f"{fraction:.0%} changed"
    gb = 2 * numel / 1e9
    enc, app = gb / enc_s, gb / app_s
    ok = "yes" if min(enc, app) >= TARGET_GBS else "NO"
    encoding = read_header(blob).encoding.name.lower()
    print(
        f"{backend:10} {what:11} {encoding:6} blob {len(blob) / 2**20:8.2f} MiB "
        f"({len(blob) / (2 * numel):6.1%})  encode {enc_s * 1e3:7.1f} ms {enc:6.2f} GB/s  "
        f"apply {app_s * 1e3:7.1f} ms {app:6.2f} GB/s  >= {TARGET_GBS} GB/s: {ok}"
    )
    return {
        "record": "codec",
        "backend": backend,
        "case": what,
        "changed_share": fraction,
        "encoding": encoding,
        "blob_mib": len(blob) / 2**20,
        "blob_share": len(blob) / (2 * numel),
        "encode_ms": enc_s * 1e3,
        "encode_gb_s": enc,
        "apply_ms": app_s * 1e3,
        "apply_gb_s": app,
        "target_gb_s": TARGET_GBS,
        "meets_target": ok == "yes",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB and 3 repeats")
    parser.add_argument("--mib", type=int, default=None, help="tensor size in MiB of bf16")
    parser.add_argument("--repeats", type=int, default=None)
    add_json_option(parser)
    args = parser.parse_args()
    mib = args.mib or (16 if args.quick else 256)
    repeats = args.repeats or (3 if args.quick else 5)
    numel = mib * 2**20 // 2
    views = backends()
    setup = {"record": "setup", "mib": mib, "elements": numel, "repeats": repeats}
    setup |= {"cpus": os.cpu_count(), "numpy": np.__version__, "torch": None, "torch_threads": None}
    threads = ""
    if "torch" in views:
        import torch

        setup |= {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
        threads = f", torch {torch.__version__} with {torch.get_num_threads()} threads"
    setup["load_average"] = os.getloadavg()[0]
    threads += f"; load average {setup['load_average']:.2f} before the run"
    print(
        f"{mib} MiB of bf16 ({numel} elements), median of {repeats}; {os.cpu_count()} CPUs"
        f", numpy {np.__version__}{threads}"
    )
    records = [setup]
    for fraction in FRACTIONS:
        old, new = weights(numel, fraction)
        for name, (view, context) in views.items():
            o, n, target = view(old), view(new), view(old.copy())
            with context():
                blob = encode(n, old=o, version=1, base_version=0)
                enc_s = median_s(
                    lambda n=n, o=o: encode(n, old=o, version=1, base_version=0), repeats
                )
                # Applying the same delta again rewrites the same bits: each repeat does full work.
                app_s = median_s(
                    lambda b=blob, t=target: apply(b, t, current_version=0, inplace=True), repeats
                )
            assert np.array_equal(target_bits(target), new), "apply reproduces the new bits"
            records.append(row(name, fraction, numel, enc_s, app_s, blob))
    old, _ = weights(numel, 0.0)
    for name, (view, context) in views.items():
        o, target = view(old), view(np.zeros_like(old))
        with context():
            blob = encode(o, version=1)
            enc_s = median_s(lambda o=o: encode(o, version=1), repeats)
            app_s = median_s(
                lambda b=blob, t=target: apply(b, t, current_version=None, inplace=True), repeats
            )
        records.append(row(name, None, numel, enc_s, app_s, blob))
    # the weights' and the changes' draws are seeded 0
    if out := write_json(args.json, "bench_weight_codec", records, seed=0):
        print(f"wrote {len(records)} records to {out}")


def target_bits(target: Any) -> np.ndarray:
    if isinstance(target, np.ndarray):
        return target
    import torch

    return target.view(torch.int16).numpy().view(np.uint16)


if __name__ == "__main__":
    main()

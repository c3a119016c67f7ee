"""Cost of the checkpoint protocol at a stated size: the marker written at each save, and a resume's start-up.

Builds a fake checkpoint of `--gib` GiB (`model.safetensors` one third, `optimizer.pt` two thirds, real bytes, fsynced;
a small `trainer_state.json`) in `--dir`, then times, `--reps` times each:

- `commit`: what the owner of a folder does after the barrier (`checkpoints.commit`): fsync of every file (already on
  disk: nothing left to write), a stat per file, the marker by atomic rename.
- `plan`: a resume's start-up (`checkpoints.resolve(..., "last")`): the newest committed folder, a stat per file
  against its marker.
- `crc32`: cegppo-trl 0.4's check for comparison, a CRC-32 read of every file (`zlib.crc32` in 4 MiB chunks), which
  its `last` resume did twice and its fresh run once per old checkpoint. Page-cache warm after the first read, so it
  is a lower bound for a cold or network file system.

Prints one JSON line: median seconds of each, per GiB, and the linear extrapolation to `--extrapolate_gb` (85 GB: a 7B
model with its Adam state). Run: ``python benchmarks/bench_commit.py --gib 2 --reps 5``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import tempfile
import time
import zlib

from cegppo_trl.checkpoints import commit, resolve


def _write(path: str, size: int) -> None:
    block = os.urandom(1 << 22)
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.write(block[: size % len(block)])
        f.flush()
        os.fsync(f.fileno())


def _crc32_all(folder: str) -> None:
    for name in sorted(os.listdir(folder)):
        crc = 0
        with open(os.path.join(folder, name), "rb") as f:
            while chunk := f.read(1 << 22):
                crc = zlib.crc32(chunk, crc)


def _median(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the fake checkpoint goes (default: a temporary folder)")
    parser.add_argument("--extrapolate_gb", type=float, default=85.0)
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="cegppo-bench-commit-", dir=args.dir)
    try:
        folder = os.path.join(out, "checkpoint-100")
        os.makedirs(folder)
        total = int(args.gib * (1 << 30))
        _write(os.path.join(folder, "model.safetensors"), total // 3)
        _write(os.path.join(folder, "optimizer.pt"), total - total // 3)
        with open(os.path.join(folder, "trainer_state.json"), "w") as f:
            json.dump(
                {"global_step": 100, "epoch": 0.5, "log_history": [{"loss": 0.1, "step": s} for s in range(100)]}, f
            )
        commit_s = _median(lambda: commit(folder, True, lambda: None), args.reps)
        plan_s = _median(lambda: resolve(out, "last"), args.reps)
        crc_s = _median(lambda: _crc32_all(folder), args.reps)
        scale = args.extrapolate_gb / (total / 1e9)
        print(json.dumps({
            "date": datetime.date.today().isoformat(), "gib": args.gib, "reps": args.reps,
            "commit_s": round(commit_s, 4), "plan_s": round(plan_s, 4), "crc32_read_s": round(crc_s, 3),
            f"crc32_read_s_at_{args.extrapolate_gb:g}GB": round(crc_s * scale, 1),
            f"old_last_resume_s_at_{args.extrapolate_gb:g}GB": round(2 * crc_s * scale, 1),
            "plan_and_commit_scale_with": "files, not bytes",
        }))  # fmt: skip
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

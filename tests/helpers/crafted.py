"""Hostile checkpoints: a checkpoint folder with one file replaced by a pickle that runs code when unpickled."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path


class RunsCodeWhenUnpickled:
    """Unpickling this creates `marker` (`open(marker, "w")`): what a hostile file could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def hostile_bytes(marker: Path, size: int = 0) -> bytes:
    """A pickle (protocol 2, torch's own) of `{"module": RunsCodeWhenUnpickled(marker)}`, padded with zero bytes to
    `size`: unpickling stops at its end, so the file keeps the size of the one it replaces."""
    data = pickle.dumps({"module": RunsCodeWhenUnpickled(marker)}, protocol=2)
    return data + b"\0" * max(0, size - len(data))


def crafted_copy(checkpoint: Path, destination: Path, relative: str, marker: Path) -> Path:
    """Copy `checkpoint` to `destination` with its file `relative` replaced by `hostile_bytes` of the same size, and
    its marker rewritten to match (whoever can plant a file can write the marker too)."""
    from cegppo_trl.checkpoints import COMMIT_FILE, commit

    shutil.copytree(checkpoint, destination)
    target = destination / relative
    target.write_bytes(hostile_bytes(marker, target.stat().st_size))
    if (destination / COMMIT_FILE).exists():
        record = json.loads((destination / COMMIT_FILE).read_text())
        commit(str(destination), True, lambda: None, bool(record.get("save_only_model")))
    return destination

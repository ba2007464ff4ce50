"""Observation images of a run: each stored once as `images/<sha256>.png` under the run directory.

A turn of a visual environment references its image by sha256 (`Turn.image`); the run's manifest lists every file
under `images/` with its hash (`Run.complete({"images": None})`), so a changed or removed image makes the run
refused like any other changed output, and `load` checks the hash again whenever an image is read back.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable
from pathlib import Path

from seedcli.errors import UserError

IMAGES_DIR = "images"


def image_sha(png: bytes) -> str:
    return hashlib.sha256(png).hexdigest()


class ImageStore:
    """PNG files named by their sha256 in `root` (created on the first `put`); `root` None keeps them in memory
    (tests, runs that store no records)."""

    def __init__(self, root: str | os.PathLike | None):
        self.root = None if root is None else Path(root)
        self._memory: dict[str, bytes] = {}

    def put(self, png: bytes) -> str:
        sha = image_sha(png)
        if self.root is None:
            self._memory.setdefault(sha, png)
            return sha
        path = self.root / f"{sha}.png"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(png)
            os.replace(tmp, path)
        return sha

    def path(self, sha: str) -> Path | None:
        return None if self.root is None else self.root / f"{sha}.png"

    def load(self, sha: str) -> bytes:
        """The PNG bytes of `sha`; a missing or changed image is a one-line UserError."""
        if self.root is None:
            if sha not in self._memory:
                raise UserError(f"image {sha[:12]}… is not in this run's memory store")
            return self._memory[sha]
        path = self.root / f"{sha}.png"
        try:
            png = path.read_bytes()
        except OSError:
            raise UserError(
                f"{path}: the image a record refers to is missing; restore the run's images/ folder or re-run the stage"
            ) from None
        if image_sha(png) != sha:
            raise UserError(f"{path}: the image does not match its sha256 (modified or tampered); re-run the stage")
        return png

    def pixels(self, sha: str):
        """The image of `sha` as a uint8 H×W×3 numpy array."""
        return decode_png(self.load(sha))


def run_images(run_dir: str | os.PathLike) -> ImageStore:
    """The image store of a run directory."""
    return ImageStore(Path(run_dir) / IMAGES_DIR)


def check_images(run_dir: str | os.PathLike, trajectories: Iterable) -> int:
    """Every image the trajectories refer to is present and intact; returns how many distinct images they use."""
    store = run_images(run_dir)
    seen: set[str] = set()
    for traj in trajectories:
        for turn in traj.turns:
            if turn.image and turn.image not in seen:
                store.load(turn.image)
                seen.add(turn.image)
    return len(seen)


def decode_png(png: bytes):
    """PNG bytes as a uint8 H×W×3 numpy array."""
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)

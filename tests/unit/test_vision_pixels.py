"""The acting policy (vLLM) and the trainer (the PIL image processor) see the same pixels.

vLLM builds Qwen's torchvision image processor, the trainer the PIL one; both resize a 96×96 Sokoban room to 84×84,
with different resampling. vLLM therefore gets every image already at the size the processor resizes it to,
resized as the PIL processor resizes it (`vision.fit_image`): the torchvision side then has nothing to resize. No
torchvision here, so its resize is stood in for by what it runs on a tensor (torch's antialiased bicubic
interpolation, rounded back to uint8); the difference is measured before and after."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedcli.engines.vision import fit_image, image_processor, processor_size, tiny_image_processor

QWEN_BOUNDS = (3136, 12_845_056)  # Qwen2.5-VL-Instruct's preprocessor_config.json


def _room() -> np.ndarray:
    """A real 96×96 Sokoban frame when the tiles are here, else a random one of that size."""
    try:
        from seedcli.envs.sokoban.game import Sokoban

        return Sokoban(7).image()
    except Exception:  # noqa: BLE001 - no tiles: the measurement does not depend on what the room shows
        return np.random.default_rng(7).integers(0, 256, size=(96, 96, 3), dtype=np.uint8)


def _tensor_resize(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """A torchvision-style resize: float bicubic with antialiasing on the CHW tensor, rounded and clamped to uint8."""
    x = torch.from_numpy(np.array(pixels)).permute(2, 0, 1)[None].float()
    y = torch.nn.functional.interpolate(x, size=(height, width), mode="bicubic", antialias=True, align_corners=False)
    return y.clamp(0, 255).round().to(torch.uint8)[0].permute(1, 2, 0).numpy()


def _pixel_values(processor, image) -> np.ndarray:
    return processor(images=[image], return_tensors="pt")["pixel_values"].numpy()


@pytest.mark.parametrize("bounds", [None, QWEN_BOUNDS], ids=["tiny", "qwen2.5-vl"])
def test_both_sides_see_the_same_pixels_once_the_frame_is_at_the_processors_size(bounds):
    processor = tiny_image_processor() if bounds is None else image_processor(*bounds)
    room = _room()
    height, width = processor_size(processor, *room.shape[:2])
    assert (height, width) == (84, 84)

    # before: each side resizes the 96×96 room itself, with its own resampling
    trainer = _pixel_values(processor, room)
    acting_before = _pixel_values(processor, _tensor_resize(room, height, width))
    before = float(np.abs(trainer - acting_before).max())

    # after: the frame is sent at 84×84, resized as the PIL processor resizes it
    fitted = np.asarray(fit_image(room, processor))
    assert fitted.shape == (84, 84, 3)
    assert np.array_equal(_pixel_values(processor, fitted), trainer)  # the trainer's pixels are unchanged
    assert np.array_equal(_tensor_resize(fitted, height, width), fitted)  # nothing left to resize on the other side
    acting_after = _pixel_values(processor, _tensor_resize(fitted, height, width))
    after = float(np.abs(trainer - acting_after).max())

    assert before > 0.05, before  # normalised units: several uint8 levels apart somewhere in the room
    assert after == 0.0


def test_fit_image_keeps_a_frame_already_at_the_size_and_scales_a_large_one():
    processor = tiny_image_processor()
    exact = np.random.default_rng(0).integers(0, 256, size=(84, 84, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(fit_image(exact, processor)), exact)
    canvas = np.zeros((300, 300, 3), dtype=np.uint8)  # EZPoints' canvas: scaled under the tiny 112×112 bound
    assert fit_image(canvas, processor).size == (84, 84)
    assert fit_image(canvas, image_processor(*QWEN_BOUNDS)).size == (308, 308)  # Qwen's bounds: rounded up to 28s

"""Clips of Gymnasium segments, as the page shows them: looping GIFs with each picture's step counted in a corner
(so that two clips can be compared step for step), a terminated episode's last picture held greyed and marked
with the step it ended at for the padding after it. Used by `postrl label --env` (``segments.py``) and by a running
``postrl control prefs`` that asks people for labels (`postrl.control.prefs_people`)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw, ImageFont


def ended_frame(frame: Image.Image, at_step: int) -> Image.Image:
    """The last picture of a terminated episode (its ``at_step``-th step of the segment), greyed and marked, held
    for the segment's padding."""
    held = frame.convert("L").convert("RGB")
    draw = ImageDraw.Draw(held)
    font = ImageFont.load_default(size=max(12, held.width // 18))
    draw.text(
        (held.width // 30, held.height // 30),
        f"episode ended at step {at_step}",
        fill=(180, 35, 24),
        font=font,
    )
    return held


def counted(frames: list[Image.Image]) -> list[Image.Image]:
    """Copies of ``frames`` with "step i / n" written in the bottom-right corner of each."""
    out = []
    for i, frame in enumerate(frames):
        frame = frame.convert("RGB")  # a copy
        draw = ImageDraw.Draw(frame)
        font = ImageFont.load_default(size=max(10, frame.width // 28))
        text = f"step {i + 1} / {len(frames)}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        margin = frame.width // 40
        xy = (frame.width - (right - left) - margin, frame.height - (bottom - top) - margin)
        draw.text(xy, text, fill=(90, 90, 90), font=font)
        out.append(frame)
    return out


def save_clip(frames: list[Image.Image], path: Path, fps: int) -> None:
    """``frames``, each counted (`counted`), as a looping GIF at ``path`` (written to a temp file, then renamed
    into place)."""
    frames = counted(frames)
    tmp = path.with_name(f".{path.name}.tmp")
    frames[0].save(tmp, format="GIF", save_all=True, append_images=frames[1:], duration=1000 // fps, loop=0)
    tmp.replace(path)

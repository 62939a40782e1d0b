"""Clips of Gymnasium segments, as the page shows them: looping GIFs, a terminated episode's last picture held
greyed and marked for the padding after it. Used by `postrl label --env` (``segments.py``) and by a running
``postrl control prefs`` that asks people for labels (`postrl.control.prefs_people`)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw, ImageFont


def ended_frame(frame: Image.Image) -> Image.Image:
    """The last picture of a terminated episode, greyed and marked, held for the segment's padding."""
    held = frame.convert("L").convert("RGB")
    draw = ImageDraw.Draw(held)
    font = ImageFont.load_default(size=max(12, held.width // 18))
    draw.text((held.width // 30, held.height // 30), "episode ended", fill=(180, 35, 24), font=font)
    return held


def save_clip(frames: list[Image.Image], path: Path, fps: int) -> None:
    """``frames`` as a looping GIF at ``path`` (written to a temp file, then renamed into place)."""
    tmp = path.with_name(f".{path.name}.tmp")
    frames[0].save(tmp, format="GIF", save_all=True, append_images=frames[1:], duration=1000 // fps, loop=0)
    tmp.replace(path)

"""The page's clips: each picture carries its step, a terminated episode's held picture the step it ended at."""

import numpy as np
from PIL import Image, ImageSequence

from postrl.label.clips import counted, ended_frame, save_clip


def _frame(value: int = 255) -> Image.Image:
    return Image.fromarray(np.full((120, 180, 3), value, np.uint8))


def test_each_picture_of_a_clip_is_counted_in_its_corner(tmp_path):
    save_clip([_frame()] * 3, tmp_path / "clip.gif", fps=10)
    frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(Image.open(tmp_path / "clip.gif"))]
    assert len(frames) == 3
    corner = (slice(80, None), slice(90, None))  # bottom right: "step i / 3"
    assert not np.array_equal(frames[0][corner], frames[1][corner])
    assert np.array_equal(frames[0][:60], frames[1][:60])  # the picture itself is the same
    assert (frames[0][:60] == 255).all()


def test_counting_leaves_the_frames_given_alone():
    frame = _frame()
    counted([frame])
    assert (np.asarray(frame) == 255).all()


def test_an_ended_episodes_picture_is_grey_and_says_when_it_ended():
    colour = Image.fromarray(np.dstack([np.full((120, 180), v, np.uint8) for v in (200, 40, 40)]))
    held = np.asarray(ended_frame(colour, at_step=7)).astype(int)
    background = held[100, 10]
    assert background[0] == background[1] == background[2]  # greyed
    assert not np.array_equal(np.asarray(ended_frame(colour, 7)), np.asarray(ended_frame(colour, 12)))

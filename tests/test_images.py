from pathlib import Path

import cv2
import numpy as np
import pytest

from emonet.errors import InputError
from emonet.io.images import (check_distinct_outputs, check_writable_dir, collect_images, read_image, read_images,
                              write_image)


def test_grayscale_rgba_and_16_bit_images_decode_to_rgb(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "gray.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
    cv2.imwrite(str(tmp_path / "rgba.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGRA))
    cv2.imwrite(str(tmp_path / "deep.png"), (rgb[..., ::-1].astype(np.uint16) * 257))
    for name in ("gray.png", "rgba.png", "deep.png"):
        img = read_image(tmp_path / name)
        assert img.shape == (40, 60, 3) and img.dtype == np.uint8, name
    assert np.array_equal(read_image(tmp_path / "deep.png"), rgb)


@pytest.mark.parametrize("content, message", [(b"", "empty"), (b"\xff\xd8\xff\xe0 not really a jpeg", "decode")])
def test_corrupt_or_empty_files(tmp_path, content, message):
    path = tmp_path / "bad.jpg"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        read_image(path)


def test_collect_files_folders_and_globs(tmp_path):
    for name in ("b.jpg", "a.png", "sub/c.jpeg", "notes.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    found = collect_images([str(tmp_path)])
    assert [p.name for p in found] == ["a.png", "b.jpg", "c.jpeg"]
    assert [p.name for p in collect_images([str(tmp_path / "*.jpg"), str(tmp_path / "b.jpg")])] == ["b.jpg"]
    with pytest.raises(InputError, match="no such file or folder"):
        collect_images([str(tmp_path / "missing.jpg")])
    with pytest.raises(InputError, match="matches no file"):
        collect_images([str(tmp_path / "*.bmp")])


def test_writes_are_whole_or_nothing(tmp_path):
    img = np.zeros((8, 8, 3), np.uint8)
    write_image(tmp_path / "x.png", img)
    assert [p.name for p in tmp_path.iterdir()] == ["x.png"]
    with pytest.raises(InputError, match=r"x.png: is a file, not a folder; an output cannot go inside it"):
        check_writable_dir(tmp_path / "x.png" / "sub")  # under a file


def test_outputs_that_would_overwrite_each_other_are_refused(tmp_path):
    (tmp_path / "real.csv").write_text("kept")
    (tmp_path / "link.csv").symlink_to(tmp_path / "real.csv")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "later.json")  # its target not made yet
    for outputs, message in [
        ([("--json", "-"), ("--csv", "-")], "--json - and --csv -: only one output can go to standard output"),
        ([("--csv", f"{tmp_path}/x.csv"), ("--jsonl", f"{tmp_path}/sub/../x.csv")], "name the same file"),
        ([("--csv", tmp_path / "real.csv"), ("--output", tmp_path / "link.csv")], "name the same file"),
        ([("--json", tmp_path / "dangling.json"), ("--csv", tmp_path / "later.json")], "name the same file"),
    ]:
        with pytest.raises(InputError, match=message):
            check_distinct_outputs(outputs)
    check_distinct_outputs([("--output", None), ("--json", "-"), ("--csv", tmp_path / "a.csv")])  # all distinct
    assert (tmp_path / "real.csv").read_text() == "kept" and not (tmp_path / "later.json").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, a folder that takes no file")
def test_a_folder_that_takes_no_file_is_said_as_such():
    with pytest.raises(InputError, match=r"^/proc: no file can be created in this folder \(.+\); give a folder of your own$"):
        check_writable_dir("/proc/")


def test_images_are_read_ahead_in_order_with_the_unreadable_ones_said(tmp_path):
    rng = np.random.default_rng(1)
    paths = []
    for k in range(12):
        paths.append(tmp_path / f"{k:02d}.png")
        if k == 5:
            paths[-1].write_bytes(b"not an image")
        else:
            cv2.imwrite(str(paths[-1]), rng.integers(0, 255, (20 + k, 30, 3), dtype=np.uint8))
    got = list(read_images(paths, ahead=3))
    assert [p for p, _ in got] == paths
    assert isinstance(got[5][1], InputError) and "decode" in str(got[5][1])
    assert all(np.array_equal(img, read_image(p)) for p, img in got if not isinstance(img, InputError))
    taken = read_images(paths, ahead=4)  # a caller that stops early drops the reads not begun
    assert next(iter(taken))[0] == paths[0]
    taken.close()
    assert list(taken) == []

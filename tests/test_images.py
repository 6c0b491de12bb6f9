import cv2
import numpy as np
import pytest

from emonet.errors import InputError
from emonet.io.images import check_writable_dir, collect_images, read_image, write_image


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
    with pytest.raises(InputError, match="cannot write"):
        check_writable_dir(tmp_path / "x.png" / "sub")  # under a file

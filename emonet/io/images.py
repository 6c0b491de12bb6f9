"""Image files: finding them (files, folders, globs), decoding any of them to RGB, writing atomically."""
from __future__ import annotations

import glob
import itertools
import os
import tempfile
from pathlib import Path
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, Optional, Sequence, Union

import cv2
import numpy as np

from ..errors import InputError
from .atomic import write_bytes

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2", ".pgm", ".ppm",
                    ".pbm", ".pnm", ".exr", ".hdr", ".sr", ".ras"}


def collect_images(specs: Iterable[str]) -> list[Path]:
    """Image paths from files, folders (searched recursively) and glob patterns, in a stable order."""
    paths: list[Path] = []
    for spec in specs:
        p = Path(spec).expanduser()
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.suffix.lower() in IMAGE_EXTENSIONS and q.is_file())
            if not found:
                raise InputError(f"{spec}: the folder holds no images ({', '.join(sorted(IMAGE_EXTENSIONS)[:6])}, ...)")
            paths += found
        elif p.is_file():
            paths.append(p)
        elif glob.has_magic(spec):
            found = sorted(Path(q) for q in glob.glob(os.path.expanduser(spec), recursive=True) if Path(q).is_file())
            if not found:
                raise InputError(f"{spec}: the pattern matches no file")
            paths += found
        else:
            raise InputError(f"{spec}: no such file or folder")
    seen, unique = set(), []
    for p in paths:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def read_image(path: Union[str, Path]) -> np.ndarray:
    """Decode any image OpenCV reads to RGB uint8 ``(H, W, 3)``: grayscale, RGBA and 16-bit included."""
    path = Path(path)
    try:
        data = np.fromfile(str(path), dtype=np.uint8)  # also works for non-ASCII paths, unlike imread
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    if data.size == 0:
        raise InputError(f"{path}: the file is empty")
    image = cv2.imdecode(data, cv2.IMREAD_COLOR)  # 3-channel BGR, 8-bit, EXIF orientation applied
    if image is None:
        raise InputError(f"{path}: not an image OpenCV can decode (corrupt, truncated or another format)")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


class ReadAhead:
    """Each path, in order, with its image (as :func:`read_image` gives it) or the :class:`InputError` that says
    why it could not be read. The first ``ahead`` images are decoded from the start, in ``threads`` threads
    (OpenCV decodes without holding the GIL), and each one taken starts the next: the images are decoded
    while the caller loads its model and analyses the ones before. :meth:`close` drops the reads not begun."""

    def __init__(self, paths: Sequence[Union[str, Path]], ahead: int = 8, threads: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="emonet-read")
        self._rest = iter(paths)
        self._pending = deque((Path(p), self._pool.submit(_read_or_error, p))
                              for p in itertools.islice(self._rest, max(1, ahead)))

    def __iter__(self) -> Iterator[tuple[Path, Union[np.ndarray, InputError]]]:
        try:
            while self._pending:
                path, future = self._pending.popleft()
                following = next(self._rest, None)
                if following is not None:
                    self._pending.append((Path(following), self._pool.submit(_read_or_error, following)))
                yield path, future.result()
        finally:
            self.close()

    def close(self) -> None:
        """Stop reading: the reads under way finish, the others are dropped."""
        self._pending.clear()
        self._rest = iter(())
        self._pool.shutdown(wait=False, cancel_futures=True)


def read_images(paths: Sequence[Union[str, Path]], ahead: int = 8, threads: int = 2) -> ReadAhead:
    """The images at ``paths``, decoded ahead (:class:`ReadAhead`); close it if it is not read to the end."""
    return ReadAhead(paths, ahead, threads)


def _read_or_error(path: Union[str, Path]) -> Union[np.ndarray, InputError]:
    try:
        return read_image(path)
    except InputError as exc:
        return exc


def write_image(path: Union[str, Path], rgb: np.ndarray) -> None:
    """Encode by the file's extension and write it whole or not at all (temporary name, then rename)."""
    path = Path(path)
    ok, buf = cv2.imencode(path.suffix or ".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not ok:
        raise InputError(f"{path}: OpenCV cannot write this image format")
    write_bytes(path, buf.tobytes())


def check_output_file(path: Union[str, Path], inputs: Iterable[Union[str, Path]] = ()) -> Path:
    """An output file's path, checked before any work is done: not a folder, not one of ``inputs`` (writing it
    would replace what is being read), and its folder writable."""
    path = Path(path)
    try:
        folder = path.is_dir()
    except OSError as exc:  # (a folder on its way not ours to search)
        raise InputError(f"{path}: cannot write there ({exc.strerror or exc})") from None
    if folder:
        raise InputError(f"{path}: is a folder; give this output a file's name (one inside that folder, say)")
    if any(same_file(path, source) for source in inputs):
        raise InputError(f"{path}: is also an input, which this output would replace; give the output another name")
    check_writable_dir(path.parent)
    return path


STDOUT = "-"  # an output given as "-" goes to standard output


def check_distinct_outputs(outputs: Sequence[tuple[str, Optional[Union[str, Path]]]]) -> None:
    """Refuse (:class:`InputError`) outputs that would overwrite each other: ``outputs`` is (option, path or
    None) in the command line's order; at most one may be ``"-"`` (standard output), and no two may name one
    file (through links too)."""
    given = [(option, str(path)) for option, path in outputs if path is not None and str(path) != ""]
    on_stdout = [option for option, path in given if path == STDOUT]
    if len(on_stdout) > 1:
        raise InputError(f"{' and '.join(o + ' -' for o in on_stdout)}: only one output can go to standard output; "
                         f"give the {'other' if len(on_stdout) == 2 else 'others'} a file name")
    files = [(option, path) for option, path in given if path != STDOUT]
    for i, (option, path) in enumerate(files):
        for other, other_path in files[:i]:
            if same_file(path, other_path):
                raise InputError(f"{other} {other_path} and {option} {path} name the same file, so one would "
                                 f"overwrite the other; give each output a name of its own")


def same_file(a: Union[str, Path], b: Union[str, Path]) -> bool:
    """Whether two paths name one file (through links too), or the same path where neither exists yet."""
    try:
        return Path(a).resolve() == Path(b).resolve() or os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_writable_dir(path: Union[str, Path]) -> Path:
    """Create ``path`` if needed and prove a file can be written there, before any work is done."""
    path = Path(path)
    try:
        blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:  # mkdir would say only "File exists"
            raise InputError(f"{blocking}: is a file, not a folder; an output cannot go inside it")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{path}: cannot write there ({exc.strerror or exc})") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:  # a folder that is there but takes no file (read-only, or a system one such as /proc)
        raise InputError(f"{path}: no file can be created in this folder ({exc.strerror or exc}); give a folder "
                         f"of your own") from None
    return path

"""Video reading: :class:`VideoReader` (one file, camera, stream or numbered images) and :class:`VideoSequence`
(several files, one decoding process), their frames decoded in a child process (:mod:`.decoding`; memory
stays flat) or on NVDEC (:mod:`.nvdec`), uploaded to the GPU where there is one.

The reader streams: a few shared-memory slots and a bounded queue hold the frames decoded ahead, so a
video of any length uses the same memory. Colour conversion is :mod:`.colour`'s, the frames handed out
:mod:`.frames`', writing :mod:`.writer`'s.
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import torch

from ..errors import HelperError, InputError
from . import nvdec
from .colour import colours, host_rgb, i420_to_rgb
from .containers import STALL_SECONDS, end_index, in_run, is_stream_url
from .decoding import Decoder
from .frames import Ending, Frame

__all__ = ["CONVERT_FRAMES", "Ending", "Frame", "VideoReader", "VideoSequence", "colours", "host_rgb", "i420_to_rgb"]

# Frames of a file are converted to RGB on the GPU this many at a time: the conversion is a fixed number
# of tensor operations, shared by the group (files only: a camera's frames go on one by one).
CONVERT_FRAMES = 8


def _kind(source: Union[str, int]) -> tuple[bool, bool, bool]:
    """Whether ``source`` is a camera, a network stream, or numbered images (else: a video file)."""
    camera = isinstance(source, int) or (isinstance(source, str) and source.isdigit())
    url = is_stream_url(source)  # rtsp://, udp://, tcp://, http(s)://, ...: read as it comes, like a camera
    sequence = isinstance(source, str) and "%" in source and not url  # numbered images: "frames/%04d.png"
    return camera, url, sequence


def source_problem(source: Union[str, int]) -> Optional[str]:
    """Why ``source`` cannot be read, where that shows before opening it (a missing file, a folder), else None."""
    if any(_kind(source)):
        return None
    if Path(source).is_dir():
        return f"{source}: is a folder, not a video file"
    if not Path(source).is_file():
        return f"{source}: no such video file"
    return None


class VideoReader:
    """Iterate over ``Frame``s of a file, camera (``"0"``) or numbered images (``"dir/%04d.png"``), decoded ahead in a child process.

    A thread of this process takes each decoded frame and, with a GPU, uploads it (as RGB) on a stream
    of its own. ``keep_host=False`` keeps only that GPU copy (``Frame.image`` then copies it back on
    demand): a run that never draws saves a host copy per frame.

    ``use_nvdec``: a file NVDEC decodes (:mod:`.nvdec`) is decoded there, on a GPU, from its first frame,
    its frames kept on the GPU only; the others as usual, :attr:`nvdec_refused` saying why.
    """

    def __init__(self, source: Union[str, int], start: float = 0.0, end: Optional[float] = None,
                 max_frames: Optional[int] = None, queue_size: int = 32,
                 device: Optional[torch.device] = None, keep_host: bool = True,
                 decoder: Optional[Decoder] = None, use_nvdec: bool = False) -> None:
        self.source = source
        self.device = device if device is not None and torch.device(device).type == "cuda" else None
        self.keep_host = keep_host or self.device is None
        camera, url, sequence = _kind(source)
        problem = source_problem(source)
        # A decoder of several videos (a VideoSequence's) has this one's header next; its thread runs _run.
        self._shared = decoder is not None
        if problem and not self._shared:
            raise InputError(problem)
        source = int(source) if camera else str(source)
        self._nvdec: Optional[nvdec.NvdecVideo] = None
        self.nvdec_refused: Optional[str] = None
        if use_nvdec:
            self.nvdec_refused = ("a camera, a network stream or numbered images" if camera or sequence or url
                                  else "--start" if start > 0
                                  else "several videos share one decoder" if self._shared else problem)
            if self.nvdec_refused is None:
                try:
                    self._nvdec = nvdec.NvdecVideo(source, self.device or torch.device("cpu"))
                except nvdec.Unsupported as exc:
                    self.nvdec_refused = str(exc)
        header: Union[Decoder, nvdec.NvdecVideo]
        if self._nvdec is not None:
            header = self._nvdec
            self.keep_host = False  # the frames are on the GPU; Frame.image copies one back when asked
        else:
            if decoder is None:
                decoder = Decoder([{"source": source, "start": start, "end": end, "max_frames": max_frames}],
                                   pin=self.device is not None)
            try:
                decoder.next_video(source)
            except InputError as exc:
                if not self._shared:
                    decoder.close()
                raise InputError(problem) if problem else exc
            if problem:  # the decoder opened what is not there any more: read past it
                decoder.skip()
                raise InputError(problem)
            header = decoder
        self._decoder = decoder
        self.fps = header.fps
        if not (0 < self.fps < 1000):
            self.fps = 30.0  # cameras and some files report nothing usable
        self.frame_count = header.frame_count
        self._layout = header.layout
        # (H, W, 3) of the first frame (zeros for a video without frames); updated if frames change size.
        self.frame_shape = header.shape
        self.start, self.end, self.max_frames = start, end, max_frames
        self.first_index = int(round(start * self.fps)) if start > 0 else 0
        if self.frame_count and self.first_index >= self.frame_count:  # (never NVDEC's: it starts at 0)
            decoder.skip() if self._shared else decoder.close()
            raise InputError(f"{source}: --start {start:g} s is past the end of the video "
                             f"({self.frame_count / self.fps:.2f} s, {self.frame_count} frames)")
        self.decode_seconds = 0.0
        self.frames_read = 0
        self.ending: Optional[Ending] = None  # how the frames ended, once read to the end
        self._camera = camera
        # Frames as they come (a camera, a network stream without a duration): dropped (and counted) when the
        # analysis is behind, a few held at most.
        self.live = bool(getattr(header, "live", False))
        self._url = url and self.live
        self._queue: "queue.Queue[Optional[Frame]]" = queue.Queue(maxsize=2 if self.live else queue_size)
        self._stop = threading.Event()
        self._done = threading.Event()  # _run has ended: this video's frames are all taken from the decoder
        self._error: Optional[BaseException] = None
        # Started on the first iteration, not here: the child decodes only a few frames ahead until then.
        # A shared decoder's thread (the VideoSequence's) takes its place.
        self._thread = threading.Thread(target=self._run, name="emonet-frames", daemon=True)

    @property
    def nvdec(self) -> bool:
        """True when NVDEC decodes the frames (on the GPU)."""
        return self._nvdec is not None

    @property
    def expected_frames(self) -> Optional[int]:
        """How many frames the run will see, when the container says (for the progress bar)."""
        if not self.frame_count:
            return self.max_frames
        last = self.frame_count if self.end is None else min(self.frame_count, end_index(self.end, self.fps))
        n = max(0, last - self.first_index)
        return min(n, self.max_frames) if self.max_frames else n

    @property
    def shortfall(self) -> Optional[str]:
        """Why the frames read are not the whole video asked for, or None: decoding stopped at damaged data,
        or the file ended before the frame count it declares. (Known once its frames are all read.)"""
        ending = self.ending
        if ending is None or self._camera:
            return None
        if self._url:  # a live stream ends when its sender stops; only a stall or a break is a shortfall
            return (f"the stream stalled (nothing for {STALL_SECONDS:g} s) or broke off after {self.frames_read} frames"
                    if ending.damaged else None)
        limited = self.end is not None or (self.max_frames is not None and self.frames_read >= self.max_frames)
        wanted = ending.declared - self.first_index
        short = not limited and ending.declared and self.frames_read < wanted
        if short:
            return (f"read {self.frames_read} of the {wanted} frames the file declares"
                    + (" (decoding stopped at damaged data)" if ending.damaged else " (truncated?)"))
        if ending.damaged:
            return f"decoding stopped at damaged data after {self.frames_read} frames"
        return None

    def _put(self, frame: Frame) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(frame, timeout=0.1)
                return
            except queue.Full:
                continue

    def pump(self) -> None:
        """Take this video's frames from the decoder into the queue, in the calling thread, until they are all
        taken or the reader is stopped (a shared decoder's thread does this for each video in turn)."""
        self._thread = threading.current_thread()
        self._run()

    def stop(self) -> None:
        """Stop taking frames (a frame waiting in the full queue is dropped so the taking thread sees it)."""
        self._stop.set()
        try:
            self._queue.get_nowait()
        except queue.Empty:
            pass

    def _run(self) -> None:
        try:
            self._take_nvdec() if self._nvdec is not None else self._take_decoded()
        except BaseException as exc:  # reported to the consumer, never lost in the thread
            self._error = exc
        finally:
            self._put_end()
            if self._shared:
                self._decoder.skip()  # stopped early: the next video's header comes after this one's frames
            self._done.set()

    def _time(self, index: int, shown: Optional[float]) -> float:
        """A frame's timestamp: its presentation time where the source gives one, else its index over the rate."""
        return shown if shown is not None else index / self.fps

    def _put_rgb(self, indices: Sequence[int], yuv: torch.Tensor, stream: "torch.cuda.Stream", nv12: bool = False,
                 hosts: Optional[Sequence[Optional[np.ndarray]]] = None,
                 times: Optional[Sequence[Optional[float]]] = None) -> None:
        """Frames ``indices`` from one conversion of their planes ``yuv`` on ``stream``, each a view of the result."""
        rgb = i420_to_rgb(yuv, *colours(self._layout), nv12=nv12)
        ready = torch.cuda.Event()
        ready.record(stream)
        for k, i in enumerate(indices):
            self._put(Frame(i, self._time(i, times[k] if times else None), host=hosts[k] if hosts else None,
                            pixels=rgb[k], ready=ready))

    def _take_decoded(self) -> None:
        """The decoding process's frames, uploaded (on a GPU) and queued."""
        index = self.first_index
        colour = colours(self._layout)  # None: BGR frames
        stream = torch.cuda.Stream(self.device) if self.device is not None else None
        if stream is not None:
            torch.cuda.set_stream(stream)  # current streams are per thread: this one's, for good
        group: list[tuple[int, Optional[np.ndarray], Optional[float]]] = []  # I420 frames uploaded, not converted
        raw: Optional[torch.Tensor] = None

        def convert() -> None:
            # One conversion for the group, on this thread's stream.
            nonlocal raw
            if not group:
                return
            self._put_rgb([i for i, _, _ in group], raw[:len(group)], stream, hosts=[host for _, host, _ in group],
                          times=[t for _, _, t in group])
            group.clear()
            raw = None

        for array, seconds, slot, shown in self._decoder.frames():
            if self._stop.is_set():  # (--end and --max-frames: the decoding process stops there)
                self._decoder.release(slot)
                break
            self.decode_seconds += seconds
            self.frame_shape = self._decoder.shape
            self.frames_read += 1
            if stream is None:
                frame = Frame(index, self._time(index, shown), host=host_rgb(array, colour))
            elif colour is None:
                # Uploaded as decoded and turned into RGB on the GPU: no CPU colour conversion unless a
                # host copy is wanted, made while the upload runs.
                pixels = torch.from_numpy(array).to(self.device, non_blocking=True).flip(-1)
                ready = torch.cuda.Event()
                ready.record(stream)
                host = host_rgb(array, colour) if self.keep_host else None
                ready.synchronize()  # the slot is reused once this returns
                frame = Frame(index, self._time(index, shown), host=host, pixels=pixels, ready=ready)
            else:
                if raw is not None and tuple(raw.shape[1:]) != array.shape:
                    convert()  # the video changed size
                if raw is None:
                    raw = torch.empty((CONVERT_FRAMES, *array.shape), dtype=torch.uint8, device=self.device)
                raw[len(group)].copy_(torch.from_numpy(array), non_blocking=True)
                uploaded = torch.cuda.Event()
                uploaded.record(stream)
                group.append((index, host_rgb(array, colour) if self.keep_host else None, shown))
                uploaded.synchronize()  # the slot is reused once this returns
                frame = None
            self._decoder.release(slot)
            if frame is not None:
                self._put(frame)
            elif len(group) == CONVERT_FRAMES or self.live:  # a live frame goes on at once
                convert()
            index += 1
        convert()
        self.ending = self._decoder.ending

    def _take_nvdec(self) -> None:
        """NVDEC's frames, a batch at a time, converted where they are and queued."""
        stream = self._nvdec.stream
        torch.cuda.set_stream(stream)  # NVDEC's copies are queued on it: read the frames there
        index = 0
        while not self._stop.is_set():
            t0 = time.perf_counter()
            planes = self._nvdec.next_batch()
            self.decode_seconds += time.perf_counter() - t0
            # Where the run ends, as the decoding process reckons it (NVDEC decodes from the first frame).
            planes = [p for k, p in enumerate(planes)
                      if in_run(index + k, index + k, self.fps, self.max_frames, self.end)]
            if not planes:
                break
            while planes:  # frames of one size at a time (a video may change size)
                same = next((k for k, p in enumerate(planes) if p.shape != planes[0].shape), len(planes))
                h, w = planes[0].shape
                self.frame_shape = (h * 2 // 3, w, 3)
                times = self._nvdec.times[index:index + same]  # from the packets (NVDEC does not say)
                self._put_rgb(range(index, index + same), torch.stack(planes[:same]), stream, nv12=True,
                              times=times if len(times) == same else None)
                index += same
                self.frames_read += same
                planes = planes[same:]
        limited = self.max_frames is not None and index >= self.max_frames or self.end is not None
        self.ending = Ending(index, 0 if limited else self._nvdec.declared)

    def _put_end(self) -> None:
        while True:
            try:
                self._queue.put(None, timeout=0.1)
                return
            except queue.Full:
                if self._stop.is_set():
                    return

    def prefetch(self) -> None:
        """Start taking (and uploading) decoded frames now, before the first iteration (which starts it anyway)."""
        if self._thread.ident is None and not self._shared:
            self._thread.start()

    def ready(self) -> bool:
        """A frame (or the end) is waiting: taking it now would not wait."""
        return not self._queue.empty()

    def __iter__(self) -> Iterator[Frame]:
        self.prefetch()
        while True:
            item = self._queue.get()
            if item is None:
                if isinstance(self._error, HelperError):  # the decoding process died: not the input's fault
                    raise HelperError(f"{self.source}: {self._error}")
                if self._error is not None:
                    raise InputError(f"{self.source}: decoding failed ({self._error})")
                return
            yield item

    def close(self) -> None:
        """Stop decoding and release the file or camera (a shared decoder goes on with the next video)."""
        self._stop.set()
        if not self._shared and self._decoder is not None and self._decoder.process.poll() is None:
            self._decoder.process.kill()  # also ends a wait of the thread for the next frame
        while self._thread.is_alive() and not self._done.is_set():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._done.wait(timeout=0.1)
        if not self._shared:
            self._thread.join() if self._thread.is_alive() else None
            if self._decoder is not None:
                self._decoder.close()
        if self._nvdec is not None:
            self._nvdec.close()


class VideoSequence:
    """The readers of several video files, decoded one after the other by one decoding process, without a
    pause between them: a collection's.

    One thread takes every video's frames in turn (uploading them, as :class:`VideoReader`'s own thread
    does), so the next video's first frames are decoded and uploaded while this one's last are analysed,
    and no video waits for a process to start. :meth:`next` gives each video's reader in order, or raises
    its :class:`InputError`; take one after the last one's frames, close each when done with it, and the
    sequence at the end.
    """

    def __init__(self, sources: Sequence[Union[str, Path]], start: float = 0.0, end: Optional[float] = None,
                 max_frames: Optional[int] = None, device: Optional[torch.device] = None,
                 keep_host: bool = True) -> None:
        self.sources = [str(s) for s in sources]
        self.options = dict(start=start, end=end, max_frames=max_frames, device=device, keep_host=keep_host)
        gpu = device is not None and torch.device(device).type == "cuda"
        self._decoder = Decoder([{"source": s, "start": start, "end": end, "max_frames": max_frames}
                                  for s in self.sources], pin=gpu)
        self._readers: "queue.Queue[Union[VideoReader, InputError, None]]" = queue.Queue()
        self._stop = threading.Event()
        self._current: Optional[VideoReader] = None
        self._thread = threading.Thread(target=self._pump, name="emonet-frames", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for source in self.sources:
            if self._stop.is_set():
                break
            try:
                reader = VideoReader(source, decoder=self._decoder, **self.options)
            except InputError as exc:
                self._readers.put(exc)
                continue
            self._current = reader
            if self._stop.is_set():  # closed meanwhile: this reader stops at once
                reader.stop()
            self._readers.put(reader)
            reader.pump()  # until this video's frames are all taken (or it is closed)
        self._readers.put(None)

    def next(self) -> VideoReader:
        """The next video's reader (frames already coming); raises its :class:`InputError`."""
        item = self._readers.get()
        if item is None:
            raise RuntimeError("every video of the sequence has been read, or it was closed")
        if isinstance(item, InputError):
            raise item
        return item

    def close(self) -> None:
        """Stop decoding; readers not yet closed stop too."""
        self._stop.set()
        if self._decoder.process.poll() is None:
            self._decoder.process.kill()  # also ends the thread's wait for the next message
        while self._thread.is_alive():
            if self._current is not None:
                self._current.stop()
            self._thread.join(timeout=0.1)
        self._decoder.close()

"""The drawing child process of :class:`emonet.drawing.process.DrawingProcess`: annotated frames planned,
drawn and handed to the encoders away from the analysing process.

Started by :func:`emonet.io.helper.start_helper` (``main(DEVICE)``). In the analysing process, planning the marks (NumPy,
OpenCV) and queueing the drawing's tensor operations took the main thread's GIL for about as long as
the analysis itself, and the encoders' hand-over waited behind it; here they run beside it, on a GIL
of their own, on the same GPU.

Protocol: :mod:`emonet.io.ipc` messages both ways, the parent's pickled by torch's multiprocessing
pickler (a CUDA tensor crosses as a CUDA IPC handle: the frames stay on the GPU). Parent to child:

- ``("open", video, spec)``: a new video, numbered ``video`` (``path``, ``fps``, ``class_names``, ``banner``,
  ``codec``, and ``frame``, the ``(H, W)`` of its first frame if known: its encoder's ring is
  made at once); the next one may open before the last one is closed (its final frames come later);
- ``("warm", (H, W))``: draw a throwaway frame of that size (the parent's model is loading meanwhile);
- ``("ring", frames, events)``: on a GPU, the parent's ``(slots, capacity, H, W, 3)`` uint8 frame ring and
  one interprocess event per slot, recorded once a slot's frames are copied in;
- ``("chunk", video, slot, frames, indices, faces, colors)``: frames to draw, those of ``slot`` of the ring
  when ``slot`` is not None, else ``frames`` itself, a list of ``(H, W, 3)`` uint8 arrays or tensors;
- ``("close", video)``: finish the video; the child answers ``("closed", video, report)``.

Child to parent: ``("ready", events)`` once torch and the device are up (on a GPU, one interprocess
event per ring slot, recorded once the slot's frames have been read); ``("done", slot)`` per chunk,
once drawn and handed to the encoders; ``("error", video, message)`` once when a video cannot be written
(its later chunks are only acknowledged); ``("closed", video, report)``. At the end of its input it
finishes the open videos and exits. It ignores Ctrl-C: the parent, which sees it too, finishes the video.
"""
from __future__ import annotations

import sys


def _warm_up(device, shape=(240, 320)) -> None:
    """Plan, draw and convert two frames of ``shape`` (a throwaway canvas): a process's first use of each GPU
    kernel loads it (and OpenCV's first text its font), and the sprites of a frame size (the panel's disc,
    a face's, "no face") are made once; the first video's first chunks would otherwise wait for them."""
    import torch

    from emonet.drawing.canvas import VideoCanvas
    from emonet.drawing.planning import warm_faces

    h, w = shape
    faces, colors = warm_faces(shape)
    canvas = VideoCanvas([f"class {k}" for k in range(8)], "warm-up", device)
    images = [torch.zeros((h, w, 3), dtype=torch.uint8, device=device)] * 2
    for _ in range(2):  # the second chunk takes the paths of kept sprites
        canvas.draw(images, faces, colors).cpu()


def main(device_name: str) -> int:
    from emonet.io.encode_worker import Spare

    spare = Spare()  # the first video's encoder starts now, beside torch's import, not when the video opens
    import numpy as np
    import torch

    from emonet.drawing.process import SLOTS, VideoDrawing  # (the canvas and the encoders' writer with it)
    from emonet.io.ipc import messages, send

    out = sys.stdout.buffer
    device = torch.device(device_name)
    events = None
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.set_num_threads(1)  # the tensor work is the GPU's
        torch.zeros(1, device=device)  # the CUDA context now, not on the first frames
        # Recorded once a slot's frames have been read: the parent waits on it before copying in again.
        events = [torch.cuda.Event(interprocess=True) for _ in range(SLOTS)]
        for event in events:
            event.record()
    _warm_up(device)
    send(out, ("ready", [e.ipc_handle() for e in events] if events else None))

    videos: dict[int, VideoDrawing] = {}
    warm: set[tuple[int, int]] = set()  # frame sizes drawn once already
    ring = copied = None
    for message in messages(sys.stdin.buffer):
        kind = message[0]
        if kind == "open":
            _, number, spec = message
            video = videos[number] = VideoDrawing(spec, device, spare)
            if video.failed is not None:
                send(out, ("error", number, video.failed))
        elif kind == "warm":
            if message[1] not in warm:
                _warm_up(device, shape=message[1])
                warm.add(message[1])
        elif kind == "ring":
            _, ring, handles = message
            copied = [torch.cuda.Event.from_ipc_handle(device, h) for h in handles]
        elif kind == "chunk":
            _, number, slot, frames, indices, faces, colors = message
            video = videos[number]
            if slot is not None:
                torch.cuda.current_stream().wait_event(copied[slot])
                images = list(ring[slot, :len(indices)])
            else:
                images = [torch.as_tensor(np.asarray(f) if not torch.is_tensor(f) else f).to(device) for f in frames]
            if video.failed is None:
                try:
                    video.draw(images, indices, faces, colors)
                except Exception as exc:  # noqa: BLE001
                    video.failed = f"{exc}"
                    send(out, ("error", number, video.failed))
            if slot is not None:
                events[slot].record()  # the slot's frames are read once what is queued so far has run
            del images
            send(out, ("done", slot))
        elif kind == "close":
            send(out, ("closed", message[1], videos.pop(message[1]).close()))
    for video in videos.values():  # the parent ended without closing them: keep what was drawn
        video.close()
    spare.close()
    return 0


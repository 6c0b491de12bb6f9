"""What helper processes share with this one (emonet.io.ipc): framed messages both ways, a shared-memory ring."""
import io
import json
from pathlib import Path

import numpy as np

from emonet.io import ipc
from emonet.io.decode_worker import Kind
from emonet.io.helper import start_helper


def test_messages_cross_a_stream_in_order_and_a_cut_off_one_is_the_end():
    stream = io.BytesIO()
    sent = [("I", 25.0, 3, 240, 320, 16, "/dev/shm/x", "i420:601:limited"), ("F", 2, 240, 320, 0.001, None),
            ("B", 1, 2, 0.0, 1.5, b"\x00" * 100_000), ("D", 3, 3, False)]
    for message in sent:
        ipc.send(stream, message)
    whole = stream.getvalue()
    assert list(ipc.messages(io.BytesIO(whole))) == sent
    cut = io.BytesIO(whole[:-5])  # the writer died mid-message: what came whole, then the end
    assert list(ipc.messages(cut)) == sent[:-1]
    assert ipc.receive(io.BytesIO(b"")) is None


def test_a_ring_is_shared_by_two_mappings_and_leaves_no_file():
    ring = ipc.Ring.create(3, 1000, folders=("/no/such/folder", *ipc.FOLDERS))
    assert ring is not None and Path(ring.path).parent != Path("/no/such/folder")
    other = ipc.Ring.attach(ring.path, 3)
    ring.unlink()
    assert not Path(ring.path).exists() and other.slot_bytes == 1000
    ring.view(1, (10, 100))[:] = 7
    assert (other.slot(1) == 7).all() and (other.slot(0) == 0).all() and (other.slot(2) == 0).all()
    assert ring.view(1, (10, 100)) is ring.view(1, (10, 100))  # one array per slot and shape
    ring.close()
    other.close()
    assert ipc.Ring.create(2, 1 << 20, folders=("/no/such/folder",)) is None


def test_the_decoding_helper_speaks_the_protocol_and_hands_frames_over_in_its_ring(tmp_path):
    import cv2

    path = tmp_path / "grey.avi"  # 4 frames, brightness 40, 80, 120, 160 (OpenCV writes it; either decoder reads it)
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (64, 48))
    for level in (40, 80, 120, 160):
        out.write(np.full((48, 64, 3), level, np.uint8))
    out.release()
    spec = {"videos": [{"source": str(path), "start": 0.0}, {"source": str(tmp_path / "none.avi"), "start": 0.0}],
            "slots": 2, "budget": 1 << 20, "folders": list(ipc.FOLDERS)}
    proc = start_helper("emonet.io.decode_worker:main", json.dumps(spec), quiet=True)
    kind, fps, count, h, w, slots, ring_path, layout, live = ipc.receive(proc.stdout)
    assert (kind, fps, count, h, w, slots, live) == (Kind.INFO, 10.0, 4, 48, 64, 2, False)
    ring = ipc.Ring.attach(ring_path, slots)
    ring.unlink()
    means = []
    while (message := ipc.receive(proc.stdout))[0] == Kind.FRAME:
        _, slot, fh, fw, seconds, shown = message
        shape = (fh, fw, 3) if layout == "bgr" else (fh * 3 // 2, fw)
        means.append(round(float(ring.view(slot, shape)[:fh].mean())))
        ipc.send(proc.stdin, (Kind.RELEASE, slot))  # two slots: the helper waits for each to come back
    assert message == (Kind.END, 4, 4, False, 0)
    assert [abs(m - level) <= 3 for m, level in zip(means, (40, 80, 120, 160))] == [True] * 4
    # The second video cannot be opened; the helper says so and goes on.
    assert ipc.receive(proc.stdout) == (Kind.CANNOT_OPEN,)
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0 and ipc.receive(proc.stdout) is None
    ring.close()

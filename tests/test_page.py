"""The browser page, in a real browser: Debian's Chromium, headless, its fake camera fed from a real clip's
frames, against emonet-serve on loopback (CPU, random weights)."""
import io
import os
import shutil
import time
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

from .test_serve import start_server  # noqa: E402

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
# CI installs the browser and must run this test; a developer's machine without it skips it, saying how to get it.
if not (CHROMIUM and DRIVER) and not os.environ.get("CI"):
    pytest.skip("the page is tested in a real browser: apt-get install chromium chromium-driver (CI always does)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def server():
    proc, url = start_server()
    yield url
    proc.terminate()
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def camera_file(tmp_path_factory) -> Path:
    """A Y4M file of a real clip's frames (the sample photo's face moving), what Chromium's fake camera plays."""
    from emonet.bench.run import make_clip
    folder = tmp_path_factory.mktemp("camera")
    clip = make_clip(folder / "clip.mp4", width=640, height=480, frames=10, fps=10.0)
    path = folder / "camera.y4m"
    with av.open(str(clip)) as source, av.open(str(path), mode="w", format="yuv4mpegpipe") as out:
        stream = out.add_stream("rawvideo", rate=10)
        stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
        for frame in source.decode(video=0):
            for packet in stream.encode(frame.reformat(format="yuv420p")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


@pytest.fixture(scope="module")
def browser(camera_file):
    assert CHROMIUM and DRIVER, ("the page is tested in a real browser: apt-get install chromium chromium-driver "
                                 "(.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,800",
                "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-video-capture={camera_file}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def overlay_pixels(driver) -> int:
    """How many pixels of the page's overlay canvas are drawn on."""
    return driver.execute_script(
        "const c = document.getElementById('overlay'); const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;")


def test_the_page_streams_the_webcam_and_draws_the_results(server, browser):
    browser.get(server + "/")
    assert browser.title == "EmoNet live"
    stage = browser.find_element("id", "stage")
    before = np.asarray(Image.open(io.BytesIO(stage.screenshot_as_png)).convert("RGB"), dtype=np.int16)
    assert overlay_pixels(browser) == 0
    browser.find_element("id", "start").click()
    deadline = time.monotonic() + 240
    while int(browser.find_element("id", "frames").text) < 3:
        assert time.monotonic() < deadline, browser.find_element("id", "status").text
        time.sleep(0.5)
    assert browser.find_element("id", "status").text == "streaming"
    assert overlay_pixels(browser) > 500  # a box and its label drawn over the face
    after = np.asarray(Image.open(io.BytesIO(stage.screenshot_as_png)).convert("RGB"), dtype=np.int16)
    assert after.shape == before.shape and np.abs(after - before).max(axis=2).astype(bool).mean() > 0.05
    assert "ms" in browser.find_element("id", "latency").text and "ms" in browser.find_element("id", "first").text
    assert browser.find_element("id", "notice").text.endswith("untrained weights: predictions are meaningless")
    assert browser.find_element("id", "warning").text == ""  # no bad frame, no refusal
    assert browser.find_element("id", "save").is_enabled()  # the session's rows can be saved as CSV
    rows = browser.execute_script("return rows.length")
    assert rows >= 3
    browser.find_element("id", "stop").click()
    assert browser.find_element("id", "status").text == "stopped"

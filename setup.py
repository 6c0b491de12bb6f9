from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="emonet",
    version="0.2.0",
    description="Facial expression, valence, arousal and landmarks from faces in photos, videos and "
                "datasets with EmoNet (Toisoul et al., Nature Machine Intelligence 2021)",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["emonet", "emonet.*"]),
    # The detectors' weights (BlazeFace 1 MB and YuNet 0.4 MB, Apache-2.0; ONet, MIT; MMOD 0.7 MB, public domain)
    # ship with the package, with their notices.
    package_data={"emonet.detection": ["blazeface.pth", "NOTICE.blazeface", "LICENSE.blazeface", "onet.pth", "NOTICE.onet",
                                      "yunet.pth", "NOTICE.yunet", "LICENSE.yunet", "mmod.pth", "NOTICE.mmod"],
                  "emonet.engine": ["astronaut.jpg"], "emonet.serve": ["static/*.html"]},
    install_requires=[
        "torch>=2.1",
        "opencv-python>=4.5",
        "face-alignment>=1.4",
        "numpy>=1.22",
        "tqdm>=4.60",
        "av>=12",             # H.264 annotated video (its wheels carry FFmpeg with libx264)
        "matplotlib>=3.5",    # per-video plots
    ],
    # scikit-image, scikit-learn: their sample photos (faces and not) are the detector tests' real photos.
    # PyNvVideoCodec: NVIDIA's decoder (NVDEC) for annotated videos, on NVIDIA GPUs.
    # serve: the HTTP/WebSocket service (FastAPI with uvicorn, the ecosystem's convention; python-multipart
    # reads uploads; websockets speaks WebSocket for uvicorn; prometheus-client writes /metrics).
    # test: also a real browser's driver (Selenium, for Debian's Chromium) and a WebSocket client.
    # Pillow reads an upload's dimensions from its header, before anything is decoded.
    # export: ONNX (onnxscript is PyTorch's exporter's, onnxruntime checks the file before it is written).
    extras_require={"export": ["onnx>=1.16", "onnxscript>=0.2", "onnxruntime>=1.18"],
                    "serve": ["fastapi>=0.110", "uvicorn>=0.29", "python-multipart>=0.0.9", "websockets>=12",
                              "prometheus-client>=0.20", "pillow>=9"],
                    "test": ["pytest>=7", "scikit-image>=0.21", "scikit-learn>=1.0", "fastapi>=0.110", "uvicorn>=0.29",
                             "python-multipart>=0.0.9", "websockets>=12", "prometheus-client>=0.20", "pillow>=9", "httpx>=0.27",
                             "selenium>=4.20", "onnx>=1.16", "onnxscript>=0.2", "onnxruntime>=1.18"],
                    "nvdec": ["PyNvVideoCodec>=2.0"]},
    entry_points={"console_scripts": [
        "emonet-photo = emonet.apps.photo:cli",
        "emonet-video = emonet.apps.video:cli",
        "emonet-eval = emonet.apps.evaluate:cli",
        "emonet-bench = emonet.bench.run:main",
        "emonet-serve = emonet.apps.serve:main",
        "emonet-export = emonet.apps.export:main",
        "emonet-train = emonet.apps.train:main",
    ]},
    license="MIT (code); the released EmoNet weights are CC BY-NC-ND 4.0",
)

"""The command-line tools: arguments and scheduling only; the work is the package's pipeline.

``emonet-photo`` (:mod:`.photo`), ``emonet-video`` (:mod:`.video`), ``emonet-eval`` (:mod:`.evaluate`);
``demo.py``, ``demo_video.py`` and ``test.py`` in a checkout are thin wrappers around them.
"""

"""``python -m emonet.bench`` (``emonet-bench``)."""
import sys

from .run import main

sys.exit(main())

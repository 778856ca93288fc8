"""`python -m onnx_tts.server [options]`: the same as `onnx-tts serve [options]`."""

import sys

from onnx_tts.server.cli import main

sys.exit(main())

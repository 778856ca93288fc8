"""`python -m onnx_tts.server [options]`: the same as `onnx-tts serve [options]`."""

import sys

from onnx_tts.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))

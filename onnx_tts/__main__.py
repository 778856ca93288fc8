"""`python -m onnx_tts ...`: the same as the `onnx-tts` command."""

import sys

from onnx_tts.cli import main

sys.exit(main())

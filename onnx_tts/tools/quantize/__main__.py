"""python -m onnx_tts.tools.quantize"""

from onnx_tts.tools.quantize.cli import main

raise SystemExit(main())

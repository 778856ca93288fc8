"""python -m onnx_tts.tools.convert"""

from onnx_tts.tools.convert.cli import main

raise SystemExit(main())

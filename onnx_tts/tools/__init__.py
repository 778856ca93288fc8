"""Offline tools that work on ONNX files: graph surgery (`convert`), weight quantization
(`quantize`), both over any family's model from the files the family declares (`model_dir`,
`onnx_tts/families/files.py`), and the one graph builder (`graph_builder`) that export recipes,
benchmarks and tests write graphs with.

Nothing in the runtime (`onnx_tts.*`, families, decoding) imports this package: loading and
synthesizing never pay for it, and its checks run graphs through the same session core.
"""

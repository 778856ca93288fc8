"""Family-neutral backbones the exporters share (torch modules loaded by tensor name, and their
ONNX export as an LM-with-past): `qwen3`."""

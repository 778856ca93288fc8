"""Running onnx-tts past one process: Ray Serve (onnx_tts.deploy.ray)."""

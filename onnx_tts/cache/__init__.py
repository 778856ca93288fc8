"""Caches of onnx-tts: a tiered composition of storage tiers and the typed caches built on it.

* :mod:`~onnx_tts.cache.tier`: the ``Tier`` protocol; one module per tier:
  :mod:`~onnx_tts.cache.memory`, :mod:`~onnx_tts.cache.disk`, :mod:`~onnx_tts.cache.redis`.
* :mod:`~onnx_tts.cache.tiered`: the composition (lookup order, promotion, single flight,
  per-tier counters, stats and clear).
* :mod:`~onnx_tts.cache.codec`: the one serialisation of values (checksums, HMAC signatures);
  :mod:`~onnx_tts.cache.schema`: the one check of values read or stored.
* :mod:`~onnx_tts.cache.typed`: the standard memory / disk / Redis stack of the typed caches:
  :mod:`~onnx_tts.cache.reference` (voice encodes), :mod:`~onnx_tts.cache.result` (finished
  audio), :mod:`~onnx_tts.cache.prefix` (voice-prefix KV values).
* :mod:`~onnx_tts.cache.manage`: ``onnx-tts cache stats|clear``.
"""

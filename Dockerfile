# onnx-tts: the OpenAI-compatible speech server in a container.
#   docker build -t onnx-tts .
#   docker run --rm -p 8880:8880 onnx-tts          # then: curl localhost:8880/health
# Stage 1 builds the wheel (the C++ core needs a compiler; ONNX Runtime's headers are vendored
# in third_party/, CMake and ninja come from the package index); stage 2 installs only that
# wheel and its runtime dependencies, and runs as an unprivileged user.

FROM python:3.11-slim-bookworm AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml CMakeLists.txt README.md LICENSE ./
COPY csrc ./csrc
COPY third_party ./third_party
COPY onnx_tts ./onnx_tts
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --create-home --home-dir /var/lib/onnx-tts onnx-tts
USER 10001
WORKDIR /var/lib/onnx-tts
# Caches (reference voices, results) and uploaded voices live under the user's home: mount a
# volume at /var/lib/onnx-tts to keep them across containers.
ENV XDG_CACHE_HOME=/var/lib/onnx-tts/cache PYTHONUNBUFFERED=1
EXPOSE 8880
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8880/health', timeout=4)"]
# SIGTERM (docker stop) drains in-flight requests for up to --drain-seconds (30): give
# `docker stop -t 40` or more.
ENTRYPOINT ["onnx-tts"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8880"]

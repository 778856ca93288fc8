"""The web page at `/`, its assets and the offline `/docs`: served from package data, with the
right content types, and nothing in them that a browser would fetch from another host.
(tools/check_web_page.py drives the page itself in headless Chromium.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from onnx_tts.server import ServerConfig, create_app
from onnx_tts.server.engines import ModelRegistry
from onnx_tts.server.web import ASSETS, asset


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    # No lifespan: the page and its assets need no model.
    voices = tmp_path_factory.mktemp("web") / "voices"
    app = create_app(ServerConfig(voices_dir=str(voices)), ModelRegistry([None]))
    return TestClient(app)


@pytest.mark.parametrize(
    ("path", "media_type"),
    [
        ("/", "text/html"),
        ("/docs", "text/html"),
        ("/static/app.js", "text/javascript"),
        ("/static/style.css", "text/css"),
    ],
)
def test_pages_and_assets_are_served(client: TestClient, path: str, media_type: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].split(";")[0] == media_type
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'self'" in response.headers["content-security-policy"]
    assert len(response.content) > 500


def test_page_uses_the_api_and_its_own_assets(client: TestClient) -> None:
    page = client.get("/").text
    for piece in ('src="/static/app.js"', 'href="/static/style.css"', 'id="text"', 'id="voice"'):
        assert piece in page
    script = client.get("/static/app.js").text
    for endpoint in ("/v1/audio/speech", "/v1/audio/voices", "/v1/models"):
        assert endpoint in script
    assert '"pcm"' in script and "X-Sample-Rate" in script  # streamed PCM, rate from header


def test_docs_is_not_blank_offline(client: TestClient) -> None:
    docs = client.get("/docs").text
    assert 'href="/openapi.json"' in docs and "/v1/audio/speech" in docs
    spec = client.get("/openapi.json").json()
    assert "/v1/audio/speech" in spec["paths"]
    assert client.get("/redoc").status_code == 404


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_no_asset_reaches_another_host(name: str) -> None:
    text = asset(name).decode()
    assert "://" not in text, re.findall(r"\S*://\S*", text)
    # Protocol-relative references (//host/x) would leave the server too.
    assert not re.search(r"""(src|href)\s*=\s*["']//""", text)
    assert not re.search(r"url\(\s*['\"]?//", text)
    assert "@import" not in text


def test_assets_are_package_data() -> None:
    """Everything the routes serve lives beside the module (and so in the wheel)."""
    import onnx_tts.server

    static = Path(onnx_tts.server.__file__).parent / "static"
    assert sorted(p.name for p in static.iterdir()) == sorted(ASSETS)


@pytest.mark.parametrize(
    "path", ["/static/nothing.js", "/static/..%2fapp.py", "/static/%2e%2e/web.py", "/static/"]
)
def test_unknown_static_paths_are_404(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_page_offers_the_apis_speed_range_and_download_formats(client: TestClient) -> None:
    """The slider spans what the API takes, and every download format is one the server
    answers (tools/check_web_page.py downloads and reads them in headless Chromium)."""
    from onnx_tts.pipeline.timestretch import MAX_SPEED, MIN_SPEED
    from onnx_tts.server.encoding import FORMATS

    page = client.get("/").text
    slider = re.search(r'<input id="speed"[^>]*>', page)
    assert slider is not None
    assert f'min="{MIN_SPEED:g}"' in slider.group(0) and f'max="{MAX_SPEED:g}"' in slider.group(0)
    choice = re.search(r'<select id="format"[^>]*>(.*?)</select>', page, re.S)
    assert choice is not None
    offered = re.findall(r'<option value="([^"]+)"', choice.group(1))
    assert {"wav", "mp3", "flac", "opus", "pcm"} <= set(offered) <= set(FORMATS)
    script = client.get("/static/app.js").text
    assert "response_format: format" in script and "seed" in script

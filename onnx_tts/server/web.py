"""The web page at `/` and the API note at `/docs`: plain HTML, CSS and JS from package data.

Nothing is fetched from another host (the page works offline). FastAPI's own /docs loads
Swagger UI from a CDN and is blank offline, so it is off; /docs is a short page of ours that
points to /openapi.json.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from starlette.responses import Response

from onnx_tts.server.errors import APIError

# name -> content type; only these files are served (no directory listing, no path walking).
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "docs.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# The page never needs a third-party origin; the browser enforces that too.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self' blob:; media-src 'self' blob:; img-src 'self' data:"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def asset(name: str) -> bytes:
    """One of ASSETS, read from the installed package."""
    return resources.files("onnx_tts.server").joinpath("static", name).read_bytes()


def _serve(name: str) -> Response:
    return Response(asset(name), media_type=ASSETS[name], headers=_SECURITY_HEADERS)


def add_routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return _serve("index.html")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return _serve("docs.html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in ASSETS:
            raise APIError(404, f"no static file {name!r}", code="not_found")
        return _serve(name)

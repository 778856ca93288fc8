#!/usr/bin/env bash
# Fetch ONNX Runtime C/C++ headers from Debian trixie's libonnxruntime-dev package.
# The onnxruntime wheel ships the shared library but no headers; the C API is versioned and
# backward compatible, so 1.21 headers drive the newer library from the wheel.
# Usage: fetch_ort_headers.sh DEST_DIR   -> headers end up in DEST_DIR/include/onnxruntime
set -euo pipefail
dest="${1:?usage: fetch_ort_headers.sh DEST_DIR}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
if [ -f "$dest/include/onnxruntime/onnxruntime_cxx_api.h" ]; then
  echo "$dest/include/onnxruntime"; exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Reuse the mirror this machine already trusts; only the suite changes.
src=""
for f in /etc/apt/sources.list.d/debian.sources; do
  [ -f "$f" ] && src="$f"
done
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/etc"
if [ -n "$src" ]; then
  uri="$(awk '/^URIs:/{print $2; exit}' "$src")"
  keyring="$(awk '/^Signed-By:/{print $2; exit}' "$src")"
else
  uri="$(awk '$1=="deb"{print ($2 ~ /^\[/) ? $3 : $2; exit}' /etc/apt/sources.list)"
  keyring="/usr/share/keyrings/debian-archive-keyring.gpg"
fi
[ -n "$uri" ] || { echo "fetch_ort_headers: no Debian mirror found in apt sources" >&2; exit 1; }
cat > "$work/etc/trixie.sources" <<SRC
Types: deb
URIs: $uri
Suites: trixie
Components: main
Signed-By: $keyring
SRC
apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$work/etc"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o "Dir::State::Status=/dev/null" -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
apt-get "${apt_opts[@]}" update -qq >&2
(cd "$work" && apt-get "${apt_opts[@]}" download libonnxruntime-dev >&2)
deb="$(ls "$work"/libonnxruntime-dev_*.deb | head -n1)"
dpkg -x "$deb" "$work/x"
mkdir -p "$dest/include"
rm -rf "$dest/include/onnxruntime"
cp -r "$work/x/usr/include/onnxruntime" "$dest/include/onnxruntime"
echo "$dest/include/onnxruntime"

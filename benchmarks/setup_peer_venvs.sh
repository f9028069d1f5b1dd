#!/usr/bin/env bash
# The peers that benchmarks/peers.py compares Turnstile with, each in a venv of its own under
# ~/.cache/turnstile/ (never the project venv or the bench venv: their pins would fight):
#
#   peer-agentlightning  agentlightning 0.3.0 (the newest for Python 3.11; LiteLLM's proxy)
#   peer-agentlightning-1  agentlightning 1.0.2 (the newest; Python >= 3.12; its own server)
#   peer-nemo-gym        nemo-gym 0.4.0 (every release needs Python >= 3.12)
#   peer-tokin           tokin 0.0.1 (its only release; Python >= 3.12, transformers >= 5.6)
#
# Python >= 3.12 does not come with this machine (Debian 12: 3.11), so the script builds
# CPython 3.13.5 from source: the upstream tarball as Debian 13 ships it (the
# python3.13_3.13.5.orig.tar.xz of Debian's source package, fetched with `apt-get source`
# through a sources list of its own, so the system's apt configuration is not touched), into
# ~/.cache/turnstile/cpython-3.13.5 (~10 minutes on 2 cores). Debian's build dependencies
# come from apt. Nothing here downloads anything but Debian and PyPI packages.
#
#   bash benchmarks/setup_peer_venvs.sh [agentlightning] [agentlightning-1] [nemo-gym] [tokin]
#   (default: all)
set -euo pipefail
cache="${TURNSTILE_CACHE:-$HOME/.cache/turnstile}"
py313="$cache/cpython-3.13.5/bin/python3.13"
pip_q=(install -q --disable-pip-version-check)
want=("$@")
[ ${#want[@]} -gt 0 ] || want=(agentlightning agentlightning-1 nemo-gym tokin)

build_python() {
  [ -x "$py313" ] && return
  apt-get install -y -q build-essential pkg-config libssl-dev zlib1g-dev libffi-dev \
    libsqlite3-dev libbz2-dev liblzma-dev uuid-dev >/dev/null
  work="$(mktemp -d)"
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian trixie main" >"$work/sources.list"
  apt_o=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache")
  apt-get "${apt_o[@]}" update -q >/dev/null
  (cd "$work/src" && apt-get "${apt_o[@]}" source --download-only python3.13=3.13.5-2+deb13u5)
  tar -xJf "$work/src/python3.13_3.13.5.orig.tar.xz" -C "$work/src"
  (cd "$work/src/Python-3.13.5" &&
    ./configure --prefix="$cache/cpython-3.13.5" --with-ensurepip=install >"$work/configure.log" &&
    make -j"$(nproc)" >"$work/make.log" 2>&1 && make install >"$work/install.log" 2>&1)
  rm -rf "$work"
}

for peer in "${want[@]}"; do
  case "$peer" in
    agentlightning)
      venv="$cache/peer-agentlightning"
      [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
      "$venv/bin/pip" "${pip_q[@]}" 'agentlightning==0.3.0' 'litellm==1.108.7'
      ;;
    agentlightning-1)
      build_python
      venv="$cache/peer-agentlightning-1"
      [ -x "$venv/bin/python" ] || "$py313" -m venv "$venv"
      "$venv/bin/pip" "${pip_q[@]}" 'agentlightning==1.0.2'
      ;;
    nemo-gym)
      build_python
      venv="$cache/peer-nemo-gym"
      [ -x "$venv/bin/python" ] || "$py313" -m venv "$venv"
      "$venv/bin/pip" "${pip_q[@]}" 'nemo-gym==0.4.0'
      ;;
    tokin)
      build_python
      venv="$cache/peer-tokin"
      [ -x "$venv/bin/python" ] || "$py313" -m venv "$venv"
      # tokin itself, and what the proxy around it (benchmarks/_peer_tokin.py) serves with
      "$venv/bin/pip" "${pip_q[@]}" 'tokin==0.0.1' 'uvicorn==0.54.0' 'starlette==1.10.0' \
        'uvloop==0.23.0' 'httptools==0.9.0' 'orjson==3.13.0'
      ;;
    *) echo "unknown peer $peer" >&2; exit 2 ;;
  esac
  echo "$peer: $venv"
done

#!/usr/bin/env bash
# The benchmark-only virtualenv: LiteLLM (the proxy overhead.py compares against) and py-spy,
# kept apart from Turnstile's own venv so they never change its pinned dependencies.
#
# `litellm[proxy]==1.110.2` cannot be installed as such (its `litellm-proxy==1.110.2` and
# `litellm-proxy-extras==0.4.114.post1` requirements are not on the package registry), so the
# proxy's run-time dependencies are listed here by hand: enough for `litellm --config` to serve
# /v1/chat/completions with no database.
set -euo pipefail
cache="${TURNSTILE_CACHE:-$HOME/.cache/turnstile}"
venv="${TURNSTILE_BENCH_VENV:-$cache/bench-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check \
  'litellm==1.110.2' 'py-spy==0.4.3' 'uvloop==0.23.0' 'httptools==0.9.0' \
  'fastapi==0.165.0' 'uvicorn==0.54.0' 'starlette==1.10.0' 'gunicorn==23.0.0' \
  'backoff==2.2.1' 'PyYAML==6.0.4' 'orjson==3.13.0' 'APScheduler==3.11.3' \
  'python-multipart==0.0.34' 'cryptography==50.0.2' 'PyJWT==2.15.1' 'PyNaCl==1.6.2' \
  'rq==2.12.0' 'websockets==15.0.1' 'fastapi-sso==0.23.0' 'email-validator==2.4.0' \
  'semver==3.1.2' 'Expression==5.8.0' 'tomlkit==0.15.2' 'RestrictedPython==8.5' \
  'backports.zstd==1.8.0' 'rich==13.9.4' 'mcp==2.3.0' 'soundfile==0.14.0' 'hiredis>=3,<4'
echo "$venv"

# Sourced by scripts/demo and scripts/test: make (or refresh) the project's virtual environment
# in .venv and activate it. Reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${COSYQ_PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "cosyq needs Python 3.11+ (set COSYQ_PYTHON to one); found: $("$python" --version 2>&1)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.cosyq-installed
want="$(cat pyproject.toml | (sha256sum 2>/dev/null || shasum -a 256) | cut -c1-64)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing cosyq and its dependencies into .venv (about a minute the first time)" >&2
  .venv/bin/python -m pip install -q --upgrade pip >&2
  # --no-compile, then every module compiled on all cores at once: pip compiles each wheel's
  # 17,000 modules on one core (49 CPU s, all of it wall time on a fresh machine).
  .venv/bin/python -m pip install -q --no-compile -e ".[worker,coreml,s3,http,webhooks,dev]" >&2
  # -qq and no exit status: as pip, a module that does not compile (a package's Python 2 file)
  # is left as it is.
  .venv/bin/python -m compileall -qq -j 0 \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
  echo "$want" > "$stamp"
fi
# shellcheck disable=SC1091
. .venv/bin/activate

#!/usr/bin/env bash
# Runs leaderd's whole test suite on a fresh Debian machine: installs what the
# tests need (Debian packages, the npm DynamoDB emulators at the versions in
# tests/emulators/package-lock.json), builds once, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# The integration tests are one binary (tests/it.rs, `autotests = false`):
# a tests/NAME.rs that it does not list as `mod NAME;` would never be built.
for file in tests/*.rs; do
  name=$(basename "$file" .rs)
  [ "$name" = it ] && continue
  if ! grep -qx "mod $name;" tests/it.rs; then
    echo "tests/$name.rs is not built: add \`mod $name;\` to tests/it.rs" >&2
    exit 1
  fi
done

# Debian packages: promtool (prometheus), faketime, a Java runtime for
# DynamoDB Local, Node.js/npm for the emulators, unshare (util-linux),
# PostgreSQL and openssl.
missing=()
command -v promtool >/dev/null || missing+=(prometheus)
# libfaketime itself is what the tests preload; the package brings it.
command -v faketime >/dev/null || missing+=(faketime)
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v npm >/dev/null || missing+=(npm)
command -v unshare >/dev/null || missing+=(util-linux)
command -v python3 >/dev/null || missing+=(python3)
# The venv module, for moto's venv (Debian splits it off).
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
command -v curl >/dev/null || missing+=(curl)
# PostgreSQL's server for the PostgreSQL store's tests, which start their
# own clusters (initdb in a temporary directory, run as the package's
# `postgres` user when the tests run as root; the package's own cluster is
# not used), and openssl for their TLS certificates. A test that finds
# either missing fails, saying what to install.
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null \
  || ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null \
  || ! id -u postgres >/dev/null 2>&1; then
  missing+=(postgresql)
fi
command -v openssl >/dev/null || missing+=(openssl)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

log "installing the DynamoDB emulators (npm ci)"
npm ci --prefix tests/emulators --no-audit --no-fund --loglevel=error

# moto's server mode (tests/iam.rs: the shipped IAM policies, enforced), in
# a venv of its own at the version tests/emulators/requirements.txt pins.
# pip leaves it alone when that version is there already.
if [ ! -x tests/emulators/venv/bin/pip ]; then
  log "creating tests/emulators/venv"
  python3 -m venv tests/emulators/venv
fi
log "installing moto (pip install -r tests/emulators/requirements.txt)"
tests/emulators/venv/bin/pip install --quiet --disable-pip-version-check \
  -r tests/emulators/requirements.txt

if ! cargo nextest --version >/dev/null 2>&1; then
  log "cargo-nextest not found; installing it"
  cargo install --locked cargo-nextest
fi

log "building"
cargo build --all-targets --locked

log "running the tests"
cargo nextest run --locked --no-fail-fast --config-file .ci/nextest.toml --profile ci "$@"

# Helpers for the packaging tests that run leaderd for real (image-build.sh,
# image-test.sh, systemd-test.sh). Sourced, not run.
# shellcheck shell=bash

# Where the scripts keep what they make: their work under target/ (a fresh
# clone starts from nothing), and what is worth keeping between runs on one
# machine in $CI_LEADERD_CACHE (not LEADERD_...: leaderd warns about
# variables of its prefix that are no setting, and the tests it runs count
# its warnings). Nothing relies on that cache being there.
readonly CI_TARGET=${CI_TARGET:-$PWD/target}
readonly CI_CACHE=${CI_LEADERD_CACHE:-/var/cache/leaderd-ci}

log() { printf '\n== %s\n' "$*"; }
note() { printf '   %s\n' "$*"; }

# fail WHAT [SEEN...]: print what was expected and what was seen, exit 1.
fail() {
    local what=$1
    shift
    printf '\nFAIL: %s\n' "$what" >&2
    if (($#)); then
        printf '%s\n' '--- seen:' "$@" '---' >&2
    fi
    exit 1
}

# Cleanup actions, run last-registered first when the script exits, however
# it exits. Each runs even when an earlier one fails.
CLEANUPS=()
on_exit() { CLEANUPS+=("$1"); }
run_cleanups() {
    local rc=$? i
    trap - EXIT INT TERM
    set +e
    for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do
        eval "${CLEANUPS[i]}" >/dev/null 2>&1
    done
    exit "$rc"
}
trap run_cleanups EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# need_debs PKG...: install the Debian packages that are missing. A tool
# that is not there is installed, never skipped.
need_debs() {
    local pkg missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' ||
            missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

# debian_mirror SUITE: the first archive apt itself uses for SUITE, read from
# its sources (one-line and deb822 formats), so nothing here names a mirror.
debian_mirror() {
    local suite=$1 f
    {
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [[ -f $f ]] || continue
            awk -v s="$suite" '$1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == s) print $i
            }' "$f"
        done
        for f in /etc/apt/sources.list.d/*.sources; do
            [[ -f $f ]] || continue
            awk -v s="$suite" '
                function flush() { if (uri != "" && hit && deb) print uri; uri = ""; hit = 0; deb = 0 }
                /^[[:space:]]*$/ { flush(); next }
                tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
                tolower($1) == "uris:" { uri = $2 }
                tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == s) hit = 1 }
                END { flush() }' "$f"
        done
    } | head -n1
}

# The Debian rootfs both tests start from: minbase bookworm plus what the
# stand-in builder needs (gcc, libc6-dev, CA certificates) and what booting
# systemd needs (systemd, systemd-sysv, dbus). One debootstrap serves both.
# Kept in the machine's cache for the ISO week (a new week, or another
# package list, makes a new one), made under a lock and moved into place
# whole, and never changed once there: its users copy it.
readonly ROOTFS_PACKAGES=ca-certificates,gcc,libc6-dev,systemd,systemd-sysv,dbus
ROOTFS=$CI_CACHE/rootfs/bookworm-$(printf '%s' "$ROOTFS_PACKAGES" | sha256sum | cut -c1-12)-$(date +%G-%V)
readonly ROOTFS

# bookworm_rootfs: make $ROOTFS unless it is there.
bookworm_rootfs() {
    local dir mirror tmp lock
    dir=$(dirname "$ROOTFS")
    mkdir -p "$dir"
    # Two runs at once make it once.
    exec {lock}>"$dir/.lock"
    flock "$lock"
    if [[ -d $ROOTFS ]]; then
        exec {lock}>&-
        note "debootstrap rootfs from the cache: $ROOTFS"
        return 0
    fi
    # Older weeks' copies: nobody starts on them any more.
    find "$dir" -mindepth 1 -maxdepth 1 -name 'bookworm-*' -mtime +14 -exec rm -rf {} +
    need_debs debootstrap
    mirror=$(debian_mirror bookworm)
    [[ -n $mirror ]] || fail "no Debian bookworm archive in apt's sources" \
        "$(cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>&1)"
    log "debootstrap --variant=minbase bookworm (+ ${ROOTFS_PACKAGES//,/ })"
    tmp=$(mktemp -d "$dir/.debootstrap.XXXXXX")
    if ! debootstrap --variant=minbase --include="$ROOTFS_PACKAGES" bookworm "$tmp" "$mirror" \
        >"$tmp.log" 2>&1; then
        tail -n 30 "$tmp.log" >&2
        rm -rf "$tmp" "$tmp.log"
        fail "debootstrap failed"
    fi
    rm -f "$tmp.log"
    chmod 0755 "$tmp" # mktemp made it 0700: / of the container
    # No downloaded .debs or package lists in what the tests copy.
    rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
    mv "$tmp" "$ROOTFS"
    exec {lock}>&-
    note "$(du -sh "$ROOTFS" | cut -f1) $ROOTFS"
}

# http_get URL BODYFILE: print the HTTP status (000 when nothing answers).
http_get() {
    curl -s -o "$2" -w '%{http_code}' --max-time 2 "$1" || true
}

# json_field FILE KEY: a top-level field of a JSON object, as text.
json_field() {
    python3 -c 'import json, sys
v = json.load(open(sys.argv[1])).get(sys.argv[2])
print("null" if v is None else str(v).lower() if isinstance(v, bool) else v)' "$1" "$2" 2>/dev/null || true
}

# A free TCP port on loopback.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Wall-clock seconds as a decimal, for measuring.
now() { date +%s.%N; }
elapsed() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.3f}")' "$1" "$2"; }
lt() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$1" "$2"; }

# Podman and buildah on a private storage root under $W (each script sets
# W), vfs driver: nothing touches the machine's own container storage.
pod() {
    podman --root "$W/storage" --runroot "$W/run" --storage-driver vfs \
        --tmpdir "$W/libpod" --cgroup-manager cgroupfs --runtime runc \
        --events-backend file "$@"
}
bah() { buildah --root "$W/storage" --runroot "$W/run" --storage-driver vfs "$@"; }

# storage_cleanup: every container, volume, mount and image under $W, and $W.
storage_cleanup() {
    pod rm --all --force --time 0
    pod volume rm --all --force
    pod image unmount --all --force
    bah rm --all
    pod rmi --all --force
    # Whatever is still mounted under the storage root (a container's /dev/shm).
    findmnt -rn -o TARGET | grep "^$W/" | sort -r | xargs -r umount -l
    rm -rf "$W"
}

# The image the build makes and the test runs; where the build leaves it
# (an archive that `podman load` reads) and the binary it holds (for
# systemd-test.sh). Used by the scripts that source this file:
# shellcheck disable=SC2034
readonly IMAGE=localhost/leaderd-ci/leaderd:test
# shellcheck disable=SC2034
readonly IMAGE_ARCHIVE=$CI_TARGET/ci-packaging-bin/leaderd-image.tar
# shellcheck disable=SC2034
readonly IMAGE_BIN=$CI_TARGET/ci-packaging-bin/leaderd
# What the image build and the image test install.
# shellcheck disable=SC2034
readonly IMAGE_DEBS=(buildah podman runc busybox-static curl python3 procps util-linux tar debootstrap)

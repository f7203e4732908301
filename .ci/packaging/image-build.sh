#!/usr/bin/env bash
# Builds the container image from the Dockerfile with buildah, as a user's
# `docker build` would, and saves it for image-test.sh: the image to
# target/ci-packaging-bin/leaderd-image.tar, its binary to
# target/ci-packaging-bin/leaderd (which systemd-test.sh runs).
#
# No image can be pulled here, so the build stage runs on a local stand-in
# builder (--build-arg BUILDER): Debian bookworm (debootstrap), this
# machine's Rust toolchain, and a rustc wrapper that links the binary
# statically against glibc where rust:alpine links it statically against
# musl. The final stage (scratch) is the Dockerfile's own. What CI cannot
# prove (the pinned Alpine builder, a musl binary) is said in the README.
#
# Installs what it needs (apt; `--deps-only` does only that, so that .ci/run
# can install in the foreground and build in the background). All buildah
# state lives in a private storage root under target/, removed at exit,
# whatever happens. Kept between runs, in /var/cache/leaderd-ci: the
# debootstrap root (common.sh) and the Dockerfile's cargo cache mounts (see
# BUILD_CACHE).
# Run from anywhere, as root: bash .ci/packaging/image-build.sh [--deps-only]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=.ci/packaging/common.sh
source .ci/packaging/common.sh

W=$CI_TARGET/ci-image-build
readonly W
readonly BUILDER=localhost/leaderd-ci/builder:stand-in
# buildah keeps the Dockerfile's cache mounts (cargo's registry and target
# dir) under $TMPDIR/buildah-cache-UID: here in the machine's cache, one per
# version of the rustc wrapper. Before each build leaderd's own fingerprints
# go (see the build below), so only the registry dependencies are reused.
BUILD_CACHE=$CI_CACHE/image-build-$(sha256sum .ci/packaging/stand-in/rustc-static-bins.sh | cut -c1-12)
readonly BUILD_CACHE

case ${1:-} in
'' | --deps-only) ;;
*)
    echo "usage: $0 [--deps-only]" >&2
    exit 64
    ;;
esac
need_debs "${IMAGE_DEBS[@]}"
[[ ${1:-} != --deps-only ]] || exit 0

# Leftovers of a run that was killed before its cleanup.
if [[ -d $W ]]; then
    storage_cleanup >/dev/null 2>&1 || true
fi
mkdir -p "$W/libpod" "$BUILD_CACHE" "$(dirname "$IMAGE_ARCHIVE")"
on_exit storage_cleanup
# A failed build leaves no image behind for image-test.sh to take for this one.
rm -f "$IMAGE_ARCHIVE" "$IMAGE_BIN"

bookworm_rootfs

log "stand-in builder $BUILDER: Debian bookworm + $(rustc --version)"
pinned=$(sed -n 's/^ARG BUILDER=rust:\([0-9.]*\)-.*/\1/p' Dockerfile)
[[ $(rustc --version) == "rustc $pinned "* ]] ||
    note "NOTE: the Dockerfile's builder has Rust $pinned; this stand-in has $(rustc --version)"
sysroot=$(rustc --print sysroot)
extra=$W/builder-extra
mkdir -p "$extra/usr/local/rust" "$extra/usr/local/bin"
cp -al "$sysroot/bin" "$sysroot/lib" "$extra/usr/local/rust/" 2>/dev/null ||
    cp -a "$sysroot/bin" "$sysroot/lib" "$extra/usr/local/rust/"
install -m 0755 .ci/packaging/stand-in/rustc-static-bins.sh "$extra/usr/local/bin/rustc-static-bins"
# cargo fetches crates with the CA certificates this machine trusts (a local
# CA too, where there is one), kept apart from the Debian bundle that the
# final stage copies.
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$extra/usr/local/share/leaderd-ci/host-ca.crt"
# The environment rust:alpine sets, the wrapper, cargo's CA bundle.
tar --numeric-owner -cf - -C "$ROOTFS" . -C "$extra" ./usr/local/rust ./usr/local/bin/rustc-static-bins \
    ./usr/local/share/leaderd-ci |
    pod import --quiet \
        --change 'ENV CARGO_HTTP_CAINFO=/usr/local/share/leaderd-ci/host-ca.crt' \
        --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV CARGO_HOME=/usr/local/cargo' \
        --change 'ENV RUSTC_WRAPPER=/usr/local/bin/rustc-static-bins' \
        - "$BUILDER" >/dev/null
rm -rf "$extra"

log "buildah build -f Dockerfile --build-arg BUILDER=$BUILDER"
t0=$(now)
exec {cache_lock}>"$BUILD_CACHE/.lock"
flock "$cache_lock"
# cargo decides whether leaderd itself is fresh by file times, which mean
# nothing across clones: always build it again. The dependencies' artifacts
# are keyed by version, features, profile and compiler, and stay.
find "$BUILD_CACHE" -path '*/release/.fingerprint/leaderd-*' -prune -exec rm -rf {} +
if ! TMPDIR=$BUILD_CACHE bah build --isolation chroot --pull=never \
    --build-arg BUILDER="$BUILDER" -t "$IMAGE" -f Dockerfile . >"$W/build.log" 2>&1; then
    fail "the image does not build" "$(tail -n 40 "$W/build.log")"
fi
exec {cache_lock}>&-
note "built in $(elapsed "$t0" "$(now)") s ($(grep -c '^ *Compiling' "$W/build.log") crates compiled)"

mnt=$(pod image mount "$IMAGE")
install -m 0755 "$mnt/usr/local/bin/leaderd" "$IMAGE_BIN"
pod image unmount "$IMAGE" >/dev/null
pod save --quiet --format docker-archive -o "$IMAGE_ARCHIVE.tmp" "$IMAGE"
mv "$IMAGE_ARCHIVE.tmp" "$IMAGE_ARCHIVE"
note "saved: $IMAGE_ARCHIVE ($(stat -c %s "$IMAGE_ARCHIVE") bytes), the binary: $IMAGE_BIN"

log "image built in $SECONDS s"

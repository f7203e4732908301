# leaderd container image: a static binary and CA certificates, nothing else.
#
#   docker build -t leaderd .
#
# Base images are pinned by tag (for humans) and digest (what is pulled), so
# a rebuild uses the same bytes until someone bumps both on purpose.

# Alpine's Rust image targets musl and links statically by default. A static
# binary is what lets the final stage be empty, and what lets the Helm
# chart's wrapper pattern copy the binary into any app image, whatever libc
# (if any) that image carries. The image already has gcc and musl-dev, which
# the bundled SQLite, the mimalloc allocator and the TLS crypto crates
# compile with.
# BUILDER exists for CI only, which cannot pull: .ci/packaging/image-test.sh
# passes a local stand-in (Debian, the same Rust, static glibc). Builds
# without --build-arg use the pinned image below.
ARG BUILDER=rust:1.95.0-alpine3.23@sha256:606fd313a0f49743ee2a7bd49a0914bab7deedb12791f3a846a34a4711db7ed2
FROM ${BUILDER} AS build

WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Build settings (the bundled SQLite's compile options), as on a developer's
# machine.
COPY .cargo ./.cargo
COPY src ./src

# Cache mounts keep the crate registry and compiled dependencies between
# builds without putting them in a layer; the binary is copied out of the
# cached target dir because that mount is gone after this step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && install -D -m 0755 target/release/leaderd /out/leaderd \
    && install -d -m 0755 /out/state/var/lib \
    && install -d -m 0750 /out/state/var/lib/leaderd \
    && chown 65532:65532 /out/state/var/lib/leaderd

FROM scratch

COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/leaderd /usr/local/bin/leaderd
# The one writable place, 65532's alone (0750): the default SQLite file
# (`leaderd.db`, relative to the working directory) lands here; mount a
# volume to keep it. COPY takes a directory's contents, with their owners and
# modes, but not the directory itself: hence the tree copied onto /. A
# `COPY --chown=65532:65532 dir /var/lib/leaderd` would make it 0755 and, with
# some builders, hand /var and /var/lib to 65532 as well.
COPY --from=build /out/state/ /
WORKDIR /var/lib/leaderd

# scratch has no environment at all: PATH lets ENTRYPOINT find the binary by
# name, SSL_CERT_FILE tells the TLS stack where the roots are.
ENV PATH=/usr/local/bin \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

# A numeric user needs no /etc/passwd and lets Kubernetes' runAsNonRoot check
# the user without guessing. 65532 is the usual "nonroot" id.
USER 65532:65532

LABEL org.opencontainers.image.title="leaderd" \
      org.opencontainers.image.description="Leader election daemon with a supervised child" \
      org.opencontainers.image.licenses="Apache-2.0"

EXPOSE 9777
ENTRYPOINT ["leaderd"]
CMD ["--help"]

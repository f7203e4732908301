#!/bin/sh
# RUSTC_WRAPPER of the stand-in builder image (image-test.sh): rust:alpine
# links binaries statically against musl by default; this builder has only
# the glibc target, so it links the crate's binaries statically against
# glibc instead (`-C target-feature=+crt-static`). Only final binaries: build
# scripts, proc-macros and cargo's `--print` probes stay as they are (a
# static target cannot load proc-macros), so the Dockerfile's plain
# `cargo build --release --locked` works unchanged.
rustc=$1
shift
case " $* " in
*" --print"* | *" --crate-name build_script_"*) ;;
*" --crate-type bin "*) exec "$rustc" "$@" -C target-feature=+crt-static ;;
esac
exec "$rustc" "$@"

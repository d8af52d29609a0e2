#!/bin/sh
# The project's test command (README "Testing"; `.ci/run` runs it on a clean clone).
#   1. formatting and lints: `cargo fmt --check`, `cargo clippy --workspace --all-targets
#      -D warnings`;
#   2. the static musl release binary, the one that ships (the Rust target is
#      installed with rustup when missing);
#   3. `cargo test` with DRAINIT_BIN set to that binary: unit and component tests run
#      on this build's library, every black-box test (tests/*.rs starting the binary,
#      ../shared/cases included) runs the shipped static binary.
# Needs root (PID namespaces), Python 3, gcc, unshare, setsid, script.
set -eu
cd "$(dirname "$0")/.."
TARGET=x86_64-unknown-linux-musl

cargo fmt --check
cargo clippy --workspace --all-targets -- -D warnings

if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  rustup target add "$TARGET"
fi
# The flags of release.sh and Dockerfile.example: a plain static executable, not the
# static PIE the musl target builds by default, so the tests run the binary that ships
# (and the README's static build, at the same path, is not rebuilt by each run).
RUSTFLAGS='-C target-feature=+crt-static -C relocation-model=static' \
  cargo build --release --target "$TARGET"
BIN="$PWD/target/$TARGET/release/drainit"

# The release-time generator (man page, completions), built before the tests so that
# tests/packaging.rs runs it without building (and without the network).
cargo build -p xtask

DRAINIT_BIN="$BIN" cargo test

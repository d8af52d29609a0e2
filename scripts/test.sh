#!/bin/sh
# The project's test command (README "Testing"; `.ci/run` runs it on a clean clone).
#   1. formatting and lints: `cargo fmt --check`, `cargo clippy --workspace --all-targets
#      -D warnings`;
#   2. the static musl release binary, the one that ships (the Rust target is
#      installed with rustup when missing);
#   3. `cargo test` with DRAINIT_BIN set to that binary: unit and component tests run
#      on this build's library, every black-box test (tests/*.rs starting the binary)
#      runs the shipped static binary. tests/cases.rs also runs the handed acceptance
#      scripts in ../shared/cases where that folder exists, and says so when it is absent;
#   4. the arm64 static binary (release.sh's flags; built at nice 19 while step 3's
#      tests run) and its smoke suite, tests/arm64.rs, under qemu-user
#      (`qemu-aarch64-static`);
#   5. the Debian packages (cargo-deb) of both binaries: the amd64 one installed with
#      dpkg -i, run, and removed with dpkg -r; the arm64 one's contents (tests/deb.rs).
# Needs root (PID namespaces, dpkg), Python 3, gcc, unshare, setsid, script,
# qemu-user-static (`.ci/run` installs what is missing; cargo-deb is installed here).
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
# (and docs/packaging.md's static build by hand, at the same path, is not rebuilt by each run).
RUSTFLAGS='-C target-feature=+crt-static -C relocation-model=static' \
  cargo build --release --target "$TARGET"
BIN="$PWD/target/$TARGET/release/drainit"

# The release-time generator (man page, completions), built before the tests so that
# tests/packaging.rs runs it without building (and without the network).
cargo build -p xtask
# The tests built before they run: the arm64 build below runs beside them.
cargo test --no-run

# ---- arm64: the static aarch64 binary, built beside the tests -----------------------
# The flags of release.sh (rust-lld: no aarch64 C toolchain). The tests mostly wait
# (on apps, signals, deadlines), so the build runs while they do, at the lowest
# priority (nice 19: a test that needs a CPU gets it at once), in a target directory
# of its own (cargo holds target/'s lock while the tests run); its binaries are then
# copied to where release.sh and cargo-deb find them.
ARM64_TARGET=aarch64-unknown-linux-musl
if ! rustup target list --installed 2>/dev/null | grep -qx "$ARM64_TARGET"; then
  rustup target add "$ARM64_TARGET"
fi
ARM64_DIR=target/arm64-build
mkdir -p "$ARM64_DIR"
RUSTFLAGS='-C target-feature=+crt-static -C relocation-model=static -C linker=rust-lld' \
  CARGO_TARGET_DIR="$ARM64_DIR" nice -n 19 \
  cargo build --release --target "$ARM64_TARGET" >"$ARM64_DIR/build.log" 2>&1 &
ARM64_BUILD=$!
trap 'kill "$ARM64_BUILD" 2>/dev/null || true' EXIT

DRAINIT_BIN="$BIN" cargo test

if ! wait "$ARM64_BUILD"; then
  cat "$ARM64_DIR/build.log" >&2
  echo "test.sh: the arm64 release build failed" >&2
  exit 1
fi
trap - EXIT
tail -n 1 "$ARM64_DIR/build.log"
mkdir -p "target/$ARM64_TARGET/release"
cp "$ARM64_DIR/$ARM64_TARGET/release/drainit" "$ARM64_DIR/$ARM64_TARGET/release/drainit-gate" \
  "target/$ARM64_TARGET/release/"
# Its smoke suite under emulation: its own step, with --nocapture, so the checks
# emulation cannot run are said, not swallowed.
DRAINIT_ARM64_BIN="$PWD/target/$ARM64_TARGET/release/drainit" \
  cargo test --test arm64 -- --nocapture --test-threads 2

# ---- the Debian packages: built from the binaries tested above; amd64 installed, removed -
# cargo-deb is installed once (3 min here, on two shared cores; it stays in
# ~/.cargo/bin). --no-build: the packages hold the static binaries the tests ran.
if ! command -v cargo-deb >/dev/null 2>&1; then
  cargo install cargo-deb --locked --version '^3'
fi
rm -rf target/assets
cargo run --quiet -p xtask -- docs target/assets >/dev/null
DEB=$(cargo deb --no-build --no-strip --target "$TARGET" -o target/debian/ | tail -n 1)
ARM64_DEB=$(cargo deb --no-build --no-strip --target "$ARM64_TARGET" -o target/debian/ | tail -n 1)
DRAINIT_BIN="$BIN" DRAINIT_DEB="$DEB" \
  DRAINIT_ARM64_BIN="$PWD/target/$ARM64_TARGET/release/drainit" DRAINIT_ARM64_DEB="$ARM64_DEB" \
  cargo test --test deb

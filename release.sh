#!/bin/sh
# release.sh — the static release binary, its sha256, the man page and the shell
# completions, in dist/. No make, no Docker: rustup and cargo only.
#
#   sh release.sh            # → dist/drainit, dist/drainit.sha256, dist/drainit.1,
#                            #   dist/completions/{drainit.bash,_drainit,drainit.fish}
#
# The binary is the static musl build (README "Performance": no libc, no loader,
# runs FROM scratch); the target is installed with rustup when missing. The man
# page and completions come from the same clap definition as the binary
# (xtask/), generated here and never compiled into drainit itself.
set -eu
cd "$(dirname "$0")"

TARGET=${TARGET:-x86_64-unknown-linux-musl}
DIST=${DIST:-dist}

if ! rustup target list --installed | grep -qx "$TARGET"; then
    rustup target add "$TARGET"
fi

# relocation-model=static: a plain static executable, not a static PIE that
# relocates itself at every start (the same flags as Dockerfile.example).
RUSTFLAGS='-C target-feature=+crt-static -C relocation-model=static' \
    cargo build --release --locked -p drainit --target "$TARGET"

BIN=target/$TARGET/release/drainit
# A dynamic binary would fail only at deploy time, in an image without libc.
if ldd "$BIN" 2>/dev/null | grep -q '=>'; then
    echo "release.sh: $BIN is dynamically linked" >&2
    exit 1
fi

rm -rf "$DIST"
mkdir -p "$DIST"
cp "$BIN" "$DIST/drainit"
(cd "$DIST" && sha256sum drainit >drainit.sha256)
cargo run --quiet --locked -p xtask -- docs "$DIST" >/dev/null

version=$("$DIST/drainit" --version)
echo "release.sh: $version for $TARGET in $DIST/:"
(cd "$DIST" && find . -type f | sort | sed 's|^\./|  |')
cat "$DIST/drainit.sha256"

#!/bin/sh
# release.sh — the static release binaries (x86_64 and aarch64), their sha256, the
# man page, the shell completions and the Debian packages, in dist/. No make, no
# Docker, no cross C toolchain: rustup and cargo only (and cargo-deb, installed with
# cargo when missing).
#
#   sh release.sh            # → dist/drainit, dist/drainit.sha256          (x86_64)
#                            #   dist/drainit-amd64, dist/drainit-arm64 (+ .sha256)
#                            #   dist/drainit-gate{,-amd64,-arm64} (+ .sha256)
#                            #   dist/drainit.1, dist/drainit-gate*.1,
#                            #   dist/completions/{drainit,drainit-gate} for bash, zsh, fish
#                            #   dist/drainit_VERSION-1_amd64.deb, …_arm64.deb (+ .sha256)
#
# The binaries are static musl builds (README "Performance": no libc, no loader,
# run FROM scratch); the targets are installed with rustup when missing. The man
# page and completions come from the same clap definition as the binary
# (xtask/), generated here and never compiled into drainit itself.
# docs/packaging.md describes every file.
set -eu
cd "$(dirname "$0")"

TARGET=${TARGET:-x86_64-unknown-linux-musl}
ARM64_TARGET=aarch64-unknown-linux-musl
DIST=${DIST:-dist}

# build TRIPLE [EXTRA_RUSTFLAGS]: the release binary for TRIPLE, refused if it came
# out dynamic or with its symbols.
build() {
    if ! rustup target list --installed | grep -x "$1" >/dev/null; then
        rustup target add "$1"
    fi
    # relocation-model=static: a plain static executable, not a static PIE that
    # relocates itself at every start (the same flags as Dockerfile.example).
    RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static${2:+ $2}" \
        cargo build --release --locked -p drainit -p drainit-gate --target "$1"
    for bin in target/$1/release/drainit target/$1/release/drainit-gate; do
        # A dynamic binary would fail only at deploy time, in an image without libc.
        # readelf, not ldd: ldd cannot read a foreign architecture's binary.
        if readelf -lW "$bin" | grep INTERP >/dev/null; then
            echo "release.sh: $bin is dynamically linked (it has a program interpreter)" >&2
            exit 1
        fi
        # build.rs strips drainit at the link (--strip-all), for every target;
        # drainit-gate by its release profile (Cargo.toml).
        if readelf -SW "$bin" | grep '\.symtab' >/dev/null; then
            echo "release.sh: $bin has a symbol table (not stripped)" >&2
            exit 1
        fi
    done
}

# ---- x86_64 -------------------------------------------------------------------
build "$TARGET"

# ---- aarch64 (arm64) ------------------------------------------------------------
# rust-lld, the linker that ships with Rust: no aarch64 C toolchain is needed (musl's
# start files and libc come with the Rust target). build.rs passes it --strip-all and
# hot-text.ld bare, as to any ld-like linker; the hot-text script's patterns are
# symbol names, the same on both architectures (tests/arm64.rs checks the section).
build "$ARM64_TARGET" "-C linker=rust-lld"

# ---- dist/: binaries, checksums, man page, completions ------------------------------
rm -rf "$DIST"
mkdir -p "$DIST"
# drainit-amd64 and drainit-arm64 are named as Docker's TARGETARCH and Debian name
# the architectures (`COPY drainit-${TARGETARCH} …`, docs/packaging.md); dist/drainit
# is the x86_64 one under its first name (the same file, linked).
cp "target/$TARGET/release/drainit" "$DIST/drainit"
ln "$DIST/drainit" "$DIST/drainit-amd64"
cp "target/$ARM64_TARGET/release/drainit" "$DIST/drainit-arm64"
# drainit-gate (gate/: the deployment gate), a second static binary built with the
# same flags by build() above, named the same way.
cp "target/$TARGET/release/drainit-gate" "$DIST/drainit-gate"
ln "$DIST/drainit-gate" "$DIST/drainit-gate-amd64"
cp "target/$ARM64_TARGET/release/drainit-gate" "$DIST/drainit-gate-arm64"
(cd "$DIST" && for f in drainit drainit-amd64 drainit-arm64 drainit-gate drainit-gate-amd64 drainit-gate-arm64; do
    sha256sum "$f" >"$f.sha256"
done)
# target/assets/: where the Debian package's metadata (Cargo.toml) finds them.
rm -rf target/assets
cargo run --quiet --locked -p xtask -- docs target/assets >/dev/null
cp -R target/assets/. "$DIST/"

# ---- Debian packages (cargo-deb) ------------------------------------------------------
# From the binaries built above (--no-build: cargo-deb does not rebuild, and
# --no-strip: they are stripped already, and the host's strip cannot read aarch64).
if ! command -v cargo-deb >/dev/null 2>&1; then
    cargo install cargo-deb --locked --version '^3'
fi
for triple in "$TARGET" "$ARM64_TARGET"; do
    deb=$(cargo deb --no-build --no-strip --locked --target "$triple" -o "$DIST/" | tail -n 1)
    (cd "$DIST" && sha256sum "$(basename "$deb")" >"$(basename "$deb").sha256")
done

version=$("$DIST/drainit" --version)
echo "release.sh: $version for $TARGET and $ARM64_TARGET in $DIST/:"
(cd "$DIST" && find . -type f | sort | sed 's|^\./|  |')
cat "$DIST"/*.sha256

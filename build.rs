//! Build script: one link decision for the dynamic glibc build.
//!
//! The unwinder comes from libgcc_eh.a, linked in, instead of libgcc_s.so: one
//! shared library fewer for the dynamic loader to find, map and bind before
//! drainit's first instruction, which is time in which a SIGTERM kills drainit
//! (bench/startrace.sh: libgcc_s alone moved a C program's window by ~100 µs).
//! Static builds (musl, or glibc with `crt-static`) bring their own unwinder.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let crt_static = features.split(',').any(|f| f == "crt-static");
    if target.ends_with("-linux-gnu") && !crt_static {
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
}

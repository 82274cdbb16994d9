//! Links libsrt (Debian: `libsrt-openssl-dev` at build time,
//! `libsrt1.5-openssl` at run time). pkg-config is asked first so a libsrt
//! installed elsewhere is found; without it the system's `-lsrt` is used.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let libs = Command::new("pkg-config")
        .args(["--libs", "srt"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    for flag in libs.iter().flat_map(|f| f.split_whitespace()) {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        }
    }
    println!("cargo:rustc-link-lib=dylib=srt");
}

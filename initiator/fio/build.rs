//! Compiles the C shim (`shim/netdam_fio.c`) against fio's headers when `FIO_SOURCE` names a
//! configured fio source tree (one with `fio.h`, `ioengines.h` and the `config-host.h` that fio's
//! `./configure` writes), and links it into the cdylib. `ops/fio-plugin.sh` fetches Debian's
//! fio source, configures it and sets `FIO_SOURCE`. Without it the crate builds without the
//! shim (for tests and lints), and the library exports no engine.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(netdam_fio_shim)");
    println!("cargo::rerun-if-env-changed=FIO_SOURCE");
    println!("cargo::rerun-if-changed=shim/netdam_fio.c");
    println!("cargo::rerun-if-changed=shim/netdam_fio.h");
    let Some(source) = std::env::var_os("FIO_SOURCE").filter(|source| !source.is_empty()) else {
        return;
    };
    let source = PathBuf::from(source);
    for header in ["fio.h", "ioengines.h", "optgroup.h", "config-host.h"] {
        let path = source.join(header);
        if !path.is_file() {
            let hint = if header == "config-host.h" { " (run ./configure there first)" } else { "" };
            panic!("FIO_SOURCE={}: no {header} there{hint}; ops/fio-plugin.sh prepares one", source.display());
        }
        println!("cargo::rerun-if-changed={}", path.display());
    }
    // The flags fio's own Makefile and configure compile with: the headers' struct layouts
    // depend on them (and on config-host.h), and the shim must see the layouts fio was built with.
    cc::Build::new()
        .file("shim/netdam_fio.c")
        .include("shim")
        .include(&source)
        .flag("-std=gnu99")
        .flag("-include")
        .flag(source.join("config-host.h").to_str().expect("FIO_SOURCE is valid UTF-8"))
        .define("_GNU_SOURCE", None)
        .define("_LARGEFILE_SOURCE", None)
        .define("_FILE_OFFSET_BITS", "64")
        .warnings(true)
        .extra_warnings(false)
        .warnings_into_errors(true)
        .compile("netdam_fio_shim");
    println!("cargo::rustc-cfg=netdam_fio_shim");
    // fio dlcloses an engine when a job ends, while this library's runtime threads and
    // thread-local destructors may still be about; keep it mapped until the process exits.
    println!("cargo::rustc-cdylib-link-arg=-Wl,-z,nodelete");
}

//! The target every benchmark starts in-process: one worker on an ephemeral loopback port, a
//! 64 MiB memory region `bench` (id 0) and one namespace (id 0).

use std::path::Path;

use netdam_target::config::{
    ByteSize, Config, NamespaceBackend, NamespaceConfig, PollMode, RegionBackend, RegionConfig,
};

/// A namespace of `bytes` on a pmem region file under the data directory: block numbers that
/// show netdam's path rather than a disk's.
pub fn pmem_namespace(file_name: &str, bytes: u64, block_size: u32) -> NamespaceConfig {
    NamespaceConfig {
        name: "bench".into(),
        backend: NamespaceBackend::Pmem,
        path: file_name.into(),
        size: Some(ByteSize(bytes)),
        block_size,
    }
}

/// Settings of a one-worker bench target serving the memory region and `namespace`.
pub fn config(data_dir: &Path, poll: PollMode, namespace: NamespaceConfig) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().expect("valid literal"),
        // Metrics on, on any free port: tests and benchmarks run many targets at once.
        metrics_listen: "127.0.0.1:0".parse().expect("valid literal"),
        data_dir: Some(data_dir.to_path_buf()),
        workers: 1,
        poll,
        regions: vec![RegionConfig {
            name: "bench".into(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(64 << 20),
        }],
        namespaces: vec![namespace],
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    }
}

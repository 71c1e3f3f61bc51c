//! Metrics for netdam's long-running processes (the target, `netdam nbd`).
//!
//! Recording must cost nothing on a request path, so nothing here is a shared metric that every
//! thread updates. Each writer (a target worker, an initiator session's I/O task) owns a shard of
//! plain atomics that only it writes, with a load and a store instead of a locked
//! read-modify-write; a [`prometheus_client::collector::Collector`] of the process sums the shards
//! when `/metrics` is scraped. Latency histograms share one bucket layout ([`buckets`]), whose
//! bucket index is a few integer operations.
//!
//! - [`buckets`]: the latency bucket layout and its index function.
//! - [`shard`]: single-writer counters and histograms.
//! - [`family`]: encoding summed shards as metric families from a collector.
//! - [`http`]: the `/metrics` endpoint (Prometheus text 0.0.4, or OpenMetrics on request).
//! - [`listen`]: the `metrics_listen` / `--metrics-listen` setting.
//! - [`opcodes`]: a dense slot per opcode, for per-opcode arrays.
//! - [`logging`]: `tracing` output, filtered like `RUST_LOG`, as text or JSON.

pub mod buckets;
pub mod family;
pub mod http;
pub mod listen;
pub mod logging;
pub mod opcodes;
pub mod shard;

pub use buckets::{bucket_index, BUCKETS, BUCKET_BOUNDS_NS};
pub use http::MetricsServer;
pub use listen::MetricsListen;
pub use logging::LogFormat;
pub use shard::{Cell, HistogramShard, HistogramSnapshot};

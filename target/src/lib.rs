//! The netdam storage target: serves the NetDAM ISA over UDP.
//!
//! - [`config`]: settings, defaults and validation.
//! - [`server`]: start and stop a [`server::Target`].
//! - [`worker`]: the per-core polling loop (socket I/O and time).
//! - [`dispatch`]: what happens to one datagram (sans-IO).
//! - [`engine`]: the software execution engine.
//! - [`fpga_engine`]: the FPGA engine, its device placement and its failover to software.
//! - [`extensions`]: the extension handlers configuration may enable.
//! - [`regions`]: the table of memory regions.
//! - [`socket`]: the shared-port socket and batched receive.
//! - [`stats`]: per-worker counters and histograms.
//! - [`metrics`]: the `/metrics` collector that sums them when scraped.
//! - [`block`]: one worker's block path (devices, buffers, datagrams waiting for I/O).
//! - [`namespaces`]: the block namespaces served.
//! - [`metadata`]: the redb store of regions, namespaces and tenants created by admin commands.
//! - [`sessions`]: one worker's sessions, their replay window and the limits on them.
//! - [`cookies`]: the HELLO cookies that prove a sender's address before it gets a session.
//! - [`crypto`]: ENCRYPT and DECRYPT: key slots, nonce reservation, AES-256-GCM.
//! - [`tenants`]: tenants, keys and grants as the running target applies them.
//! - [`tenant_admin`]: key files, imported keys and the default tenant, for admin commands.
//! - [`tenant_watch`]: re-reads the tenants when the store changes and publishes them.

pub mod block;
pub mod config;
pub mod configured_files;
pub mod cookies;
pub mod crypto;
pub mod dispatch;
pub mod engine;
pub mod extensions;
pub mod fpga_engine;
pub mod metadata;
pub mod metrics;
pub mod namespaces;
pub mod overload;
pub mod qos;
pub mod regions;
pub mod server;
pub mod sessions;
pub mod socket;
pub mod stats;
pub mod tenant_admin;
pub mod tenant_watch;
pub mod tenants;
pub mod worker;

pub use config::{AuthMode, Config, PollMode};
pub use server::{StartError, Target};

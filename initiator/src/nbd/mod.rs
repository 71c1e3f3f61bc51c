//! The NBD export: serves a netdam namespace (or any [`backend::NbdBackend`]) to the stock NBD
//! clients (the kernel's nbd-client, qemu, libnbd's tools, fio's nbd engine).

pub mod backend;

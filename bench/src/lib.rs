//! netdam's benchmarks and its deterministic simulator.
//!
//! - [`sim`]: initiators and a target, using the production state machines, on a virtual clock
//!   over a seeded network with bottleneck queues and faults.
//! - [`proxy`]: a fault-injecting UDP proxy for tests on real sockets.

pub mod proxy;
pub mod sim;

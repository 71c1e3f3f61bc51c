//! netdam's benchmarks and its deterministic simulator.
//!
//! - [`sim`]: initiators and a target, using the production state machines, on a virtual clock
//!   over a seeded network with bottleneck queues and faults.

pub mod sim;

//! The seam between the transport and whatever executes instructions.
//!
//! The target picks an engine at start-up (the CPU, or later an FPGA through its register and
//! ring interface); the worker loop hands it every non-control instruction and never needs to
//! know which one runs.

use crate::status::Status;
use crate::wire::Instruction;

/// Executes instructions on a target's address spaces.
pub trait Engine: Send {
    /// Short name for logs and metrics (`software`, `fpga`).
    fn name(&self) -> &'static str;

    /// Executes one non-control instruction, writing answer data into `out` (the room left in the
    /// response) and returning its length. Durable spaces are persisted before this returns.
    fn execute(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status>;
}

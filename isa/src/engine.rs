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

    /// Group commit. While on, `execute` may leave what it wrote to durable spaces unpersisted
    /// until [`Engine::persist_pending`], and its caller holds back every answer given meanwhile
    /// (whatever it reads may depend on the unpersisted writes) until that has succeeded. The
    /// worker turns it on for one receive pass, so a pass of writes costs one persist instead of
    /// one each. Engines that always persist at once ignore it.
    fn set_group_commit(&mut self, _on: bool) {}

    /// Whether something written is not yet durable (only ever while group commit is on).
    fn persist_is_pending(&self) -> bool {
        false
    }

    /// Makes everything written so far durable. On `Err`, the writes since the last persist
    /// may not be, and the answers held for them must not say they succeeded.
    fn persist_pending(&mut self) -> Result<(), Status> {
        Ok(())
    }
}

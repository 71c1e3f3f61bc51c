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

    /// Executes a block instruction (checked by the caller: grant, namespace, range) on a
    /// namespace this engine holds itself, such as an FPGA's NVMe SSD, writing a BREAD's blocks
    /// into `out`, and returns their length; `None` when it does not hold that namespace now,
    /// so that the target's own device serves it. Block instructions are idempotent, so one an
    /// engine gave up on mid-way (its device failed) may be served by the target's device.
    fn execute_block(&mut self, _instruction: &Instruction<'_>, _out: &mut [u8]) -> Option<Result<usize, Status>> {
        None
    }

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

//! The software engine: executes instructions on the CPU with the ISA's reference semantics and
//! persists what a persistent region's instructions wrote before they are acknowledged.

use std::sync::Arc;

use netdam_isa::engine::Engine;
use netdam_isa::semantics;
use netdam_isa::wire::Instruction;
use netdam_isa::Status;

use crate::regions::RegionTable;

/// Executes on the CPU; always available.
#[derive(Debug, Clone)]
pub struct SoftwareEngine {
    regions: Arc<RegionTable>,
}

impl SoftwareEngine {
    /// An engine over `regions`.
    pub fn new(regions: Arc<RegionTable>) -> SoftwareEngine {
        SoftwareEngine { regions }
    }
}

impl Engine for SoftwareEngine {
    fn name(&self) -> &'static str {
        "software"
    }

    fn execute(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        let outcome = semantics::execute(instruction, &*self.regions, out)?;
        if let Some(written) = outcome.written {
            let region = self.regions.get(written.space).expect("semantics wrote to a region that exists");
            if let Err(error) = region.persist(written.offset, written.len) {
                tracing::error!(region = region.name(), offset = written.offset, len = written.len, %error, "persist failed");
                return Err(Status::IoError);
            }
        }
        Ok(outcome.data_len)
    }
}

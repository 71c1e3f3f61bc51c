//! The software engine: executes instructions on the CPU with the ISA's reference semantics and
//! persists what a persistent region's instructions wrote before they are acknowledged.

use std::sync::Arc;

use netdam_isa::engine::Engine;
use netdam_isa::semantics::{self, AddressSpaces};
use netdam_isa::wire::Instruction;
use netdam_isa::Status;
use netdam_pmem::Durability;

use crate::regions::RegionTable;

/// Most written ranges group commit keeps apart before it persists them all early.
const PENDING_RANGES: usize = 32;

/// A written range of a durable region, not yet persisted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct PendingRange {
    space: u16,
    offset: usize,
    len: usize,
}

/// Executes on the CPU; always available.
#[derive(Debug, Clone)]
pub struct SoftwareEngine {
    regions: Arc<RegionTable>,
    /// Group commit is on: writes to durable regions wait in `pending`.
    group_commit: bool,
    /// Written and not yet persisted, at most `PENDING_RANGES` (a fixed array: no allocation).
    pending: [PendingRange; PENDING_RANGES],
    pending_len: usize,
    /// An early persist of this pass failed: the pass's persist reports it.
    persist_failed: bool,
}

impl SoftwareEngine {
    /// An engine over `regions`.
    pub fn new(regions: Arc<RegionTable>) -> SoftwareEngine {
        SoftwareEngine {
            regions,
            group_commit: false,
            pending: [PendingRange::default(); PENDING_RANGES],
            pending_len: 0,
            persist_failed: false,
        }
    }

    fn persist(&self, range: PendingRange) -> Result<(), Status> {
        let region = self.regions.get(range.space).expect("semantics wrote to a region that exists");
        region.persist(range.offset, range.len).map_err(|error| {
            let (offset, len) = (range.offset, range.len);
            tracing::error!(region = region.name(), offset, len, %error, "persist failed");
            Status::IoError
        })
    }

    /// Adds a written range to the pending ones, merged with one it overlaps or touches.
    fn defer(&mut self, range: PendingRange) -> Result<(), Status> {
        for pending in &mut self.pending[..self.pending_len] {
            let (start, end) = (pending.offset, pending.offset + pending.len);
            if pending.space == range.space && range.offset <= end && start <= range.offset + range.len {
                let merged_end = end.max(range.offset + range.len);
                pending.offset = start.min(range.offset);
                pending.len = merged_end - pending.offset;
                return Ok(());
            }
        }
        if self.pending_len == PENDING_RANGES {
            // Persisted early; a failure is remembered for the pass's own persist to report,
            // so the answers held so far do not leave as `ok`.
            self.persist_ranges();
        }
        self.pending[self.pending_len] = range;
        self.pending_len += 1;
        Ok(())
    }

    /// Persists every pending range (each is tried: one failure must not leave the others
    /// unpersisted); a failure sticks until `persist_pending` reports it.
    fn persist_ranges(&mut self) {
        for index in 0..self.pending_len {
            if self.persist(self.pending[index]).is_err() {
                self.persist_failed = true;
            }
        }
        self.pending_len = 0;
    }
}

impl Engine for SoftwareEngine {
    fn name(&self) -> &'static str {
        "software"
    }

    fn execute(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        let regions = Arc::clone(&self.regions);
        self.execute_over(&*regions, instruction, out)
    }

    fn set_group_commit(&mut self, on: bool) {
        self.group_commit = on;
    }

    fn persist_is_pending(&self) -> bool {
        self.pending_len > 0 || self.persist_failed
    }

    fn persist_pending(&mut self) -> Result<(), Status> {
        self.persist_ranges();
        if std::mem::take(&mut self.persist_failed) {
            return Err(Status::IoError);
        }
        Ok(())
    }
}

impl SoftwareEngine {
    /// The regions this engine executes on.
    pub fn regions(&self) -> &Arc<RegionTable> {
        &self.regions
    }

    /// Executes on the CPU over `spaces`, which must name the same regions as this engine's
    /// table (the FPGA engine passes a view in which some of them are the device's memory), and
    /// persists or defers what it wrote as [`Engine::execute`] does.
    pub fn execute_over(
        &mut self,
        spaces: &impl AddressSpaces,
        instruction: &Instruction<'_>,
        out: &mut [u8],
    ) -> Result<usize, Status> {
        let outcome = semantics::execute(instruction, spaces, out)?;
        if let Some(written) = outcome.written {
            let range = PendingRange { space: written.space, offset: written.offset, len: written.len };
            let region = self.regions.get(written.space).expect("semantics wrote to a region that exists");
            if self.group_commit && region.durability() == Durability::Persistent {
                self.defer(range)?;
            } else {
                self.persist(range)?;
            }
        }
        Ok(outcome.data_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(offset: usize, len: usize) -> PendingRange {
        PendingRange { space: 0, offset, len }
    }

    #[test]
    fn an_early_persist_failure_is_reported_by_the_passs_persist() {
        let none = RegionTable::open(&[], std::path::Path::new(".")).unwrap();
        let mut engine = SoftwareEngine::new(Arc::new(none));
        engine.persist_failed = true;
        assert!(engine.persist_is_pending(), "answers must still be held");
        assert_eq!(engine.persist_pending(), Err(Status::IoError));
        assert!(!engine.persist_is_pending());
        assert_eq!(engine.persist_pending(), Ok(()), "reported once");
    }

    #[test]
    fn touching_and_overlapping_ranges_merge_and_others_stay_apart() {
        let none = RegionTable::open(&[], std::path::Path::new(".")).unwrap();
        let mut engine = SoftwareEngine::new(Arc::new(none));
        engine.defer(range(0, 100)).unwrap();
        engine.defer(range(100, 50)).unwrap();
        engine.defer(range(20, 10)).unwrap();
        engine.defer(range(1000, 10)).unwrap();
        engine.defer(PendingRange { space: 1, offset: 0, len: 10 }).unwrap();
        assert_eq!(
            &engine.pending[..engine.pending_len],
            &[range(0, 150), range(1000, 10), PendingRange { space: 1, offset: 0, len: 10 }]
        );
    }
}

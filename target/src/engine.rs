//! The software engine: executes instructions on the CPU with the ISA's reference semantics and
//! persists what a persistent region's instructions wrote before they are acknowledged.

use std::sync::Arc;

use netdam_isa::engine::Engine;
use netdam_isa::semantics;
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
}

impl SoftwareEngine {
    /// An engine over `regions`.
    pub fn new(regions: Arc<RegionTable>) -> SoftwareEngine {
        SoftwareEngine {
            regions,
            group_commit: false,
            pending: [PendingRange::default(); PENDING_RANGES],
            pending_len: 0,
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
            self.persist_pending()?;
        }
        self.pending[self.pending_len] = range;
        self.pending_len += 1;
        Ok(())
    }
}

impl Engine for SoftwareEngine {
    fn name(&self) -> &'static str {
        "software"
    }

    fn execute(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        let outcome = semantics::execute(instruction, &*self.regions, out)?;
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

    fn set_group_commit(&mut self, on: bool) {
        self.group_commit = on;
    }

    fn persist_is_pending(&self) -> bool {
        self.pending_len > 0
    }

    fn persist_pending(&mut self) -> Result<(), Status> {
        let mut outcome = Ok(());
        for index in 0..self.pending_len {
            // Every range is tried: one failure must not leave the others unpersisted.
            if let Err(status) = self.persist(self.pending[index]) {
                outcome = Err(status);
            }
        }
        self.pending_len = 0;
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(offset: usize, len: usize) -> PendingRange {
        PendingRange { space: 0, offset, len }
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

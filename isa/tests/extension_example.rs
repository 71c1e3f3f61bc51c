//! The extension `docs/EXTENDING.md` walks through, with its test: COUNT (`0x82`) counts the
//! bytes of a range equal to a value. The document's code blocks are checked to appear here
//! verbatim, so the walk-through cannot drift from code that compiles and passes.

use netdam_isa::extension::{
    Alignment, ByteBounds, ExtensionCall, ExtensionHandler, ExtensionOutcome, ExtensionRegistry, ExtensionSpec,
    Permissions,
};
use netdam_isa::memory::SharedMemory;
use netdam_isa::semantics::AddressSpaces;
use netdam_isa::wire::Instruction;
use netdam_isa::Status;

// --- the handler, as in EXTENDING.md ---

/// COUNT: how many bytes of the range equal `aux` (0-255). Answer: the count, `u64`.
pub struct Count;

/// Bytes read onto the worker's stack per pass: no allocation.
const COUNT_PASS_BYTES: usize = 4096;

impl ExtensionHandler for Count {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec {
            opcode: 0x82,
            name: "count",
            idempotent: true,
            permissions: Permissions::READ,
            flags: 0,
            aux_max: 0xFF,
            operand_bytes: ByteBounds::exactly(0),
            operand_is_length: false,
            length_bytes: ByteBounds { min: 1, max: 1 << 20 },
            alignment: Alignment::Bytes(1),
            answer_bytes_max: 8,
        }
    }

    fn execute(&self, call: &ExtensionCall<'_>, answer: &mut [u8]) -> Result<ExtensionOutcome, Status> {
        let value = call.aux as u8; // the registry checked aux <= 0xFF
        let mut pass = [0u8; COUNT_PASS_BYTES];
        let mut count = 0u64;
        let mut at = 0;
        while at < call.range.len() {
            let len = (call.range.len() - at).min(COUNT_PASS_BYTES);
            call.range.read(at, &mut pass[..len]);
            count += pass[..len].iter().filter(|byte| **byte == value).count() as u64;
            at += len;
        }
        answer[..8].copy_from_slice(&count.to_le_bytes());
        Ok(ExtensionOutcome { answer_len: 8, written: None })
    }
}

// --- its test ---

struct Regions<'a>(Vec<SharedMemory<'a>>);

impl AddressSpaces for Regions<'_> {
    fn memory(&self, space: u16) -> Option<SharedMemory<'_>> {
        self.0.get(usize::from(space)).copied()
    }
}

fn count(offset: u64, length: u32, aux: u32) -> Instruction<'static> {
    Instruction { opcode: 0x82, flags: 0, space: 0, offset, length, aux, operand: &[] }
}

#[test]
fn count_counts_and_the_registry_enforces_its_declaration() {
    let mut registry = ExtensionRegistry::new();
    registry.register(Box::new(Count)).unwrap();
    let mut words = vec![0u64; 1024]; // an 8 KiB region of zeroes
    let regions = Regions(vec![SharedMemory::from_words(&mut words)]);
    regions.0[0].fill(100, 50, 0xAB);
    let mut out = [0u8; 64];

    let outcome = registry.execute(&count(0, 8192, 0xAB), &regions, Permissions::ALL, &mut out).unwrap();
    assert_eq!((outcome.data_len, outcome.written), (8, None));
    assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), 50);
    registry.execute(&count(120, 1000, 0), &regions, Permissions::ALL, &mut out).unwrap();
    assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), 1000 - 30);

    // What the declaration rules out never reaches the handler.
    let refused = |instruction: Instruction<'_>, granted, room: usize| {
        let mut out = [0u8; 64];
        registry.execute(&instruction, &regions, granted, &mut out[..room]).unwrap_err()
    };
    assert_eq!(refused(count(0, 8, 0x100), Permissions::ALL, 64), Status::Malformed);
    assert_eq!(refused(Instruction { flags: 1, ..count(0, 8, 0) }, Permissions::ALL, 64), Status::Malformed);
    assert_eq!(refused(count(0, 0, 0), Permissions::ALL, 64), Status::Malformed);
    assert_eq!(refused(Instruction { space: 3, ..count(0, 8, 0) }, Permissions::ALL, 64), Status::NoSuchSpace);
    assert_eq!(refused(count(0, 8, 0), Permissions::WRITE, 64), Status::PermissionDenied);
    assert_eq!(refused(count(8000, 200, 0), Permissions::ALL, 64), Status::OutOfRange);
    assert_eq!(refused(Instruction { operand: &[1], ..count(0, 8, 0) }, Permissions::ALL, 64), Status::TooLarge);
    assert_eq!(refused(count(0, 8, 0), Permissions::ALL, 4), Status::TooLarge);
    assert_eq!(refused(Instruction { opcode: 0x83, ..count(0, 8, 0) }, Permissions::ALL, 64), Status::UnknownOpcode);
    assert_eq!(registry.is_idempotent(0x82), Some(true));
}

/// Every `rust` block of EXTENDING.md is a verbatim excerpt of this file.
#[test]
fn the_walk_through_quotes_this_file() {
    const DOCUMENT: &str = include_str!("../../docs/EXTENDING.md");
    const SOURCE: &str = include_str!("extension_example.rs");
    let blocks: Vec<&str> =
        DOCUMENT.split("```rust\n").skip(1).map(|rest| &rest[..rest.find("```").unwrap()]).collect();
    assert!(blocks.len() >= 2, "EXTENDING.md shows the handler and its test");
    for block in blocks {
        assert!(SOURCE.contains(block), "EXTENDING.md shows code this file does not have:\n{block}");
    }
}

mod untrusted {
    use super::*;
    use netdam_isa::extension::reduce::Reduce;
    use netdam_isa::extension::vmax::Vmax;
    use proptest::prelude::*;

    proptest! {
        /// Any REDUCE, VMAX or COUNT a network could send gets a status or a well-formed answer
        /// from the registry; none panics, no answer is longer than declared, and only VMAX writes,
        /// within its range.
        #[test]
        fn any_extension_instruction_gets_a_status_never_a_panic(
            opcode in prop_oneof![Just(0x80u8), Just(0x81u8), Just(0x82u8), any::<u8>()],
            flags in prop_oneof![Just(0u8), any::<u8>()],
            space in prop_oneof![Just(0u16), any::<u16>()],
            offset in prop_oneof![0u64..20_000, any::<u64>()],
            length in prop_oneof![0u32..20_000, any::<u32>()],
            aux in prop_oneof![0u32..0x0300, any::<u32>()],
            operand in proptest::collection::vec(any::<u8>(), 0..16),
            room in 0usize..64,
            all_granted in any::<bool>(),
        ) {
            let mut registry = ExtensionRegistry::new();
            registry.register(Box::new(Reduce)).unwrap();
            registry.register(Box::new(Count)).unwrap();
            registry.register(Box::new(Vmax)).unwrap();
            let granted = if all_granted { Permissions::ALL } else { Permissions::READ };
            let mut words = vec![0x3F80_0000_3F80_0000u64; 2048];
            let regions = Regions(vec![SharedMemory::from_words(&mut words)]);
            let instruction = Instruction { opcode, flags, space, offset, length, aux, operand: &operand };
            let mut out = vec![0u8; room];
            match registry.execute(&instruction, &regions, granted, &mut out) {
                Ok(outcome) if opcode == 0x81 => {
                    prop_assert_eq!(outcome.data_len, 0);
                    let written = outcome.written.expect("VMAX writes its range");
                    prop_assert_eq!((written.offset as u64, written.len), (offset, length as usize));
                }
                Ok(outcome) => {
                    prop_assert_eq!(outcome.data_len, 8);
                    prop_assert!(outcome.written.is_none());
                }
                Err(status) => prop_assert_ne!(status, Status::Ok),
            }
        }
    }
}

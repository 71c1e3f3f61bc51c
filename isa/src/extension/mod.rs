//! The programmable part of the ISA: opcodes `0x80..=0xFF` dispatched to registered handlers.
//!
//! A handler declares, in an [`ExtensionSpec`], everything the transport must know about its
//! instruction: its opcode and name, whether it is idempotent (the session layer stores answers
//! of the others for retransmissions), the permissions it needs, which flag bits and `aux`
//! values it defines, and the bounds of its operand, of the range it addresses and of its answer.
//! The [`ExtensionRegistry`] checks all of that before the handler runs, in the order of
//! `docs/PROTOCOL.md`, and hands the handler only the addressed range of the region and an answer
//! buffer of its declared size: a handler cannot read or write outside them, and never sees an
//! instruction that breaks its declaration. What is left to a handler is the meaning of its
//! fields (e.g. which `aux` values inside the declared bound name an operation).
//!
//! Handlers run on a worker's hot path: they must not allocate, block or make system calls, and
//! must bound their work by their declared range length. `docs/EXTENDING.md` walks through
//! adding one.

pub mod reduce;
pub mod vmax;

use core::ops::Range;

use crate::limits::MAX_DATAGRAM_BYTES;
use crate::memory::SharedMemory;
use crate::opcode::{LaneType, EXTENSION_OPCODE_FIRST};
use crate::semantics::{AddressSpaces, Outcome, Written};
use crate::status::Status;
use crate::wire::Instruction;

/// Opcode numbers an extension may take.
pub const EXTENSION_OPCODES: core::ops::RangeInclusive<u8> = EXTENSION_OPCODE_FIRST..=0xFF;

const EXTENSION_SLOTS: usize = 256 - EXTENSION_OPCODE_FIRST as usize;

/// What a session may do with a region (DESIGN: read, write, atomic, compute, block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Permissions(u8);

impl Permissions {
    /// None.
    pub const NONE: Permissions = Permissions(0);
    /// Read bytes.
    pub const READ: Permissions = Permissions(0x01);
    /// Modify bytes.
    pub const WRITE: Permissions = Permissions(0x02);
    /// Atomic read-modify-write.
    pub const ATOMIC: Permissions = Permissions(0x04);
    /// Compute on the target's memory (VADD, extensions that compute).
    pub const COMPUTE: Permissions = Permissions(0x08);
    /// Block I/O on namespaces.
    pub const BLOCK: Permissions = Permissions(0x10);
    /// Every permission.
    pub const ALL: Permissions = Permissions(0x1F);
    /// Each permission with its name, as configuration spells it.
    pub const NAMED: [(&'static str, Permissions); 5] = [
        ("read", Permissions::READ),
        ("write", Permissions::WRITE),
        ("atomic", Permissions::ATOMIC),
        ("compute", Permissions::COMPUTE),
        ("block", Permissions::BLOCK),
    ];

    /// Both sets together.
    pub const fn union(self, other: Permissions) -> Permissions {
        Permissions(self.0 | other.0)
    }

    /// Whether every permission of `needed` is in this set.
    pub const fn contains(self, needed: Permissions) -> bool {
        self.0 & needed.0 == needed.0
    }

    /// The permission called `name` (`read`, `write`, `atomic`, `compute`, `block`).
    pub fn from_name(name: &str) -> Option<Permissions> {
        Permissions::NAMED.iter().find(|(known, _)| *known == name).map(|(_, permission)| *permission)
    }
}

/// An inclusive range of byte counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteBounds {
    /// Fewest bytes.
    pub min: usize,
    /// Most bytes.
    pub max: usize,
}

impl ByteBounds {
    /// Exactly `bytes`.
    pub const fn exactly(bytes: usize) -> ByteBounds {
        ByteBounds { min: bytes, max: bytes }
    }
}

/// Alignment the dispatcher requires of an extension instruction's offset and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alignment {
    /// Multiples of this many bytes (a power of two; 1 for none).
    Bytes(usize),
    /// Multiples of the lane size of the [`LaneType`] in `aux`'s low byte, as VADD's lanes; an
    /// unknown lane type is `malformed`.
    LaneInAuxLowByte,
}

/// What a handler declares about its instruction; the registry enforces all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtensionSpec {
    /// Opcode number, in [`EXTENSION_OPCODES`].
    pub opcode: u8,
    /// Lower-case name, for configuration, counters and the CLI.
    pub name: &'static str,
    /// Executing it twice has the effect of once: its answer need not be stored for
    /// retransmissions. Declare `false` for anything that changes memory based on what it read.
    pub idempotent: bool,
    /// Permissions a session needs on the addressed region.
    pub permissions: Permissions,
    /// Flag bits it defines; a request with any other bit set is `malformed`.
    pub flags: u8,
    /// Largest `aux` it accepts; above is `malformed`.
    pub aux_max: u32,
    /// Operand bytes: fewer is `malformed`, more is `too_large`.
    pub operand_bytes: ByteBounds,
    /// The operand must be exactly as long as the length (lanes to combine with the range, as
    /// VADD's): `malformed` otherwise.
    pub operand_is_length: bool,
    /// Bytes of the region it addresses (the instruction's length): fewer is `malformed`, more
    /// is `too_large`. This bounds the handler's work on the worker.
    pub length_bytes: ByteBounds,
    /// Of the offset and the length: `unaligned` otherwise.
    pub alignment: Alignment,
    /// Most answer bytes: less room than this left in the response is `too_large`.
    pub answer_bytes_max: usize,
}

/// A checked extension instruction, as its handler sees it.
#[derive(Debug, Clone, Copy)]
pub struct ExtensionCall<'a> {
    /// The request's flags (only declared bits).
    pub flags: u8,
    /// The request's aux (at most the declared bound).
    pub aux: u32,
    /// The operand (within the declared bounds).
    pub operand: &'a [u8],
    /// Exactly the addressed range of the region: byte 0 is the instruction's offset.
    pub range: SharedMemory<'a>,
}

/// What a handler did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtensionOutcome {
    /// Answer bytes written at the start of the answer buffer.
    pub answer_len: usize,
    /// Bytes of the range it modified (relative to the range), to persist before answering.
    pub written: Option<Range<usize>>,
}

/// A handler of one extension opcode.
pub trait ExtensionHandler: Send + Sync {
    /// Its declaration; read once, at registration.
    fn spec(&self) -> ExtensionSpec;

    /// Executes a checked instruction, writing at most `answer.len()` (the declared maximum)
    /// answer bytes. Must not allocate, block, or panic on any request its declaration admits.
    fn execute(&self, call: &ExtensionCall<'_>, answer: &mut [u8]) -> Result<ExtensionOutcome, Status>;
}

/// Why a handler was not registered: its declaration is inconsistent or its opcode taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// The opcode is outside `0x80..=0xFF`.
    OpcodeOutOfRange { name: &'static str, opcode: u8 },
    /// Another handler holds the opcode.
    OpcodeTaken { name: &'static str, opcode: u8, holder: &'static str },
    /// Another handler has the name.
    NameTaken { name: &'static str },
    /// A bound is inverted, an alignment not a power of two, or the answer larger than any
    /// datagram.
    BadBounds { name: &'static str, reason: &'static str },
}

impl core::fmt::Display for RegistryError {
    fn fmt(&self, formatter: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RegistryError::OpcodeOutOfRange { name, opcode } => {
                write!(formatter, "extension {name}: opcode {opcode:#04x} is outside the extension range 0x80..=0xff")
            }
            RegistryError::OpcodeTaken { name, opcode, holder } => {
                write!(formatter, "extension {name}: opcode {opcode:#04x} is already taken by extension {holder}")
            }
            RegistryError::NameTaken { name } => write!(formatter, "extension {name} is registered twice"),
            RegistryError::BadBounds { name, reason } => write!(formatter, "extension {name}: {reason}"),
        }
    }
}

impl std::error::Error for RegistryError {}

struct Registered {
    spec: ExtensionSpec,
    handler: Box<dyn ExtensionHandler>,
}

/// The handlers a target serves, by opcode; built at start-up and read-only afterwards.
pub struct ExtensionRegistry {
    slots: [Option<Registered>; EXTENSION_SLOTS],
}

impl core::fmt::Debug for ExtensionRegistry {
    fn fmt(&self, formatter: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        formatter.debug_list().entries(self.specs()).finish()
    }
}

impl Default for ExtensionRegistry {
    fn default() -> ExtensionRegistry {
        ExtensionRegistry::new()
    }
}

fn slot(opcode: u8) -> Option<usize> {
    opcode.checked_sub(EXTENSION_OPCODE_FIRST).map(usize::from)
}

impl ExtensionRegistry {
    /// No handlers: every extension opcode is `unknown_opcode`.
    pub fn new() -> ExtensionRegistry {
        ExtensionRegistry { slots: core::array::from_fn(|_| None) }
    }

    /// Adds `handler` after checking its declaration.
    pub fn register(&mut self, handler: Box<dyn ExtensionHandler>) -> Result<(), RegistryError> {
        let spec = handler.spec();
        let name = spec.name;
        let Some(index) = slot(spec.opcode) else {
            return Err(RegistryError::OpcodeOutOfRange { name, opcode: spec.opcode });
        };
        let bad = |reason| Err(RegistryError::BadBounds { name, reason });
        if spec.operand_bytes.min > spec.operand_bytes.max || spec.length_bytes.min > spec.length_bytes.max {
            return bad("a minimum is above its maximum");
        }
        if spec.operand_bytes.max > MAX_DATAGRAM_BYTES || spec.answer_bytes_max > MAX_DATAGRAM_BYTES {
            return bad("an operand or answer larger than any datagram");
        }
        if spec.length_bytes.max > u32::MAX as usize {
            return bad("a length beyond the 32-bit length field");
        }
        if let Alignment::Bytes(bytes) = spec.alignment {
            if !bytes.is_power_of_two() {
                return bad("the alignment is not a power of two");
            }
        }
        if let Some(holder) = &self.slots[index] {
            return Err(RegistryError::OpcodeTaken { name, opcode: spec.opcode, holder: holder.spec.name });
        }
        if self.specs().any(|other| other.name == name) {
            return Err(RegistryError::NameTaken { name });
        }
        self.slots[index] = Some(Registered { spec, handler });
        Ok(())
    }

    /// The declarations of every registered handler, by opcode.
    pub fn specs(&self) -> impl Iterator<Item = &ExtensionSpec> {
        self.slots.iter().flatten().map(|registered| &registered.spec)
    }

    /// The declaration of the handler of `opcode`, if one is registered.
    pub fn spec(&self, opcode: u8) -> Option<&ExtensionSpec> {
        self.slots[slot(opcode)?].as_ref().map(|registered| &registered.spec)
    }

    /// Whether an instruction with `opcode` is idempotent: `None` when no handler has it.
    pub fn is_idempotent(&self, opcode: u8) -> Option<bool> {
        self.spec(opcode).map(|spec| spec.idempotent)
    }

    /// Checks `instruction` against its handler's declaration, in the order of
    /// `docs/PROTOCOL.md`, then runs the handler on the addressed range with `out` (the room
    /// left in the response) cut to the declared answer size. `granted` are the permissions the
    /// sender holds on the region.
    pub fn execute(
        &self,
        instruction: &Instruction<'_>,
        spaces: &impl AddressSpaces,
        granted: Permissions,
        out: &mut [u8],
    ) -> Result<Outcome, Status> {
        let registered =
            slot(instruction.opcode).and_then(|index| self.slots[index].as_ref()).ok_or(Status::UnknownOpcode)?;
        let spec = &registered.spec;
        let length = instruction.length as usize;
        let operand_len = instruction.operand.len();
        // 1. fields
        let fields_ok = instruction.flags & !spec.flags == 0
            && instruction.aux <= spec.aux_max
            && operand_len >= spec.operand_bytes.min
            && length >= spec.length_bytes.min
            && (!spec.operand_is_length || operand_len == length);
        let alignment = match spec.alignment {
            Alignment::Bytes(bytes) => Some(bytes),
            Alignment::LaneInAuxLowByte => LaneType::from_u32(instruction.aux & 0xFF).map(LaneType::lane_bytes),
        };
        let Some(alignment) = alignment.filter(|_| fields_ok) else {
            return Err(Status::Malformed);
        };
        // 2. the space, 3. the grant
        let memory = spaces.memory(instruction.space).ok_or(Status::NoSuchSpace)?;
        if !granted.contains(spec.permissions) {
            return Err(Status::PermissionDenied);
        }
        // 4. alignment, 5. bounds, 6. sizes
        if !instruction.offset.is_multiple_of(alignment as u64) || !length.is_multiple_of(alignment) {
            return Err(Status::Unaligned);
        }
        let range = memory.range(instruction.offset, length).ok_or(Status::OutOfRange)?;
        if length > spec.length_bytes.max || operand_len > spec.operand_bytes.max || out.len() < spec.answer_bytes_max {
            return Err(Status::TooLarge);
        }
        let call = ExtensionCall {
            flags: instruction.flags,
            aux: instruction.aux,
            operand: instruction.operand,
            range: memory.sub_view(range.start, length),
        };
        let answer = &mut out[..spec.answer_bytes_max];
        let outcome = registered.handler.execute(&call, answer)?;
        // A handler could not have written beyond its answer buffer or range; a larger figure
        // is its bug, cut to what it could have done.
        debug_assert!(outcome.answer_len <= answer.len(), "extension {} overstated its answer", spec.name);
        let written = outcome.written.map(|written| {
            let end = written.end.min(length);
            let start = written.start.min(end);
            Written { space: instruction.space, offset: range.start + start, len: end - start }
        });
        Ok(Outcome { data_len: outcome.answer_len.min(answer.len()), written })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Declared(ExtensionSpec);

    impl ExtensionHandler for Declared {
        fn spec(&self) -> ExtensionSpec {
            self.0
        }
        fn execute(&self, _call: &ExtensionCall<'_>, _answer: &mut [u8]) -> Result<ExtensionOutcome, Status> {
            Ok(ExtensionOutcome::default())
        }
    }

    fn spec(opcode: u8, name: &'static str) -> ExtensionSpec {
        ExtensionSpec {
            opcode,
            name,
            idempotent: true,
            permissions: Permissions::READ,
            flags: 0,
            aux_max: 0,
            operand_bytes: ByteBounds::exactly(0),
            operand_is_length: false,
            length_bytes: ByteBounds { min: 0, max: 64 },
            alignment: Alignment::Bytes(1),
            answer_bytes_max: 0,
        }
    }

    #[test]
    fn inconsistent_declarations_and_taken_opcodes_are_refused() {
        let mut registry = ExtensionRegistry::new();
        assert_eq!(
            registry.register(Box::new(Declared(spec(0x7F, "low")))),
            Err(RegistryError::OpcodeOutOfRange { name: "low", opcode: 0x7F })
        );
        registry.register(Box::new(Declared(spec(0x90, "first")))).unwrap();
        assert_eq!(
            registry.register(Box::new(Declared(spec(0x90, "second")))),
            Err(RegistryError::OpcodeTaken { name: "second", opcode: 0x90, holder: "first" })
        );
        assert_eq!(
            registry.register(Box::new(Declared(spec(0x91, "first")))),
            Err(RegistryError::NameTaken { name: "first" })
        );
        let inverted = ExtensionSpec { length_bytes: ByteBounds { min: 8, max: 4 }, ..spec(0x92, "inverted") };
        assert!(matches!(registry.register(Box::new(Declared(inverted))), Err(RegistryError::BadBounds { .. })));
        let odd = ExtensionSpec { alignment: Alignment::Bytes(3), ..spec(0x93, "odd") };
        assert!(matches!(registry.register(Box::new(Declared(odd))), Err(RegistryError::BadBounds { .. })));
        assert_eq!(registry.specs().map(|spec| spec.name).collect::<Vec<_>>(), ["first"]);
        assert_eq!(registry.is_idempotent(0x90), Some(true));
        assert_eq!(registry.is_idempotent(0x91), None);
        assert_eq!(registry.is_idempotent(0x10), None, "not an extension opcode");
    }
}

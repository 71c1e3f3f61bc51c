//! The ranges a command addresses, checked against the sizes HELLO listed before anything is
//! allocated or sent.
//!
//! The target checks every instruction's range too, but a long transfer goes as several
//! pipelined instructions: the target refuses only the pieces past the end, after the pieces
//! before it were written, so a refused write would still change data. A read's buffer is
//! allocated before the first instruction goes, so only a check here keeps a mistyped length
//! from asking for terabytes. Ends are computed in `u128`, where `offset + len` cannot wrap.

use netdam_isa::control::{NamespaceInfo, RegionInfo};

/// Refuses `len` bytes at `offset` of `region` unless they lie within it. `command` names what
/// was asked (`read`, `memcpy source`, ...) at the start of the message.
pub fn check_region_range(command: &str, region: &RegionInfo, offset: u64, len: u64) -> Result<(), String> {
    if u128::from(offset) + u128::from(len) <= u128::from(region.size_bytes) {
        return Ok(());
    }
    Err(format!(
        "{command}: {} at offset {offset} would run past the end of region {:?} ({}; {}); nothing was sent",
        count(len, "byte"),
        region.name,
        count(region.size_bytes, "byte"),
        room(offset, region.size_bytes, "byte", "offset"),
    ))
}

/// Refuses `blocks` blocks at block `lba` of `namespace` unless they lie within it. `command`
/// names what was asked (`bread`, `trim`, ...) at the start of the message.
pub fn check_block_range(command: &str, namespace: &NamespaceInfo, lba: u64, blocks: u64) -> Result<(), String> {
    if u128::from(lba) + u128::from(blocks) <= u128::from(namespace.capacity_blocks) {
        return Ok(());
    }
    Err(format!(
        "{command}: {} at block {lba} would run past the end of namespace {:?} ({} of {} bytes; {}); nothing was sent",
        count(blocks, "block"),
        namespace.name,
        count(namespace.capacity_blocks, "block"),
        namespace.block_bytes,
        room(lba, namespace.capacity_blocks, "block", "block"),
    ))
}

/// What still fits from `start` of a space of `size` units: what a user may ask for instead.
fn room(start: u64, size: u64, unit: &str, start_name: &str) -> String {
    match size.checked_sub(start) {
        Some(left) => format!("at most {} from {start_name} {start}", count(left, unit)),
        None => format!("{start_name} {start} is past its end"),
    }
}

/// `1 byte`, `2 bytes`.
fn count(number: u64, unit: &str) -> String {
    if number == 1 {
        format!("1 {unit}")
    } else {
        format!("{number} {unit}s")
    }
}

//! The ranges a command addresses, checked against the sizes HELLO listed before anything is
//! allocated or sent.
//!
//! The target checks every instruction's range too, but a long transfer goes as several
//! pipelined instructions: the target refuses only the pieces past the end, after the pieces
//! before it were written, so a refused write would still change data. A read streams to its
//! output, so a mistyped length would fill a file with what fits before the target refused
//! the rest. Ends are computed in `u128`, where `offset + len` cannot wrap.

use netdam_isa::control::{NamespaceInfo, RegionInfo};

/// Refuses `len` bytes at `offset` of `region` unless they lie within it. `command` names what
/// was asked (`read`, `memcpy source`, ...) at the start of the message.
pub fn check_region_range(command: &str, region: &RegionInfo, offset: u64, len: u64) -> Result<(), String> {
    let space =
        Space { kind: "region", name: &region.name, size: region.size_bytes, unit: "byte", size_detail: String::new() };
    check_range(command, &space, (offset, "offset"), len)
}

/// Refuses `blocks` blocks at block `lba` of `namespace` unless they lie within it. `command`
/// names what was asked (`bread`, `trim`, ...) at the start of the message.
pub fn check_block_range(command: &str, namespace: &NamespaceInfo, lba: u64, blocks: u64) -> Result<(), String> {
    let size_detail = format!(" of {} bytes", namespace.block_bytes);
    let space =
        Space { kind: "namespace", name: &namespace.name, size: namespace.capacity_blocks, unit: "block", size_detail };
    check_range(command, &space, (lba, "block"), blocks)
}

/// Refuses a count of 0 `unit`s: what `bread ... 0` printed (nothing, or an emptied --out
/// file) was no answer at all. Not for ENCRYPT and DECRYPT, whose 0 bytes seal the AAD alone.
pub fn check_not_empty(command: &str, count: u64, unit: &str) -> Result<(), String> {
    if count == 0 {
        return Err(format!("{command}: 0 {unit}s asks for nothing: give at least 1; nothing was sent"));
    }
    Ok(())
}

/// A region or namespace as the messages name it: its size counted in `unit`s.
struct Space<'a> {
    kind: &'static str,
    name: &'a str,
    size: u64,
    unit: &'static str,
    /// Said after the size (a namespace's block size).
    size_detail: String,
}

/// Refuses `count` units at `start` (named `start_name` in the message) unless they lie within
/// `space`, the end computed in `u128`.
fn check_range(command: &str, space: &Space, (start, start_name): (u64, &str), count: u64) -> Result<(), String> {
    if u128::from(start) + u128::from(count) <= u128::from(space.size) {
        return Ok(());
    }
    Err(format!(
        "{command}: {} at {start_name} {start} would run past the end of {} {:?} ({}{}; {}); nothing was sent",
        self::count(count, space.unit),
        space.kind,
        space.name,
        self::count(space.size, space.unit),
        space.size_detail,
        room(start, space.size, space.unit, start_name),
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

//! Tenants, their keys, grants and QoS settings, as the running target applies them.
//!
//! The metadata store keeps [`TenantRecord`]s (`netdam-target tenant …`, `grant`, `revoke`). A
//! running target turns them into a [`TenantSnapshot`]: the grants resolved against the regions
//! and namespaces it serves, indexed by space id, so the per-instruction check is two array
//! reads. A new snapshot is published through a [`TenantCell`] when the store changes; workers
//! notice the new generation with one atomic load per datagram and take the snapshot under a
//! lock only then (never on the steady-state path).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use netdam_auth::TenantKey;
use netdam_isa::extension::Permissions;
use serde::{Deserialize, Serialize};

use crate::namespaces::NamespaceTable;
use crate::regions::RegionTable;

/// Most tenants a store holds; ids run from 1 to this (0 is "no tenant").
pub const MAX_TENANTS: u32 = 1024;

/// Most grants one tenant holds.
pub const MAX_GRANTS_PER_TENANT: usize = 256;

/// Which requests a tenant's are when the target is overloaded: best-effort ones are shed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QosClass {
    /// Served first; shed only when the worker itself is overloaded.
    #[default]
    LatencyCritical,
    /// Shed with BUSY (and a back-off hint) as soon as requests start queueing.
    BestEffort,
}

/// Per-tenant bounds, all enforced by the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLimits {
    /// Sessions open at once, over every worker.
    pub max_sessions: u32,
    /// Block datagrams in flight at the target at once: those waiting for a device (a memory
    /// region's are answered in the pass that received them and never wait).
    pub max_in_flight: u32,
    /// Cost units per second the tenant's token bucket refills at (see `qos`); 0 is unlimited.
    pub cost_per_second: u64,
    /// Bucket depth in cost units: how much a tenant may spend in a burst.
    pub burst: u64,
    /// Whether `burst` was given (`--burst`). One never given is one second of the rate and
    /// follows it when the rate changes; a given one stays as it is. (Absent in records stored
    /// before it existed: read as not given.)
    #[serde(default)]
    pub burst_explicit: bool,
}

impl Default for TenantLimits {
    fn default() -> TenantLimits {
        TenantLimits { max_sessions: 64, max_in_flight: 256, cost_per_second: 0, burst: 0, burst_explicit: false }
    }
}

/// What a grant addresses, by name as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GrantSpace {
    /// A region by name.
    Region(String),
    /// A namespace by name.
    Namespace(String),
    /// An ENCRYPT and DECRYPT key slot by number (0 to 255): a key is the target's, and using it
    /// is granted per tenant, so one tenant cannot open what another sealed.
    KeySlot(u32),
    /// Every region and namespace, and every key slot, present and future.
    All,
}

/// One grant as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRecord {
    /// What it addresses.
    pub space: GrantSpace,
    /// Permission names (`read`, `write`, `atomic`, `compute`, `block`, `admin`).
    pub permissions: Vec<String>,
    /// A byte range `[offset, offset + len)` within the space, or the whole space.
    pub range: Option<(u64, u64)>,
}

/// One tenant as stored. (`Debug` leaves the key out.)
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    /// Unique name.
    pub name: String,
    /// Number HELLO names it by, 1 to [`MAX_TENANTS`].
    pub id: u32,
    /// Key rotations so far (1 for the first key).
    pub key_version: u32,
    /// The key, as 64 hex digits (the store file is owner-only).
    pub key_hex: String,
    /// Overload class.
    #[serde(default)]
    pub class: QosClass,
    /// Bounds.
    #[serde(default)]
    pub limits: TenantLimits,
    /// What it may touch.
    #[serde(default)]
    pub grants: Vec<GrantRecord>,
}

impl std::fmt::Debug for TenantRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantRecord")
            .field("name", &self.name)
            .field("id", &self.id)
            .field("key_version", &self.key_version)
            .field("key_hex", &"<secret>")
            .field("class", &self.class)
            .field("limits", &self.limits)
            .field("grants", &self.grants)
            .finish()
    }
}

/// A grant resolved to bytes of one space: permissions over `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// What it allows.
    pub permissions: Permissions,
    /// First byte.
    pub start: u64,
    /// One past the last byte, or [`Grant::UNBOUNDED`].
    pub end: u64,
}

impl Grant {
    /// The `end` of a grant that reaches its space's end (a grant over the whole space, or over
    /// a range running to or past the end): it covers every range from `start` on, even one
    /// whose end overflows `u64`. Past the space's end there are no bytes to withhold, so such
    /// a range passes the grant and gets the space's `out_of_range`, as PROTOCOL.md ("Grants")
    /// has it, never `permission_denied`.
    pub const UNBOUNDED: u64 = u64::MAX;

    /// Whether `[offset, offset + len)` lies within the grant and `needed` is granted.
    ///
    /// The end saturates rather than failing on overflow: a range whose end overflows lies
    /// within an unbounded grant (the space then answers `out_of_range`) and beyond every
    /// bounded one, whose `end` is below `u64::MAX`; a saturated sum is exact in both
    /// comparisons. Callers that scale blocks to bytes may saturate the same way.
    pub fn allows(&self, needed: Permissions, offset: u64, len: u64) -> bool {
        self.permissions.contains(needed) && offset >= self.start && offset.saturating_add(len) <= self.end
    }
}

/// A tenant as a running target applies it.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Its number.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Its key.
    pub key: TenantKey,
    /// Key rotations so far: a session opened under another version is ended.
    pub key_version: u32,
    /// Overload class.
    pub class: QosClass,
    /// Bounds.
    pub limits: TenantLimits,
    /// Grants by region id (the union of every grant naming it); `None`: nothing granted.
    pub regions: Vec<Option<Grant>>,
    /// Grants by namespace id, in bytes.
    pub namespaces: Vec<Option<Grant>>,
    /// Which key slots it may seal and open with.
    pub key_slots: KeySlotGrants,
    /// May read the target's counters (STAT) and manage it.
    pub admin: bool,
}

/// Which key slots a tenant may ENCRYPT and DECRYPT with: one bit per slot and use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeySlotGrants {
    encrypt: [u64; 4],
    decrypt: [u64; 4],
}

impl KeySlotGrants {
    /// Whether slot `slot` may be used to decrypt (`decrypt`) or encrypt (else); a slot of 256
    /// or more is allowed nothing.
    pub fn allows(&self, slot: u32, decrypt: bool) -> bool {
        let bits = if decrypt { &self.decrypt } else { &self.encrypt };
        let (word, bit) = (slot as usize / 64, slot % 64);
        bits.get(word).is_some_and(|word| word & (1 << bit) != 0)
    }

    /// Grants `slot` (every slot when `None`) for the uses named in `permissions`.
    fn grant(&mut self, slot: Option<u32>, permissions: &[String]) {
        let has = |name: &str| permissions.iter().any(|held| held == name || held == "all");
        for (bits, used) in [(&mut self.encrypt, has("encrypt")), (&mut self.decrypt, has("decrypt"))] {
            if !used {
                continue;
            }
            match slot {
                None => *bits = [u64::MAX; 4],
                Some(slot) if (slot as usize) < 256 => bits[slot as usize / 64] |= 1 << (slot % 64),
                Some(_) => {}
            }
        }
    }
}

impl Tenant {
    /// What it holds on region `id`.
    pub fn region_grant(&self, id: u16) -> Option<Grant> {
        self.regions.get(usize::from(id)).copied().flatten()
    }

    /// What it holds on namespace `id`.
    pub fn namespace_grant(&self, id: u16) -> Option<Grant> {
        self.namespaces.get(usize::from(id)).copied().flatten()
    }
}

/// Every tenant of the store, resolved against the spaces the target serves.
#[derive(Debug, Clone, Default)]
pub struct TenantSnapshot {
    /// By id; index 0 is unused.
    tenants: Vec<Option<Tenant>>,
}

impl TenantSnapshot {
    /// The tenant numbered `id`.
    pub fn tenant(&self, id: u32) -> Option<&Tenant> {
        self.tenants.get(id as usize).and_then(Option::as_ref)
    }

    /// Every tenant.
    pub fn iter(&self) -> impl Iterator<Item = &Tenant> {
        self.tenants.iter().flatten()
    }

    /// The same tenants with no use of any key slot: what is in force while the store's keys
    /// cannot be compared with those loaded (see `tenant_watch`).
    pub fn without_key_slots(mut self) -> TenantSnapshot {
        for tenant in self.tenants.iter_mut().flatten() {
            tenant.key_slots = KeySlotGrants::default();
        }
        self
    }

    /// Whether there is no tenant.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// Resolves `records` against the spaces served. A record that cannot be applied (a bad
    /// key, an unknown permission name) is left out and named in the returned warnings; a grant
    /// naming a space this target does not serve grants nothing here.
    pub fn resolve(
        records: &[TenantRecord],
        regions: &RegionTable,
        namespaces: &NamespaceTable,
    ) -> (TenantSnapshot, Vec<String>) {
        let mut warnings = Vec::new();
        let mut tenants: Vec<Option<Tenant>> = Vec::new();
        for record in records {
            if record.id == 0 || record.id > MAX_TENANTS {
                warnings.push(format!("tenant {:?}: id {} is outside 1..={MAX_TENANTS}", record.name, record.id));
                continue;
            }
            let key = match TenantKey::from_hex(&record.key_hex) {
                Ok(key) => key,
                Err(error) => {
                    warnings.push(format!("tenant {:?}: {error}", record.name));
                    continue;
                }
            };
            let mut tenant = Tenant {
                id: record.id,
                name: record.name.clone(),
                key,
                key_version: record.key_version,
                class: record.class,
                limits: record.limits,
                regions: vec![None; regions.iter().len()],
                namespaces: vec![None; namespaces.iter().len()],
                key_slots: KeySlotGrants::default(),
                admin: false,
            };
            for grant in &record.grants {
                match grant.space {
                    GrantSpace::KeySlot(slot) => {
                        if grant.permissions.iter().all(|name| KEY_PERMISSION_NAMES.contains(&name.as_str())) {
                            tenant.key_slots.grant(Some(slot), &grant.permissions);
                        } else {
                            warnings.push(format!(
                                "tenant {:?}: key slot {slot} granted {:?}; a key slot takes only encrypt and decrypt",
                                record.name, grant.permissions
                            ));
                        }
                        continue;
                    }
                    GrantSpace::All => tenant.key_slots.grant(None, &grant.permissions),
                    GrantSpace::Region(_) | GrantSpace::Namespace(_) => {}
                }
                let mut admin = false;
                let Some(permissions) = parse_permissions(&grant.permissions, &mut admin) else {
                    warnings.push(format!("tenant {:?}: unknown permission in {:?}", record.name, grant.permissions));
                    continue;
                };
                // `admin` is about the target (its counters), so only a grant on every space
                // carries it: `all` on one region does not.
                let every_space = grant.space == GrantSpace::All;
                if every_space && (admin || grant.permissions.iter().any(|name| name == "all")) {
                    tenant.admin = true;
                }
                if permissions == Permissions::NONE {
                    // Only `admin` or key uses (an `all` grant): nothing on any region or
                    // namespace, so no grant there to combine with a ranged one.
                    continue;
                }
                let mut widen = |slot: &mut Option<Grant>, size: u64, kind: &str, name: &str| {
                    // A range reaching the space's end is unbounded, as the whole space is: an
                    // access beyond the end is the engine's `out_of_range`, not a grant's
                    // refusal. A range ending before it keeps its end, so an access past the
                    // space's end from such a tenant is `permission_denied` (it asks for bytes
                    // it was not granted, and the grant check comes first: a tenant learns
                    // nothing beyond its grant, as with no grant on the space at all).
                    let (start, end) = match grant.range {
                        Some((offset, len)) => {
                            let end = offset.saturating_add(len);
                            (offset.min(size), if end >= size { Grant::UNBOUNDED } else { end })
                        }
                        None => (0, Grant::UNBOUNDED),
                    };
                    match merge(*slot, Grant { permissions, start, end }) {
                        Ok(merged) => *slot = Some(merged),
                        Err(kept) => {
                            *slot = Some(kept);
                            warnings.push(format!(
                                "tenant {:?}: grants on {kind} {name:?} over different ranges with different \
                                 permissions cannot be combined; only the first applies",
                                record.name
                            ));
                        }
                    }
                };
                for (id, region) in regions.iter() {
                    let named = matches!(&grant.space, GrantSpace::Region(name) if name == region.name());
                    if named || grant.space == GrantSpace::All {
                        widen(&mut tenant.regions[usize::from(id)], region.len() as u64, "region", region.name());
                    }
                }
                for (id, namespace) in namespaces.iter() {
                    let named = matches!(&grant.space, GrantSpace::Namespace(name) if name == namespace.name());
                    if named || grant.space == GrantSpace::All {
                        let bytes = namespace.capacity_blocks().saturating_mul(u64::from(namespace.block_bytes()));
                        widen(&mut tenant.namespaces[usize::from(id)], bytes, "namespace", namespace.name());
                    }
                }
            }
            let index = record.id as usize;
            if tenants.len() <= index {
                tenants.resize(index + 1, None);
            }
            tenants[index] = Some(tenant);
        }
        (TenantSnapshot { tenants }, warnings)
    }
}

/// Two grants on one space, as one grant that allows nothing either does not: over the same
/// range, the permissions of both; one within the other that it also covers in permissions, the
/// wider. Any other pair cannot be one grant without widening one of them, so the first is kept
/// (`Err`) and the caller warns: failing closed. (The store refuses such pairs, see
/// `MetadataStore::grant`; this guards records written otherwise.)
fn merge(existing: Option<Grant>, new: Grant) -> Result<Grant, Grant> {
    let Some(old) = existing else {
        return Ok(new);
    };
    let within = |inner: &Grant, outer: &Grant| {
        outer.start <= inner.start && inner.end <= outer.end && outer.permissions.contains(inner.permissions)
    };
    if (old.start, old.end) == (new.start, new.end) {
        Ok(Grant { permissions: old.permissions.union(new.permissions), ..old })
    } else if within(&new, &old) {
        Ok(old)
    } else if within(&old, &new) {
        Ok(new)
    } else {
        Err(old)
    }
}

/// The permissions a key slot takes: sealing with its key, and opening what it sealed.
pub const KEY_PERMISSION_NAMES: [&str; 2] = ["encrypt", "decrypt"];

/// Permission names to a set on a region or namespace; `admin` is kept apart (it is not a
/// permission on a space), and the key slots' `encrypt` and `decrypt` (those of an `all` grant)
/// are read by `KeySlotGrants`.
pub fn parse_permissions(names: &[String], admin: &mut bool) -> Option<Permissions> {
    let mut permissions = Permissions::NONE;
    for name in names {
        match name.as_str() {
            "admin" => *admin = true,
            "encrypt" | "decrypt" => {}
            // Every permission on the space (and `admin` with a grant on every space).
            "all" => {
                *admin = true;
                permissions = Permissions::ALL;
            }
            other => permissions = permissions.union(Permissions::from_name(other)?),
        }
    }
    Some(permissions)
}

/// The snapshot in force, replaced whole when the store changes.
#[derive(Debug, Default)]
pub struct TenantCell {
    generation: AtomicU64,
    current: Mutex<Arc<TenantSnapshot>>,
}

impl TenantCell {
    /// A cell holding `snapshot` as generation 1.
    pub fn new(snapshot: TenantSnapshot) -> TenantCell {
        TenantCell { generation: AtomicU64::new(1), current: Mutex::new(Arc::new(snapshot)) }
    }

    /// The generation in force: a worker compares it with the one it holds, per datagram.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The snapshot in force, with its generation.
    pub fn load(&self) -> (u64, Arc<TenantSnapshot>) {
        let current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (self.generation.load(Ordering::Acquire), Arc::clone(&current))
    }

    /// Puts `snapshot` in force.
    pub fn publish(&self, snapshot: TenantSnapshot) {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *current = Arc::new(snapshot);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, RegionBackend, RegionConfig};

    const REGION_BYTES: u64 = 65536;

    /// What tenant 1 holds on region "r" of [`REGION_BYTES`] when granted `read` over `range`.
    fn resolved(range: Option<(u64, u64)>) -> Grant {
        let config =
            RegionConfig { name: "r".into(), backend: RegionBackend::Mem, path: None, size: ByteSize(REGION_BYTES) };
        let regions = RegionTable::open(&[config], std::path::Path::new(".")).unwrap();
        let record = TenantRecord {
            name: "t".into(),
            id: 1,
            key_version: 1,
            key_hex: TenantKey::from_bytes([1; 32]).to_hex(),
            class: QosClass::default(),
            limits: TenantLimits::default(),
            grants: vec![GrantRecord {
                space: GrantSpace::Region("r".into()),
                permissions: vec!["read".into()],
                range,
            }],
        };
        let (snapshot, warnings) = TenantSnapshot::resolve(&[record], &regions, &NamespaceTable::default());
        assert!(warnings.is_empty(), "{warnings:?}");
        snapshot.tenant(1).unwrap().region_grant(0).expect("a grant on r")
    }

    #[test]
    fn a_range_past_the_space_is_the_spaces_to_refuse_only_under_a_grant_reaching_its_end() {
        let read = Permissions::READ;
        for range in [None, Some((4096, REGION_BYTES - 4096)), Some((4096, u64::MAX))] {
            let grant = resolved(range);
            assert_eq!(grant.end, Grant::UNBOUNDED, "{range:?} reaches the end of r");
            assert!(grant.allows(read, 4096, 16), "{range:?}: within");
            assert!(grant.allows(read, REGION_BYTES - 8, 16), "{range:?}: straddles the space's end");
            assert!(grant.allows(read, 0xffff_ffff_ffff_0000, 16), "{range:?}: far past the end");
            assert!(grant.allows(read, 0xffff_ffff_ffff_fff0, 16), "{range:?}: ends exactly at 2^64");
            assert!(grant.allows(read, u64::MAX, 1), "{range:?}: the end overflows");
            assert!(!grant.allows(Permissions::WRITE, u64::MAX, 1), "{range:?}: a permission it lacks");
        }
        for range in [Some((4096, REGION_BYTES - 4096)), Some((4096, u64::MAX))] {
            assert!(!resolved(range).allows(read, 0, 16), "{range:?}: before its start");
            assert!(!resolved(range).allows(read, 4095, u64::MAX), "{range:?}: from before its start, overflowing");
        }

        // A grant ending before the space's end refuses whatever lies past its end, including
        // a range past the space's end or overflowing: the tenant learns nothing beyond it.
        let first_half = resolved(Some((0, REGION_BYTES / 2)));
        assert_eq!((first_half.start, first_half.end), (0, REGION_BYTES / 2));
        assert!(first_half.allows(read, REGION_BYTES / 2 - 16, 16));
        assert!(!first_half.allows(read, REGION_BYTES / 2 - 15, 16), "straddles the grant's end");
        assert!(!first_half.allows(read, REGION_BYTES, 16), "past the space's end");
        assert!(!first_half.allows(read, u64::MAX, 1), "overflowing");
        assert!(!first_half.allows(read, 16, u64::MAX), "overflowing from within the grant");
    }

    #[test]
    fn key_slots_are_used_as_granted_on_the_slot_or_on_all() {
        let names = |list: &[&str]| list.iter().map(|name| name.to_string()).collect::<Vec<_>>();
        let record = |id: u32, grants: Vec<GrantRecord>| TenantRecord {
            name: format!("t{id}"),
            id,
            key_version: 1,
            key_hex: TenantKey::from_bytes([id as u8; 32]).to_hex(),
            class: QosClass::default(),
            limits: TenantLimits::default(),
            grants,
        };
        let grant = |space: GrantSpace, permissions: &[&str]| GrantRecord {
            space,
            permissions: names(permissions),
            range: None,
        };
        let records = [
            record(
                1,
                vec![
                    grant(GrantSpace::KeySlot(3), &["encrypt"]),
                    grant(GrantSpace::KeySlot(200), &["encrypt", "decrypt"]),
                ],
            ),
            record(2, vec![grant(GrantSpace::All, &["read", "decrypt"])]),
            record(3, vec![grant(GrantSpace::All, &["read", "write", "admin"])]),
            // Written otherwise than by the store: a key slot holding a region's permission.
            record(4, vec![grant(GrantSpace::KeySlot(5), &["read"])]),
        ];
        let (snapshot, warnings) = TenantSnapshot::resolve(
            &records,
            &RegionTable::open(&[], std::path::Path::new(".")).unwrap(),
            &NamespaceTable::default(),
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("key slot 5") && warnings[0].contains("encrypt and decrypt"), "{warnings:?}");
        let keys = |id: u32| snapshot.tenant(id).unwrap().key_slots;
        let (encrypt, decrypt) = (false, true);
        assert!(keys(1).allows(3, encrypt) && !keys(1).allows(3, decrypt), "only the use granted");
        assert!(keys(1).allows(200, encrypt) && keys(1).allows(200, decrypt));
        assert!(!keys(1).allows(4, encrypt) && !keys(1).allows(256, encrypt), "only the slots granted");
        assert!(
            (0..256).all(|slot| keys(2).allows(slot, decrypt) && !keys(2).allows(slot, encrypt)),
            "all: every slot"
        );
        assert!(
            (0..256).all(|slot| !keys(3).allows(slot, encrypt) && !keys(3).allows(slot, decrypt)),
            "admin is no key use"
        );
        assert!(!keys(4).allows(5, encrypt) && !keys(4).allows(5, decrypt), "a bad grant grants nothing");
        assert!(!keys(2).allows(u32::MAX, decrypt), "past the slots");
    }
}

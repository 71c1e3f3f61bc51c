//! The table of regions a target serves, opened once at start-up and shared by every worker.

use std::path::Path;

use netdam_isa::memory::SharedMemory;
use netdam_isa::semantics::AddressSpaces;
use netdam_pmem::{Backing, Region, RegionError};

use crate::config::{RegionBackend, RegionConfig};

/// Regions by id: the id is the position in the configuration.
#[derive(Debug)]
pub struct RegionTable {
    regions: Vec<Region>,
}

impl RegionTable {
    /// Opens (creating where missing) every configured region; relative paths are under `data_dir`.
    pub fn open(configs: &[RegionConfig], data_dir: &Path) -> Result<RegionTable, RegionError> {
        let mut regions = Vec::with_capacity(configs.len());
        for config in configs {
            let resolve = |path: &Path| if path.is_absolute() { path.to_path_buf() } else { data_dir.join(path) };
            let backing = match (config.backend, &config.path) {
                (RegionBackend::Mem, _) => Backing::Anonymous,
                (RegionBackend::File, Some(path)) => Backing::File(resolve(path)),
                (RegionBackend::Dax, Some(path)) => Backing::Dax(resolve(path)),
                (RegionBackend::File | RegionBackend::Dax, None) => {
                    unreachable!("Config::validate requires a path for file and dax regions")
                }
            };
            regions.push(Region::open(&config.name, backing, config.size.0)?);
        }
        Ok(RegionTable { regions })
    }

    /// Adds a region at the next id.
    pub fn push(&mut self, region: Region) {
        self.regions.push(region);
    }

    /// The region with id `id`.
    pub fn get(&self, id: u16) -> Option<&Region> {
        self.regions.get(usize::from(id))
    }

    /// Every region with its id.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u16, &Region)> + Clone {
        // Config::validate bounds the count by MAX_REGIONS, which fits u16.
        self.regions.iter().enumerate().map(|(id, region)| (id as u16, region))
    }
}

impl AddressSpaces for RegionTable {
    fn memory(&self, space: u16) -> Option<SharedMemory<'_>> {
        self.get(space).map(Region::memory)
    }
}

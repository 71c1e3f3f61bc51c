//! The extension handlers this target can serve, by name, and the registry its configuration
//! enables (`extensions = ["reduce", "vmax"]`). Adding an extension: write its handler (see
//! `netdam_isa::extension` and `docs/EXTENDING.md`) and list it in [`CATALOG`].

use netdam_isa::extension::reduce::Reduce;
use netdam_isa::extension::vmax::Vmax;
use netdam_isa::extension::{ExtensionHandler, ExtensionRegistry, Permissions};

use crate::config::ConfigError;

/// A handler the configuration may enable: its name and how to make it.
pub struct CatalogEntry {
    /// The name configuration uses (the handler's declared name).
    pub name: &'static str,
    /// Makes the handler, once, at start-up.
    pub make: fn() -> Box<dyn ExtensionHandler>,
}

/// Every extension this build can serve.
pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry { name: "reduce", make: || Box::new(Reduce) },
    CatalogEntry { name: "vmax", make: || Box::new(Vmax) },
];

/// The registry of the extensions named in `enabled`; an unknown name, or a handler whose
/// declaration the registry refuses, is a configuration error naming it.
pub fn registry(enabled: &[String]) -> Result<ExtensionRegistry, ConfigError> {
    let mut registry = ExtensionRegistry::new();
    for name in enabled {
        let Some(entry) = CATALOG.iter().find(|entry| entry.name == name) else {
            let known: Vec<&str> = CATALOG.iter().map(|entry| entry.name).collect();
            return Err(ConfigError::Invalid(format!(
                "extensions: no extension is called {name:?}; this build serves {}",
                known.join(", ")
            )));
        };
        registry.register((entry.make)()).map_err(|error| ConfigError::Invalid(format!("extensions: {error}")))?;
    }
    Ok(registry)
}

/// The permission set named by `names` (`read`, `write`, `atomic`, `compute`, `block`).
pub fn permissions(names: &[String]) -> Result<Permissions, ConfigError> {
    names.iter().try_fold(Permissions::NONE, |granted, name| {
        Permissions::from_name(name).map(|permission| granted.union(permission)).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "session_permissions: no permission is called {name:?}; use read, write, atomic, compute, block"
            ))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use netdam_isa::extension::reduce::REDUCE_OPCODE;

    #[test]
    fn enabled_names_are_registered_and_unknown_or_repeated_ones_refused() {
        assert_eq!(registry(&[]).unwrap().specs().count(), 0);
        let enabled = registry(&["reduce".to_string()]).unwrap();
        assert_eq!(enabled.spec(REDUCE_OPCODE).map(|spec| spec.name), Some("reduce"));
        let unknown = registry(&["histogram".to_string()]).unwrap_err().to_string();
        assert!(unknown.contains("\"histogram\"") && unknown.contains("reduce"), "{unknown}");
        let twice = registry(&["reduce".to_string(), "reduce".to_string()]).unwrap_err().to_string();
        assert!(twice.contains("0x80"), "{twice}");
    }

    #[test]
    fn permission_names_combine_and_unknown_ones_are_refused() {
        let granted = permissions(&["read".to_string(), "compute".to_string()]).unwrap();
        assert!(granted.contains(Permissions::READ) && granted.contains(Permissions::COMPUTE));
        assert!(!granted.contains(Permissions::WRITE));
        assert!(permissions(&["root".to_string()]).is_err());
    }
}

//! The broker's small JSON tables under `<data_dir>/config` (users, ACLs,
//! dynamic configs): read whole at start, written whole and atomically on
//! change.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{BrokerError, Result};

/// `path` parsed, or `T::default()` when there is no such file.
pub fn read_or_default<T: DeserializeOwned + Default>(path: &Path) -> Result<T> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| BrokerError::BadFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(BrokerError::Io(path.to_path_buf(), e)),
    }
}

/// Writes `value` to `path` atomically and durably (fsynced), its
/// directory made if missing; `private`: readable by the broker's user
/// only (credentials).
pub fn write<T: Serialize + ?Sized>(path: &Path, value: &T, private: bool) -> Result<()> {
    let data = serde_json::to_vec_pretty(value).map_err(|e| BrokerError::BadFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| BrokerError::Io(dir.to_path_buf(), e))?;
    }
    match private {
        true => rokka_store::checkpoint::write_private_atomically(path, &data)?,
        false => rokka_store::checkpoint::write_atomically(path, &data)?,
    }
    Ok(())
}

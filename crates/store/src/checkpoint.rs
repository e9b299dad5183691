//! The checkpoint file: how far the CommitLog, ConsumeQueues and index are
//! known to be on disk, and whether the store stopped cleanly.
//!
//! Binary, 64 bytes, CRC-32C protected; written to a temp file, fsynced and
//! renamed over the old one, so a crash leaves either the old or the new
//! checkpoint, never a mix. A checkpoint that fails its CRC is reported as
//! damaged and recovery falls back to a full scan.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{Result, StoreError};
use crate::index::IndexMark;

const MAGIC: &[u8; 4] = b"RKCP";
const VERSION: u32 = 1;
const LEN: usize = 64;
const NO_INDEX: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Every CommitLog byte below this offset, and every ConsumeQueue and
    /// index entry for those records, was on disk when this was written.
    pub safe_offset: u64,
    /// Written at a clean shutdown: the end of the CommitLog.
    pub clean: bool,
    /// Offset of the last record (clean shutdown), verified at startup.
    pub last_record_offset: u64,
    /// The index's state at `safe_offset`.
    pub index: Option<IndexMark>,
}

/// What loading found.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    Missing,
    Damaged(String),
    Ok(Checkpoint),
}

impl Checkpoint {
    fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4..8].copy_from_slice(&VERSION.to_be_bytes());
        b[8..16].copy_from_slice(&self.safe_offset.to_be_bytes());
        b[16] = u8::from(self.clean);
        b[24..32].copy_from_slice(&self.last_record_offset.to_be_bytes());
        let (file, count) = self.index.map_or((NO_INDEX, 0), |m| (m.file, m.count));
        b[32..40].copy_from_slice(&file.to_be_bytes());
        b[40..44].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[..LEN - 4]);
        b[LEN - 4..].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> std::result::Result<Checkpoint, String> {
        if b.len() != LEN {
            return Err(format!("{} bytes, expected {LEN}", b.len()));
        }
        if &b[0..4] != MAGIC {
            return Err("bad magic".into());
        }
        let crc = u32::from_be_bytes([b[60], b[61], b[62], b[63]]);
        if crc32c::crc32c(&b[..LEN - 4]) != crc {
            return Err("CRC mismatch".into());
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        let version = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        if version != VERSION {
            return Err(format!("unknown version {version}"));
        }
        let file = u64_at(32);
        Ok(Checkpoint {
            safe_offset: u64_at(8),
            clean: b[16] == 1,
            last_record_offset: u64_at(24),
            index: (file != NO_INDEX).then(|| IndexMark {
                file,
                count: u32::from_be_bytes([b[40], b[41], b[42], b[43]]),
            }),
        })
    }

    pub fn load(path: &Path) -> Result<Loaded> {
        match std::fs::read(path) {
            Ok(b) => Ok(match Checkpoint::decode(&b) {
                Ok(c) => Loaded::Ok(c),
                Err(why) => Loaded::Damaged(why),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Loaded::Missing),
            Err(e) => Err(StoreError::Io {
                op: "read",
                path: path.to_path_buf(),
                source: e,
            }),
        }
    }

    /// Atomically replaces the checkpoint at `path`.
    pub fn store(&self, path: &Path) -> Result<()> {
        write_atomically(path, &self.encode())
    }
}

/// Writes `data` to `path` via a temp file, fsync and rename, then fsyncs the
/// directory, so that `path` holds either its old or its new content.
pub fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let f = File::create(&tmp).map_err(StoreError::io("create", &tmp))?;
    finish_atomically(f, &tmp, path, data)
}

/// [`write_atomically`] for secrets: the file is readable by its owner
/// only (mode 0600 on Unix), from its first byte.
pub fn write_private_atomically(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    // A leftover temp file keeps its mode when opened: start afresh.
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let f = opts.open(&tmp).map_err(StoreError::io("create", &tmp))?;
    finish_atomically(f, &tmp, path, data)
}

fn finish_atomically(f: File, tmp: &Path, path: &Path, data: &[u8]) -> Result<()> {
    finish_atomically_with(f, tmp, path, |f| {
        f.write_all(data).map_err(StoreError::io("write", tmp))
    })
}

/// [`write_atomically`] with the contents written by `fill` (a file too
/// large to hold in memory, written a chunk at a time).
pub fn write_atomically_with(path: &Path, fill: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let f = File::create(&tmp).map_err(StoreError::io("create", &tmp))?;
    finish_atomically_with(f, &tmp, path, fill)
}

fn finish_atomically_with(
    mut f: File,
    tmp: &Path,
    path: &Path,
    fill: impl FnOnce(&mut File) -> Result<()>,
) -> Result<()> {
    let written = crate::fault::check("file-write")
        .map_err(StoreError::io("write", tmp))
        .and_then(|()| fill(&mut f))
        .and_then(|()| f.sync_all().map_err(StoreError::io("fsync", tmp)));
    drop(f);
    if let Err(e) = written {
        // A half-written temp file would keep its blocks: on a full disk,
        // the room the next attempt (or another file) needs.
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    std::fs::rename(tmp, path).map_err(StoreError::io("rename", path))?;
    if let Some(dir) = path.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(StoreError::io("fsync", dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_damage() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tmp", "/tmp"))?;
        let p = dir.path().join("checkpoint");
        assert_eq!(Checkpoint::load(&p)?, Loaded::Missing);
        let c = Checkpoint {
            safe_offset: 12345,
            clean: true,
            last_record_offset: 12000,
            index: Some(IndexMark { file: 7, count: 9 }),
        };
        c.store(&p)?;
        assert_eq!(Checkpoint::load(&p)?, Loaded::Ok(c));
        let mut b = std::fs::read(&p).map_err(StoreError::io("read", &p))?;
        b[9] ^= 1;
        std::fs::write(&p, &b).map_err(StoreError::io("write", &p))?;
        assert!(matches!(Checkpoint::load(&p)?, Loaded::Damaged(_)));
        Ok(())
    }
}

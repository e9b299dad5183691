//! `MappedFile`: a fixed-size file mapped read-write with memmap2.
//!
//! This is the only module of the store that uses `unsafe`. Every stateful file
//! of the store (CommitLog segments, ConsumeQueue files, IndexFiles) is one of
//! these, and they all follow the same discipline:
//!
//! * **One writer.** Only the store's writer (holding the store-wide writer lock)
//!   calls [`MappedFile::write_at`] / [`MappedFile::region_mut`]. Recovery runs
//!   before any reader exists.
//! * **Publish, then read.** A region is handed to readers only after it was
//!   written, through an atomic "published" position stored with `Release` and
//!   loaded with `Acquire` by the reader. A published region is never written
//!   again (append-only), so a `&[u8]` over it never aliases a write.
//! * **Lifetime by `Arc`.** Readers hold an `Arc<MappedFile>` (inside a
//!   [`bytes::Bytes`] owner), so deleting a file during retention only unlinks
//!   it; the mapping lives until the last reader drops it.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use memmap2::{Advice, MmapOptions, MmapRaw};

/// A file of fixed length mapped into memory.
pub struct MappedFile {
    path: PathBuf,
    map: MmapRaw,
    len: usize,
    // No file descriptor is kept: a mapping stays valid after its file is
    // closed, and write-back goes through the mapping (msync). So the number
    // of partitions and files is not the number of open descriptors (the
    // mapping count, vm.max_map_count, is what grows).
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl MappedFile {
    /// Creates (or reuses) `path` with exactly `len` bytes, its blocks
    /// allocated, and maps it. Allocating up front turns a full disk into
    /// an error here (ENOSPC) instead of a SIGBUS when a write through the
    /// mapping reaches a hole the file system cannot fill. A new file's
    /// directory entry is made durable (fsync of the directory).
    pub fn create(path: &Path, len: u64) -> io::Result<MappedFile> {
        crate::fault::check("create")?;
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() != len {
            if let Err(e) = allocate(&file, len) {
                // Leave no half-made file behind for recovery to puzzle over.
                if !existed {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e);
            }
        }
        if !existed {
            if let Some(dir) = path.parent() {
                // A new name not made durable is not left behind: a retry
                // would find the file, take it as existing and never sync
                // its directory entry (records acknowledged in sync mode
                // under a name a power loss may drop).
                if let Err(e) = crate::fault::check("dir-fsync").and_then(|()| File::open(dir)?.sync_all()) {
                    let _ = std::fs::remove_file(path);
                    return Err(e);
                }
            }
        }
        Self::map(path.to_path_buf(), file, len)
    }

    /// Maps an existing file with its current length.
    pub fn open(path: &Path) -> io::Result<MappedFile> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        Self::map(path.to_path_buf(), file, len)
    }

    fn map(path: PathBuf, file: File, len: u64) -> io::Result<MappedFile> {
        let len_usize =
            usize::try_from(len).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        if len_usize == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is empty", path.display()),
            ));
        }
        let map = MmapOptions::new().len(len_usize).map_raw(&file)?;
        Ok(MappedFile {
            path,
            map,
            len: len_usize,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, pos: usize, len: usize) {
        assert!(
            pos.checked_add(len).is_some_and(|end| end <= self.len),
            "mapped access {pos}+{len} past the end of {} ({} bytes)",
            self.path.display(),
            self.len
        );
    }

    /// Copies `data` into the file at `pos`.
    ///
    /// Only the writer calls this, on a region no reader has been given yet.
    pub fn write_at(&self, pos: usize, data: &[u8]) {
        self.check(pos, data.len());
        // SAFETY: bounds checked above; the region is unpublished (module docs),
        // so no shared reference to it exists while we write.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.as_mut_ptr().add(pos), data.len());
        }
    }

    /// Runs `f` over a mutable view of `[pos, pos + len)`.
    ///
    /// Only the writer calls this, on an unpublished region (module docs).
    pub fn with_region_mut<R>(&self, pos: usize, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        self.check(pos, len);
        // SAFETY: bounds checked; the region is unpublished and only the single
        // writer touches it, so this is the only reference to these bytes.
        let region = unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(pos), len) };
        f(region)
    }

    /// Copies `[pos, pos + out.len())` into `out`.
    ///
    /// Sound for any region: the copy goes through raw pointers, so it never
    /// asserts immutability of bytes the writer may be changing. Callers use it
    /// on published regions (or in recovery, before any writer runs).
    pub fn read_into(&self, pos: usize, out: &mut [u8]) {
        self.check(pos, out.len());
        // SAFETY: bounds checked; a raw copy creates no reference into the map.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(pos), out.as_mut_ptr(), out.len());
        }
    }

    /// Reads a big-endian u64 at `pos`.
    pub fn read_u64(&self, pos: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read_into(pos, &mut b);
        u64::from_be_bytes(b)
    }

    /// Reads a big-endian u32 at `pos`.
    pub fn read_u32(&self, pos: usize) -> u32 {
        let mut b = [0u8; 4];
        self.read_into(pos, &mut b);
        u32::from_be_bytes(b)
    }

    /// A zero-copy view of a published region, kept alive by `self`.
    pub fn view(self: &Arc<Self>, pos: usize, len: usize) -> Bytes {
        self.check(pos, len);
        Bytes::from_owner(MappedView {
            file: Arc::clone(self),
            pos,
            len,
        })
    }

    /// Writes `[pos, pos + len)` back to disk and waits for it (msync MS_SYNC,
    /// which on Linux is an fdatasync of that range).
    pub fn flush_range(&self, pos: usize, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.check(pos, len);
        self.map.flush_range(pos, len)
    }

    /// Writes `[pos, pos + len)` back like [`MappedFile::flush_range`] but
    /// through a mapping of its own over a new descriptor of the file. Linux
    /// reports a write-back error once per open file (the first fsync or
    /// msync after it takes it), whatever range failed: a write-back that is
    /// not the store's acknowledgement (the allocator writing back the window
    /// ahead of the writer) must not take an error from the file's main
    /// mapping, whose next msync is what tells producers their data is on
    /// disk. A descriptor opened now reports only errors from now on, to this
    /// call.
    pub fn flush_range_apart(&self, pos: usize, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if pos.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("flush {pos}+{len} past the end of {}", self.path.display()),
            ));
        }
        let file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        // (memmap2 maps from the page holding `pos` and syncs from there.)
        let map = MmapOptions::new().offset(pos as u64).len(len).map_raw(&file)?;
        map.flush()
    }

    /// Populates the page tables of `[pos, pos + len)` without changing its
    /// bytes — for writing (MADV_POPULATE_WRITE, which dirties the pages) or
    /// for reading (MADV_POPULATE_READ, pages stay clean) — so the writer
    /// never takes the slow first-touch fault there. Safe to run while the
    /// writer appends to the file.
    pub fn prefault_range(&self, pos: usize, len: usize, for_write: bool) -> io::Result<()> {
        // An error, not the accessors' assertion: this runs on the
        // allocator's thread, where a panic would leave the writer waiting.
        if pos.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "prefault {pos}+{len} past the end of {} ({} bytes)",
                    self.path.display(),
                    self.len
                ),
            ));
        }
        let advice = if for_write {
            Advice::PopulateWrite
        } else {
            Advice::PopulateRead
        };
        self.map.advise_range(advice, pos, len)
    }
}

/// Gives `file` exactly `len` bytes with every block allocated
/// (`fallocate`); where the file system cannot allocate ahead (EOPNOTSUPP),
/// a plain size change.
fn allocate(file: &File, len: u64) -> io::Result<()> {
    let cur = file.metadata()?.len();
    if len > cur {
        match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), cur, len - cur) {
            Ok(()) => return Ok(()),
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {}
            Err(e) => return Err(e.into()),
        }
    }
    file.set_len(len)
}

/// Owner of a [`Bytes`] view into a mapped file.
struct MappedView {
    file: Arc<MappedFile>,
    pos: usize,
    len: usize,
}

impl AsRef<[u8]> for MappedView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `view` checked the bounds, and the region was published before
        // the view was made and is never written again (module docs), so a shared
        // slice over it aliases no write. The Arc keeps the mapping alive.
        unsafe { std::slice::from_raw_parts(self.file.map.as_ptr().add(self.pos), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_view_flush() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("f");
        let f = Arc::new(MappedFile::create(&path, 8192)?);
        f.write_at(100, b"hello");
        let v = f.view(100, 5);
        assert_eq!(&v[..], b"hello");
        f.flush_range(0, 8192)?;
        f.prefault_range(0, 8192, false)?;
        f.prefault_range(4096, 4096, true)?;
        assert!(f.prefault_range(4096, 8192, false).is_err());
        drop(f);
        let g = MappedFile::open(&path)?;
        let mut out = [0u8; 5];
        g.read_into(100, &mut out);
        assert_eq!(&out, b"hello");
        assert_eq!(g.len(), 8192);
        Ok(())
    }

    #[test]
    fn a_range_is_written_back_through_a_mapping_of_its_own() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("f");
        let f = MappedFile::create(&path, 3 * 4096)?;
        f.write_at(5000, b"apart");
        // An unaligned start is widened to its page.
        f.flush_range_apart(5000, 5)?;
        f.flush_range_apart(0, 3 * 4096)?;
        f.flush_range_apart(100, 0)?;
        assert!(f.flush_range_apart(3 * 4096 - 1, 2).is_err());
        assert!(f.flush_range_apart(usize::MAX, 2).is_err());
        let mut out = [0u8; 5];
        std::fs::File::open(&path).and_then(|mut r| {
            use std::io::{Read, Seek};
            r.seek(io::SeekFrom::Start(5000))?;
            r.read_exact(&mut out)
        })?;
        assert_eq!(&out, b"apart");
        std::fs::remove_file(&path)?;
        // Reopening a removed file fails: reported, never a panic.
        assert_eq!(
            f.flush_range_apart(0, 4096).err().map(|e| e.kind()),
            Some(io::ErrorKind::NotFound)
        );
        Ok(())
    }
}

//! IndexFile: a hash index from `topic#key` and `topic#UNIQ_KEY` to CommitLog
//! offsets with time-range queries, in RocketMQ's layout
//! (`shared/protocols/rocketmq-store.md` §4):
//!
//! ```text
//! header  40 B: beginTs i64, endTs i64, beginPhys i64, endPhys i64, slotsUsed i32, indexCount i32
//! slots   slots × 4 B: number of the newest entry in the slot (0 = empty)
//! entries entries × 20 B: keyHash i32, phys i64, timeDiff i32 (s since beginTs), prev i32
//! ```
//! Files are named by the CommitLog offset of their first entry. Entry 0 is
//! never used so that 0 means "none"; a full file is flushed and a new one
//! started. Hash collisions are possible, so callers check candidates' keys.
//!
//! Concurrency: an [`IndexService`] lives behind a mutex; the store's writer
//! inserts, queries read, both under that mutex.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Result, StoreError};
use crate::mapped::MappedFile;
use crate::record::properties::java_hash_extend;
use crate::{file_name, parse_file_name};

const HEADER: usize = 40;
const ENTRY: usize = 20;
/// Most candidates one query returns.
pub const MAX_QUERY_RESULTS: usize = 64;

#[derive(Debug, Clone, Copy, Default)]
struct Header {
    begin_ts: i64,
    end_ts: i64,
    begin_phys: u64,
    end_phys: u64,
    slots_used: u32,
    count: u32,
}

struct IndexFile {
    name: u64,
    file: Arc<MappedFile>,
    slots: u32,
    entries: u32,
    h: Header,
}

/// Hash of `topic#key` as Java's `abs(("topic#key").hashCode())`.
pub fn key_hash(topic: &str, key: &[u8]) -> u32 {
    let h = java_hash_extend(java_hash_extend(java_hash_extend(0, topic.as_bytes()), b"#"), key);
    if h == i32::MIN {
        0
    } else {
        h.unsigned_abs()
    }
}

impl IndexFile {
    fn size(slots: u32, entries: u32) -> u64 {
        HEADER as u64 + u64::from(slots) * 4 + u64::from(entries) * ENTRY as u64
    }

    fn create(dir: &Path, name: u64, slots: u32, entries: u32) -> Result<IndexFile> {
        let path = dir.join(file_name(name));
        let file = MappedFile::create(&path, Self::size(slots, entries)).map_err(StoreError::io("create", &path))?;
        let mut f = IndexFile {
            name,
            file: Arc::new(file),
            slots,
            entries,
            h: Header {
                count: 1,
                ..Header::default()
            },
        };
        f.write_header();
        Ok(f)
    }

    /// Whether the file's header is all zero bytes (never written).
    fn header_blank(path: &Path) -> Result<bool> {
        use std::io::Read;
        let mut b = [0u8; HEADER];
        let mut f = std::fs::File::open(path).map_err(StoreError::io("open", path))?;
        match f.read_exact(&mut b) {
            Ok(()) => Ok(b.iter().all(|x| *x == 0)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(true),
            Err(e) => Err(StoreError::Io {
                op: "read",
                path: path.to_path_buf(),
                source: e,
            }),
        }
    }

    fn open(path: &Path, name: u64, slots: u32, entries: u32) -> Result<IndexFile> {
        let file = MappedFile::open(path).map_err(StoreError::io("map", path))?;
        if file.len() as u64 != Self::size(slots, entries) {
            return Err(StoreError::bad_file(
                path,
                format!(
                    "IndexFile has {} bytes, expected {} for index_slots={slots} index_entries={entries}",
                    file.len(),
                    Self::size(slots, entries)
                ),
            ));
        }
        let h = Header {
            begin_ts: file.read_u64(0) as i64,
            end_ts: file.read_u64(8) as i64,
            begin_phys: file.read_u64(16),
            end_phys: file.read_u64(24),
            slots_used: file.read_u32(32),
            count: file.read_u32(36),
        };
        if h.count == 0 || h.count > entries {
            return Err(StoreError::bad_file(
                path,
                format!("IndexFile header count {} out of range", h.count),
            ));
        }
        Ok(IndexFile {
            name,
            file: Arc::new(file),
            slots,
            entries,
            h,
        })
    }

    fn write_header(&mut self) {
        let mut b = [0u8; HEADER];
        b[0..8].copy_from_slice(&self.h.begin_ts.to_be_bytes());
        b[8..16].copy_from_slice(&self.h.end_ts.to_be_bytes());
        b[16..24].copy_from_slice(&self.h.begin_phys.to_be_bytes());
        b[24..32].copy_from_slice(&self.h.end_phys.to_be_bytes());
        b[32..36].copy_from_slice(&self.h.slots_used.to_be_bytes());
        b[36..40].copy_from_slice(&self.h.count.to_be_bytes());
        self.file.write_at(0, &b);
    }

    fn is_full(&self) -> bool {
        self.h.count >= self.entries
    }

    fn slot_pos(&self, hash: u32) -> usize {
        HEADER + (hash % self.slots) as usize * 4
    }

    fn entry_pos(&self, n: u32) -> usize {
        HEADER + self.slots as usize * 4 + n as usize * ENTRY
    }

    fn read_entry(&self, n: u32) -> (u32, u64, i32, u32) {
        let mut b = [0u8; ENTRY];
        self.file.read_into(self.entry_pos(n), &mut b);
        let mut p = [0u8; 8];
        p.copy_from_slice(&b[4..12]);
        (
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            u64::from_be_bytes(p),
            i32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            u32::from_be_bytes([b[16], b[17], b[18], b[19]]),
        )
    }

    fn put(&mut self, hash: u32, phys: u64, store_ts: i64) {
        let n = self.h.count;
        if n == 1 {
            self.h.begin_ts = store_ts;
            self.h.begin_phys = phys;
        }
        let slot_pos = self.slot_pos(hash);
        let prev = self.file.read_u32(slot_pos);
        let prev = if prev >= n { 0 } else { prev };
        let diff = ((store_ts - self.h.begin_ts) / 1000).clamp(0, i64::from(i32::MAX)) as i32;
        let mut b = [0u8; ENTRY];
        b[0..4].copy_from_slice(&hash.to_be_bytes());
        b[4..12].copy_from_slice(&phys.to_be_bytes());
        b[12..16].copy_from_slice(&diff.to_be_bytes());
        b[16..20].copy_from_slice(&prev.to_be_bytes());
        self.file.write_at(self.entry_pos(n), &b);
        self.file.write_at(slot_pos, &n.to_be_bytes());
        if prev == 0 {
            self.h.slots_used += 1;
        }
        self.h.count = n + 1;
        self.h.end_phys = phys;
        self.h.end_ts = store_ts;
        self.write_header();
    }

    /// Rebuilds slots and header from the first `count` entries, whose contents
    /// (including their `prev` links) were durable (recovery).
    fn restore(&mut self, count: u32) {
        let count = count.clamp(1, self.entries);
        let slots_len = self.slots as usize * 4;
        self.file.write_at(HEADER, &vec![0u8; slots_len]);
        let mut h = Header {
            count,
            begin_ts: self.h.begin_ts,
            ..Header::default()
        };
        for n in 1..count {
            let (hash, phys, diff, _) = self.read_entry(n);
            let pos = self.slot_pos(hash);
            if self.file.read_u32(pos) == 0 {
                h.slots_used += 1;
            }
            self.file.write_at(pos, &n.to_be_bytes());
            if n == 1 {
                h.begin_phys = phys;
            }
            h.end_phys = phys;
            h.end_ts = h.begin_ts + i64::from(diff) * 1000;
        }
        if count == 1 {
            h.begin_ts = 0;
        }
        self.h = h;
        // Bytes past `count` may be torn; clear them so nothing stale remains.
        let from = self.entry_pos(count);
        let to = self.entry_pos(self.entries);
        self.file.write_at(from, &vec![0u8; to - from]);
        self.write_header();
    }

    fn flush(&self) -> Result<()> {
        self.file
            .flush_range(0, self.file.len())
            .map_err(StoreError::io("flush", self.file.path()))
    }
}

/// The set of IndexFiles: the newest takes inserts.
pub struct IndexService {
    dir: PathBuf,
    slots: u32,
    entries: u32,
    files: Vec<IndexFile>,
    /// Set by a cut of the CommitLog (a replica truncating its log): records
    /// from here on are indexed although the index has seen offsets past
    /// them (the records there before the cut, whose entries stay: a query
    /// checks what it finds).
    accept_from: Option<u64>,
    /// A full file's write-back that failed: final, as the CommitLog's
    /// (Linux reports the error once, so flushing it again would pass);
    /// the next checkpoint fails the store with it.
    write_back_failed: Option<String>,
    /// Most KEYS tokens of one message indexed
    /// (`store.index_max_keys_per_message`).
    max_keys: usize,
}

/// Where the index stood at a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexMark {
    /// Name of the newest file (CommitLog offset of its first entry).
    pub file: u64,
    /// Its entry count (header `indexCount`).
    pub count: u32,
}

impl IndexService {
    /// Loads every index file in `dir`, checking names and sizes.
    pub fn load(dir: &Path, slots: u32, entries: u32) -> Result<IndexService> {
        std::fs::create_dir_all(dir).map_err(StoreError::io("create dir", dir))?;
        let mut names = Vec::new();
        for item in std::fs::read_dir(dir).map_err(StoreError::io("read dir", dir))? {
            let item = item.map_err(StoreError::io("read dir", dir))?;
            let path = item.path();
            let name = parse_file_name(&item.file_name())
                .ok_or_else(|| StoreError::bad_file(&path, "not an IndexFile name (20 digits)"))?;
            names.push((name, path));
        }
        names.sort();
        let mut files = Vec::new();
        let last = names.len().saturating_sub(1);
        for (i, (name, path)) in names.into_iter().enumerate() {
            // The newest file with a header never written (a crash between
            // its creation and its first header write): it holds nothing and
            // no checkpoint can name it (a checkpoint flushes the header
            // first). Removed; the next key makes it again.
            if i == last && IndexFile::header_blank(&path)? {
                tracing::warn!(path = %path.display(), "removing an IndexFile created just before a crash");
                std::fs::remove_file(&path).map_err(StoreError::io("remove", &path))?;
                continue;
            }
            files.push(IndexFile::open(&path, name, slots, entries)?);
        }
        Ok(IndexService {
            dir: dir.to_path_buf(),
            slots,
            entries,
            files,
            accept_from: None,
            write_back_failed: None,
            max_keys: usize::MAX,
        })
    }

    /// At most `n` KEYS tokens of one message are indexed.
    pub fn with_max_keys(mut self, n: u32) -> IndexService {
        self.max_keys = n.max(1) as usize;
        self
    }

    /// Most KEYS tokens of one message indexed.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The CommitLog was cut at `phys`: what is written there from now on
    /// is indexed again.
    pub fn cut_at(&mut self, phys: u64) {
        self.accept_from = Some(self.accept_from.map_or(phys, |a| a.min(phys)));
    }

    /// The checkpoint mark of the current state.
    pub fn mark(&self) -> Option<IndexMark> {
        self.files.last().map(|f| IndexMark {
            file: f.name,
            count: f.h.count,
        })
    }

    /// Offset below which every record is indexed (idempotent re-dispatch).
    pub fn end_phys(&self) -> Option<u64> {
        self.files.last().filter(|f| f.h.count > 1).map(|f| f.h.end_phys)
    }

    /// After an unclean stop: go back to the state recorded at the checkpoint
    /// (`None` = nothing was indexed then, or no usable checkpoint).
    pub fn restore(&mut self, mark: Option<IndexMark>) -> Result<()> {
        let keep_upto = mark.map(|m| m.file);
        while let Some(last) = self.files.last() {
            if keep_upto.is_some_and(|k| last.name <= k) {
                break;
            }
            let path = last.file.path().to_path_buf();
            self.files.pop();
            std::fs::remove_file(&path).map_err(StoreError::io("remove", &path))?;
        }
        if let (Some(m), Some(last)) = (mark, self.files.last_mut()) {
            if last.name == m.file {
                last.restore(m.count);
                last.flush()?;
            }
        }
        Ok(())
    }

    /// Indexes `key` of `topic` for the record at `phys`.
    pub fn put(&mut self, topic: &str, key: &[u8], phys: u64, store_ts: i64) -> Result<()> {
        if let Some(end) = self.end_phys() {
            if phys < end && self.accept_from.is_none_or(|from| phys < from) {
                return Ok(());
            }
        }
        let need_new = self.files.last().is_none_or(|f| f.is_full());
        if need_new {
            if let Some(why) = &self.write_back_failed {
                return Err(StoreError::StorageFailed(why.clone()));
            }
            let f = crate::offload(|| {
                if let Some(last) = self.files.last() {
                    if let Err(e) = crate::fault::check("index-msync")
                        .map_err(StoreError::io("flush", last.file.path()))
                        .and_then(|()| last.flush())
                    {
                        return Err((true, e));
                    }
                }
                IndexFile::create(&self.dir, phys, self.slots, self.entries).map_err(|e| (false, e))
            });
            let f = match f {
                Ok(f) => f,
                Err((write_back, e)) => {
                    if write_back {
                        self.write_back_failed = Some(format!("IndexFile write-back: {e}"));
                    }
                    return Err(e);
                }
            };
            self.files.push(f);
        }
        if let Some(f) = self.files.last_mut() {
            f.put(key_hash(topic, key), phys, store_ts);
        }
        Ok(())
    }

    /// CommitLog offsets of records that may have `key` in `topic`, stored in
    /// `[begin_ts, end_ts]`, newest first, at most `max`.
    pub fn query(&self, topic: &str, key: &[u8], max: usize, begin_ts: i64, end_ts: i64) -> Vec<u64> {
        let max = max.min(MAX_QUERY_RESULTS);
        let hash = key_hash(topic, key);
        let mut out = Vec::new();
        for f in self.files.iter().rev() {
            if out.len() >= max {
                break;
            }
            if f.h.count <= 1 || f.h.end_ts < begin_ts || f.h.begin_ts > end_ts {
                continue;
            }
            let mut n = f.file.read_u32(f.slot_pos(hash));
            while n > 0 && n < f.h.count && out.len() < max {
                let (h, phys, diff, prev) = f.read_entry(n);
                let ts = f.h.begin_ts + i64::from(diff) * 1000;
                // timeDiff is in whole seconds: widen the window by one second.
                if h == hash && ts + 1000 > begin_ts && ts <= end_ts {
                    out.push(phys);
                }
                if ts + 1000 <= begin_ts || prev >= n {
                    break;
                }
                n = prev;
            }
        }
        out
    }

    /// Flushes the newest file (older ones were flushed when they filled).
    pub fn flush(&self) -> Result<()> {
        if let Some(last) = self.files.last() {
            last.flush()?;
        }
        Ok(())
    }

    /// Why a full file's write-back failed, if one did (final).
    pub(crate) fn write_back_failure(&self) -> Option<&str> {
        self.write_back_failed.as_deref()
    }

    /// The newest file, to flush without holding the index lock.
    pub(crate) fn active_file(&self) -> Option<Arc<MappedFile>> {
        self.files.last().map(|f| Arc::clone(&f.file))
    }

    /// Deletes files whose every entry is below `commitlog_min` (never the newest).
    pub fn delete_below(&mut self, commitlog_min: u64) -> Result<()> {
        while self.files.len() > 1 && self.files[0].h.end_phys < commitlog_min {
            let f = self.files.remove(0);
            std::fs::remove_file(f.file.path()).map_err(StoreError::io("remove", f.file.path()))?;
        }
        Ok(())
    }

    /// Number of index files.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_query_roll_and_restore() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tmp", "/tmp"))?;
        let mut idx = IndexService::load(dir.path(), 7, 5)?;
        // 5 entries per file, entry 0 unused: 4 keys per file.
        for i in 0..10u64 {
            idx.put(
                "t",
                format!("k{}", i % 3).as_bytes(),
                i * 100,
                1_000_000 + i as i64 * 1000,
            )?;
        }
        assert_eq!(idx.file_count(), 3);
        let mut got = idx.query("t", b"k1", 64, 0, i64::MAX);
        got.sort();
        assert_eq!(got, vec![100, 400, 700]);
        assert!(idx.query("t", b"nope", 64, 0, i64::MAX).is_empty());
        assert!(idx.query("other", b"k1", 64, 0, i64::MAX).is_empty());
        // Time window: keys k1 at ts 1_001_000, 1_004_000, 1_007_000.
        let mut w = idx.query("t", b"k1", 64, 1_003_500, 1_005_000);
        w.sort();
        assert_eq!(w, vec![400]);
        // Re-inserting an older record is ignored.
        idx.put("t", b"k1", 50, 1_000_000)?;
        assert_eq!(idx.query("t", b"k1", 64, 0, i64::MAX).len(), 3);
        let mark = idx.mark();
        // Unclean restart at the mark after more writes: the extra entries vanish.
        idx.put("t", b"late", 2000, 1_020_000)?;
        idx.flush()?;
        drop(idx);
        let mut idx = IndexService::load(dir.path(), 7, 5)?;
        idx.restore(mark)?;
        assert!(idx.query("t", b"late", 64, 0, i64::MAX).is_empty());
        let mut got = idx.query("t", b"k1", 64, 0, i64::MAX);
        got.sort();
        assert_eq!(got, vec![100, 400, 700]);
        idx.delete_below(500)?;
        assert_eq!(idx.file_count(), 2);
        Ok(())
    }
}

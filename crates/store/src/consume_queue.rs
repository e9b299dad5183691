//! `ConsumeQueue`: the per-(topic, queue) index of the CommitLog.
//!
//! Each entry is 48 bytes and describes one CommitLog entry that covers `count`
//! consecutive logical offsets starting at `base` (1 for a RocketMQ message, N
//! for a Kafka batch), in the spirit of RocketMQ 5's BatchConsumeQueue:
//!
//! ```text
//! 0  phys offset  u64     24 tag code     i64
//! 8  size         u32     32 store time   i64
//! 12 count        u32     40 msg time     i64 (running max: born / create time)
//! 16 base offset  u64
//! ```
//!
//! Files hold `entries_per_file` entries and are named by the index of their
//! first entry (20 digits). Logical offsets are contiguous from the queue's
//! first offset; offset → entry is a binary search on `base` (O(log n)).
//!
//! Concurrency: the store's writer (under the store-wide writer lock) is the
//! only caller of `append`, `truncate_*` and `delete_files_below`; readers call
//! the lookups from any thread. Readers see only entries below `entries`,
//! which the writer stores with `Release` after writing them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::compacted::CleanLog;
use crate::error::{Result, StoreError};
use crate::mapped::MappedFile;
use crate::{file_name, parse_file_name};

/// Size of one entry.
pub const ENTRY_SIZE: usize = 48;

/// One ConsumeQueue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    pub phys_offset: u64,
    pub size: u32,
    pub count: u32,
    pub base_offset: u64,
    pub tag_code: i64,
    pub store_timestamp: i64,
    pub msg_timestamp: i64,
}

impl CqEntry {
    pub(crate) fn encode(&self) -> [u8; ENTRY_SIZE] {
        let mut b = [0u8; ENTRY_SIZE];
        b[0..8].copy_from_slice(&self.phys_offset.to_be_bytes());
        b[8..12].copy_from_slice(&self.size.to_be_bytes());
        b[12..16].copy_from_slice(&self.count.to_be_bytes());
        b[16..24].copy_from_slice(&self.base_offset.to_be_bytes());
        b[24..32].copy_from_slice(&self.tag_code.to_be_bytes());
        b[32..40].copy_from_slice(&self.store_timestamp.to_be_bytes());
        b[40..48].copy_from_slice(&self.msg_timestamp.to_be_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; ENTRY_SIZE]) -> CqEntry {
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        CqEntry {
            phys_offset: u64_at(0),
            size: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            count: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            base_offset: u64_at(16),
            tag_code: u64_at(24) as i64,
            store_timestamp: u64_at(32) as i64,
            msg_timestamp: u64_at(40) as i64,
        }
    }

    /// The offset after this entry.
    pub fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.count)
    }

    /// Whether `next` may follow `self` in one queue.
    fn precedes(&self, next: &CqEntry) -> bool {
        next.size > 0
            && next.count > 0
            && next.base_offset == self.end_offset()
            && next.phys_offset >= self.phys_offset + u64::from(self.size)
    }
}

struct Files {
    /// Entry index of `list[0]`'s first entry.
    base_entry: u64,
    list: Vec<Arc<MappedFile>>,
}

/// The ConsumeQueue of one (topic, queue).
pub struct ConsumeQueue {
    topic: Arc<str>,
    queue_id: u32,
    dir: PathBuf,
    entries_per_file: u64,
    files: RwLock<Files>,
    /// Entries written (index of the next entry).
    entries: AtomicU64,
    /// First entry still backed by the CommitLog.
    min_entry: AtomicU64,
    /// Next logical offset (= Kafka log end offset).
    max_offset: AtomicU64,
    /// First readable logical offset (= Kafka log start offset).
    min_offset: AtomicU64,
    /// Entries known to be on disk.
    flushed_entries: AtomicU64,
    /// Running max of message timestamps (writer only).
    last_msg_ts: AtomicI64,
    /// Serialises file creation (done ahead, outside the store's writer
    /// lock, by appenders; under it only when a file was not ready).
    creating: std::sync::Mutex<()>,
    /// A compacted queue's clean log: offsets below its end are read there.
    clean: RwLock<Option<Arc<CleanLog>>>,
}

impl std::fmt::Debug for ConsumeQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumeQueue")
            .field("topic", &self.topic)
            .field("queue_id", &self.queue_id)
            .field("min_offset", &self.min_offset())
            .field("max_offset", &self.max_offset())
            .finish()
    }
}

impl ConsumeQueue {
    /// A new, empty queue (its directory is created on first append).
    pub fn new(root: &Path, topic: Arc<str>, queue_id: u32, entries_per_file: u32) -> ConsumeQueue {
        ConsumeQueue {
            dir: root.join(&*topic).join(queue_id.to_string()),
            topic,
            queue_id,
            entries_per_file: u64::from(entries_per_file),
            files: RwLock::new(Files {
                base_entry: 0,
                list: Vec::new(),
            }),
            entries: AtomicU64::new(0),
            min_entry: AtomicU64::new(0),
            max_offset: AtomicU64::new(0),
            min_offset: AtomicU64::new(0),
            flushed_entries: AtomicU64::new(0),
            last_msg_ts: AtomicI64::new(i64::MIN),
            creating: std::sync::Mutex::new(()),
            clean: RwLock::new(None),
        }
    }

    /// Loads a queue from its directory: checks file names and sizes, then
    /// finds the last valid entry (a zero or inconsistent entry ends the queue).
    pub fn load(root: &Path, topic: Arc<str>, queue_id: u32, entries_per_file: u32) -> Result<ConsumeQueue> {
        let cq = ConsumeQueue::new(root, topic, queue_id, entries_per_file);
        let epf = cq.entries_per_file;
        let file_len = epf * ENTRY_SIZE as u64;
        let mut names = Vec::new();
        for item in std::fs::read_dir(&cq.dir).map_err(StoreError::io("read dir", &cq.dir))? {
            let item = item.map_err(StoreError::io("read dir", &cq.dir))?;
            let path = item.path();
            let idx = parse_file_name(&item.file_name())
                .ok_or_else(|| StoreError::bad_file(&path, "not a ConsumeQueue file name (20 digits)"))?;
            let len = item.metadata().map_err(StoreError::io("stat", &path))?.len();
            names.push((idx, path, len));
        }
        names.sort();
        // Every file (but an empty newest) of one other length, a whole
        // number of entries: written with another
        // `consume_queue_entries_per_file` — a config change, refused (not
        // damage, to set aside and rebuild every queue over).
        let written: Vec<&(u64, PathBuf, u64)> = names.iter().filter(|(_, _, l)| *l > 0).collect();
        if let Some((_, path, len)) = written.first() {
            if written.iter().all(|(_, _, l)| l == len) && *len != file_len && *len % ENTRY_SIZE as u64 == 0 {
                return Err(StoreError::Config(format!(
                    "{}: ConsumeQueue files of {} entries, but consume_queue_entries_per_file is {epf}: set it back",
                    path.display(),
                    len / ENTRY_SIZE as u64
                )));
            }
        }
        if let Some((_, path, _)) = names.iter().find(|(idx, _, _)| idx % epf != 0) {
            return Err(StoreError::bad_file(
                path,
                "ConsumeQueue file name is not a multiple of entries per file",
            ));
        }
        // The newest file empty: its creation was cut short by a crash
        // (created, killed before its blocks were allocated). It holds no
        // entry; removed, the queue makes it again (as the CommitLog does).
        if names.last().is_some_and(|(_, _, len)| *len == 0) {
            if let Some((_, path, _)) = names.pop() {
                tracing::warn!(path = %path.display(), "removing an empty ConsumeQueue file created just before a crash");
                std::fs::remove_file(&path).map_err(StoreError::io("remove", &path))?;
            }
        }
        for (_, path, len) in &names {
            if *len != file_len {
                return Err(StoreError::bad_file(
                    path,
                    format!("ConsumeQueue file has {len} bytes, expected {file_len} (consume_queue_entries_per_file changed?)"),
                ));
            }
        }
        let names: Vec<(u64, PathBuf)> = names.into_iter().map(|(i, p, _)| (i, p)).collect();
        for w in names.windows(2) {
            if w[1].0 != w[0].0 + epf {
                return Err(StoreError::bad_file(&w[1].1, "gap in ConsumeQueue files"));
            }
        }
        let Some(first) = names.first() else {
            return Ok(cq);
        };
        let base_entry = first.0;
        let mut list = Vec::with_capacity(names.len());
        for (_, path) in &names {
            list.push(Arc::new(MappedFile::open(path).map_err(StoreError::io("map", path))?));
        }
        // Files made ahead (`prepare`) and never written: the queue ends
        // before them, in the previous file, which need not be full.
        while list.len() > 1 && list.last().is_some_and(|f| read_entry(f, 0).size == 0) {
            if let Some(f) = list.pop() {
                std::fs::remove_file(f.path()).map_err(StoreError::io("remove", f.path()))?;
            }
        }
        // Power lost just after the queue moved into its next file, the
        // write-back having reached that file's first page but not this
        // one's last entries: the queue ends in this file (the entries
        // after the hole come back from the CommitLog with the recovery
        // scan, which starts below them).
        while list.len() > 1 && read_entry(&list[list.len() - 2], epf - 1).size == 0 {
            if let Some(f) = list.pop() {
                tracing::warn!(path = %f.path().display(), "ConsumeQueue file after a hole removed: its entries are dispatched again");
                std::fs::remove_file(f.path()).map_err(StoreError::io("remove", f.path()))?;
            }
        }
        // Count valid entries: every file but the last is full (files are
        // only written in order); scan the last.
        let last_base = base_entry + (list.len() as u64 - 1) * epf;
        let last = &list[list.len() - 1];
        let mut prev: Option<CqEntry> = if list.len() > 1 {
            Some(read_entry(&list[list.len() - 2], epf - 1))
        } else {
            None
        };
        let mut n = 0;
        while n < epf {
            let e = read_entry(last, n);
            let ok = match &prev {
                Some(p) => p.precedes(&e),
                None => e.size > 0 && e.count > 0,
            };
            if !ok {
                break;
            }
            prev = Some(e);
            n += 1;
        }
        let entries = last_base + n;
        {
            let mut f = cq.files.write().unwrap_or_else(|p| p.into_inner());
            f.base_entry = base_entry;
            f.list = list;
        }
        cq.entries.store(entries, Ordering::Release);
        cq.min_entry.store(base_entry, Ordering::Release);
        cq.flushed_entries.store(entries, Ordering::Release);
        if entries > base_entry {
            if let Some(first) = cq.entry(base_entry) {
                cq.min_offset.store(first.base_offset, Ordering::Release);
            }
            if let Some(p) = prev {
                cq.max_offset.store(p.end_offset(), Ordering::Release);
                cq.last_msg_ts.store(p.msg_timestamp, Ordering::Relaxed);
            }
        }
        Ok(cq)
    }

    pub fn topic(&self) -> &Arc<str> {
        &self.topic
    }

    pub fn queue_id(&self) -> u32 {
        self.queue_id
    }

    /// Next logical offset to be written (log end offset).
    pub fn max_offset(&self) -> u64 {
        self.max_offset.load(Ordering::Acquire)
    }

    /// First readable logical offset (log start offset): a compacted
    /// queue's starts in its clean log.
    pub fn min_offset(&self) -> u64 {
        match &*self.clean.read().unwrap_or_else(|p| p.into_inner()) {
            Some(c) => c.start(),
            None => self.raw_min_offset(),
        }
    }

    /// First offset whose ConsumeQueue entry is live.
    pub(crate) fn raw_min_offset(&self) -> u64 {
        self.min_offset.load(Ordering::Acquire)
    }

    /// Index of the first entry a compaction pass has not yet cleaned.
    pub fn first_dirty(&self) -> Option<u64> {
        let from = self.clean().map_or(0, |c| c.end()).max(self.raw_min_offset());
        self.find(from)
    }

    /// The queue's clean log, if it is compacted and a pass has run.
    pub fn clean(&self) -> Option<Arc<CleanLog>> {
        self.clean.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Switches to a new clean log (a compaction pass, or load).
    pub(crate) fn set_clean(&self, log: Option<Arc<CleanLog>>) {
        *self.clean.write().unwrap_or_else(|p| p.into_inner()) = log;
    }

    /// A queue with no live entry whose offsets continue at `offset` (a
    /// compacted queue whose every record is in its clean log).
    pub(crate) fn continue_at(&self, offset: u64) {
        if self.entries.load(Ordering::Acquire) == self.min_entry.load(Ordering::Acquire) && self.max_offset() < offset
        {
            self.min_offset.store(offset, Ordering::Release);
            self.max_offset.store(offset, Ordering::Release);
        }
    }

    /// An empty queue continues at `offset` and keeps it across a reopen
    /// (a replica whose log restarted at its master's first offset: its
    /// next entry, if any, is at `offset`): one dead entry ending there,
    /// at CommitLog offset 0 — below the restarted log's start, as
    /// retention leaves a queue whose entries all went.
    pub(crate) fn continue_after_restart(&self, offset: u64) -> Result<()> {
        if offset == 0 || self.entries.load(Ordering::Acquire) != 0 {
            return Ok(());
        }
        self.append(CqEntry {
            phys_offset: 0,
            size: 1,
            count: 1,
            base_offset: offset - 1,
            tag_code: 0,
            store_timestamp: 0,
            msg_timestamp: 0,
        })?;
        self.min_entry.store(1, Ordering::Release);
        self.min_offset.store(offset, Ordering::Release);
        Ok(())
    }

    /// Number of entries written.
    pub fn entry_count(&self) -> u64 {
        self.entries.load(Ordering::Acquire)
    }

    fn files(&self) -> std::sync::RwLockReadGuard<'_, Files> {
        self.files.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry at index `idx`, if it is published and not deleted.
    pub fn entry(&self, idx: u64) -> Option<CqEntry> {
        if idx >= self.entries.load(Ordering::Acquire) {
            return None;
        }
        let f = self.files();
        self.entry_in(&f, idx)
    }

    fn entry_in(&self, f: &Files, idx: u64) -> Option<CqEntry> {
        let rel = idx.checked_sub(f.base_entry)?;
        let file = f.list.get((rel / self.entries_per_file) as usize)?;
        Some(read_entry(file, rel % self.entries_per_file))
    }

    /// Binary search over published, live entries: the first index in
    /// `[min_entry, entries)` for which `pred` is false, given `pred` is true
    /// on a prefix.
    fn partition_point(&self, pred: impl Fn(&CqEntry) -> bool) -> u64 {
        let end = self.entries.load(Ordering::Acquire);
        let f = self.files();
        let (mut lo, mut hi) = (self.min_entry.load(Ordering::Acquire).max(f.base_entry), end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.entry_in(&f, mid) {
                Some(e) if pred(&e) => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    /// The end offset counting only entries whose record ends at or below
    /// CommitLog offset `durable` (sync flush: what consumers may see).
    pub fn visible_max(&self, durable: u64) -> u64 {
        let max = self.max_offset();
        let n = self.entries.load(Ordering::Acquire);
        match self.entry(n.saturating_sub(1)) {
            Some(last) if last.phys_offset + u64::from(last.size) <= durable => return max,
            None => return max,
            Some(_) => {}
        }
        let idx = self.partition_point(|e| e.phys_offset + u64::from(e.size) <= durable);
        self.entry(idx)
            .map_or(max, |e| e.base_offset.max(self.raw_min_offset()))
    }

    /// Where the live entries below `offset` end in the CommitLog (the end
    /// of the entry holding `offset - 1`): what must be on disk before a
    /// bound at `offset` is made durable.
    pub fn log_end_below(&self, offset: u64) -> Option<u64> {
        let e = self.entry(self.find(offset.min(self.max_offset()).checked_sub(1)?)?)?;
        Some(e.phys_offset + u64::from(e.size))
    }

    /// Index of the entry that holds logical offset `offset`, if live.
    pub fn find(&self, offset: u64) -> Option<u64> {
        if offset < self.raw_min_offset() || offset >= self.max_offset() {
            return None;
        }
        let idx = self.partition_point(|e| e.base_offset <= offset);
        idx.checked_sub(1)
    }

    /// First offset whose entry lies at or after CommitLog position `phys`
    /// (max offset when none): where a leader epoch that began there begins
    /// in this queue.
    pub fn offset_at_phys(&self, phys: u64) -> u64 {
        let idx = self.partition_point(|e| e.phys_offset < phys);
        self.entry(idx).map_or(self.max_offset(), |e| e.base_offset)
    }

    /// First offset whose store time is ≥ `ts` (max offset when none).
    pub fn offset_by_store_time(&self, ts: i64) -> u64 {
        let idx = self.partition_point(|e| e.store_timestamp < ts);
        self.entry(idx).map_or(self.max_offset(), |e| e.base_offset)
    }

    /// First entry whose message time (running max) is ≥ `ts`: its base offset
    /// and the entry, or `None` when no message is that recent.
    pub fn entry_by_msg_time(&self, ts: i64) -> Option<CqEntry> {
        let idx = self.partition_point(|e| e.msg_timestamp < ts);
        self.entry(idx)
    }

    /// Makes the files the next `n` entries go to exist (writer only): a
    /// batch fails before any of its records exists, not part-way.
    pub fn reserve_n(&self, n: u64) -> Result<()> {
        let idx = self.entries.load(Ordering::Relaxed);
        let mut at = idx;
        while at < idx.saturating_add(n) {
            let present = {
                let f = self.files();
                at.checked_sub(f.base_entry)
                    .is_some_and(|rel| ((rel / self.entries_per_file) as usize) < f.list.len())
            };
            if !present {
                self.create_file(at)?;
            }
            // The first entry of the next file.
            at = (at / self.entries_per_file + 1) * self.entries_per_file;
        }
        Ok(())
    }

    /// Makes sure the file the next entry goes to exists (writer only), so
    /// an append can fail here — before its record is written to the
    /// CommitLog — rather than after it is published.
    pub fn reserve(&self) -> Result<()> {
        let idx = self.entries.load(Ordering::Relaxed);
        let present = {
            let f = self.files();
            idx.checked_sub(f.base_entry)
                .is_some_and(|rel| ((rel / self.entries_per_file) as usize) < f.list.len())
        };
        if !present {
            self.create_file(idx)?;
        }
        Ok(())
    }

    /// Appends one entry (writer only). `msg_timestamp` is folded into the
    /// running max so time lookups can binary-search.
    pub fn append(&self, mut e: CqEntry) -> Result<()> {
        let idx = self.entries.load(Ordering::Relaxed);
        let prev_ts = self.last_msg_ts.load(Ordering::Relaxed);
        e.msg_timestamp = e.msg_timestamp.max(prev_ts);
        let file = {
            let rel_file = {
                let f = self.files();
                let rel = idx - f.base_entry;
                let n = (rel / self.entries_per_file) as usize;
                f.list.get(n).cloned()
            };
            match rel_file {
                Some(file) => file,
                None => self.create_file(idx)?,
            }
        };
        let pos = ((idx % self.entries_per_file) as usize) * ENTRY_SIZE;
        file.write_at(pos, &e.encode());
        self.last_msg_ts.store(e.msg_timestamp, Ordering::Relaxed);
        if idx == self.min_entry.load(Ordering::Relaxed) {
            self.min_offset.store(e.base_offset, Ordering::Release);
        }
        self.entries.store(idx + 1, Ordering::Release);
        self.max_offset.store(e.end_offset(), Ordering::Release);
        Ok(())
    }

    /// The file that entry `idx` goes to, if it exists.
    fn file_for(&self, idx: u64) -> Option<Arc<MappedFile>> {
        let f = self.files();
        let rel = idx.checked_sub(f.base_entry)?;
        f.list.get((rel / self.entries_per_file) as usize).cloned()
    }

    /// Makes the files the next appends need ahead of them: the current one,
    /// and the next once the current is nine tenths full. Called by
    /// appenders before they take the store's writer lock, so creating a
    /// file (allocation, a directory fsync) never holds up other queues'
    /// appends.
    pub fn prepare(&self) -> Result<()> {
        let idx = self.entries.load(Ordering::Acquire);
        if self.file_for(idx).is_none() {
            self.create_file(idx)?;
        }
        let epf = self.entries_per_file;
        if idx % epf >= epf - epf / 10 {
            let next = idx - idx % epf + epf;
            if self.file_for(next).is_none() {
                self.create_file(next)?;
            }
        }
        Ok(())
    }

    fn create_file(&self, idx: u64) -> Result<Arc<MappedFile>> {
        crate::offload(|| self.create_file_now(idx))
    }

    fn create_file_now(&self, idx: u64) -> Result<Arc<MappedFile>> {
        let _one = self.creating.lock().unwrap_or_else(|p| p.into_inner());
        let first = idx - idx % self.entries_per_file;
        {
            // Made meanwhile by another appender: use it.
            let f = self.files();
            if let Some(existing) = first
                .checked_sub(f.base_entry)
                .and_then(|rel| f.list.get((rel / self.entries_per_file) as usize))
            {
                return Ok(Arc::clone(existing));
            }
            let expected = f.base_entry + f.list.len() as u64 * self.entries_per_file;
            if !f.list.is_empty() && first != expected {
                // Only the file right after the last may be made.
                return Err(StoreError::Config(format!(
                    "ConsumeQueue {}/{}: file for entry {first} is not next ({expected})",
                    self.topic, self.queue_id
                )));
            }
        }
        std::fs::create_dir_all(&self.dir).map_err(StoreError::io("create dir", &self.dir))?;
        let path = self.dir.join(file_name(first));
        let file = Arc::new(
            MappedFile::create(&path, self.entries_per_file * ENTRY_SIZE as u64)
                .map_err(StoreError::io("create", &path))?,
        );
        let mut f = self.files.write().unwrap_or_else(|p| p.into_inner());
        if f.list.is_empty() {
            f.base_entry = first;
        }
        f.list.push(Arc::clone(&file));
        Ok(file)
    }

    /// Flushes entries written since the last flush.
    pub fn flush(&self) -> Result<()> {
        let end = self.entries.load(Ordering::Acquire);
        let start = self.flushed_entries.load(Ordering::Acquire);
        if end <= start {
            return Ok(());
        }
        let f = self.files();
        let mut idx = start.max(f.base_entry);
        while idx < end {
            let rel = idx - f.base_entry;
            let Some(file) = f.list.get((rel / self.entries_per_file) as usize) else {
                break;
            };
            let in_file = rel % self.entries_per_file;
            let n = (self.entries_per_file - in_file).min(end - idx);
            crate::fault::check("cq-msync")
                .and_then(|()| file.flush_range(in_file as usize * ENTRY_SIZE, n as usize * ENTRY_SIZE))
                .map_err(StoreError::io("flush", file.path()))?;
            idx += n;
        }
        self.flushed_entries.store(end, Ordering::Release);
        Ok(())
    }

    /// Drops every entry whose CommitLog entry starts at or after `phys`
    /// (recovery, before readers exist): zeroes them on disk and removes files
    /// that held only such entries.
    pub fn truncate_from_phys(&self, phys: u64) -> Result<()> {
        let keep = self.partition_point(|e| e.phys_offset < phys);
        self.truncate_to_entries(keep)
    }

    fn truncate_to_entries(&self, keep: u64) -> Result<()> {
        let end = self.entries.load(Ordering::Acquire);
        if keep >= end {
            return Ok(());
        }
        let mut f = self.files.write().unwrap_or_else(|p| p.into_inner());
        let needed = if keep <= f.base_entry {
            0
        } else {
            (keep - f.base_entry).div_ceil(self.entries_per_file) as usize
        };
        // Keep at least the first file so the queue remembers where it starts.
        let keep_files = needed.max(1).min(f.list.len());
        for file in f.list.drain(keep_files..) {
            std::fs::remove_file(file.path()).map_err(StoreError::io("remove", file.path()))?;
        }
        if let Some(last) = f.list.last() {
            let last_first = f.base_entry + (f.list.len() as u64 - 1) * self.entries_per_file;
            let from = keep.saturating_sub(last_first).min(self.entries_per_file);
            let zero_len = (self.entries_per_file - from) as usize * ENTRY_SIZE;
            if zero_len > 0 {
                last.write_at(from as usize * ENTRY_SIZE, &vec![0u8; zero_len]);
                last.flush_range(from as usize * ENTRY_SIZE, zero_len)
                    .map_err(StoreError::io("flush", last.path()))?;
            }
        }
        let keep = keep.max(f.base_entry);
        drop(f);
        self.entries.store(keep, Ordering::Release);
        self.flushed_entries.store(keep, Ordering::Release);
        let prev = if keep > 0 { self.entry(keep - 1) } else { None };
        match prev {
            Some(p) if keep > self.min_entry.load(Ordering::Acquire) => {
                self.max_offset.store(p.end_offset(), Ordering::Release);
                self.last_msg_ts.store(p.msg_timestamp, Ordering::Relaxed);
            }
            _ => {
                // Nothing left: the queue restarts empty at its old start.
                let start = self.raw_min_offset();
                self.max_offset.store(start, Ordering::Release);
                self.last_msg_ts.store(i64::MIN, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Moves the queue's start past entries whose CommitLog data is gone
    /// (below `commitlog_min`) and deletes files holding only such entries.
    /// The file of the newest entry is always kept so the queue keeps its
    /// end offset across a restart.
    pub fn advance_min(&self, commitlog_min: u64) -> Result<()> {
        let first_live = self.partition_point(|e| e.phys_offset < commitlog_min);
        if first_live <= self.min_entry.load(Ordering::Acquire) {
            return Ok(());
        }
        let new_min_offset = match self.entry(first_live) {
            Some(e) => e.base_offset,
            None => self.max_offset(),
        };
        self.min_entry.fetch_max(first_live, Ordering::AcqRel);
        // Never below a start set by DeleteRecords.
        self.min_offset.fetch_max(new_min_offset, Ordering::AcqRel);
        let mut f = self.files.write().unwrap_or_else(|p| p.into_inner());
        // A file goes only while a later one holds an entry: the newest
        // entry's file is what a restart reads the queue's end from (the
        // next file, made ahead when this one filled, may still be empty).
        let entries = self.entry_count();
        while f.list.len() > 1
            && f.base_entry + self.entries_per_file <= first_live
            && entries > f.base_entry + self.entries_per_file
        {
            let file = f.list.remove(0);
            f.base_entry += self.entries_per_file;
            std::fs::remove_file(file.path()).map_err(StoreError::io("remove", file.path()))?;
        }
        Ok(())
    }

    /// Raises the first readable offset to `offset` (Kafka DeleteRecords),
    /// which may fall inside a batch entry. Never lowers it; clamped to the
    /// end. Returns the new first offset.
    pub fn raise_min_offset(&self, offset: u64) -> u64 {
        let target = offset.min(self.max_offset());
        if let Some(idx) = self.find(target) {
            self.min_entry.fetch_max(idx, Ordering::AcqRel);
        } else if target >= self.max_offset() {
            self.min_entry.fetch_max(self.entry_count(), Ordering::AcqRel);
        }
        self.min_offset.fetch_max(target, Ordering::AcqRel);
        if let Some(c) = self.clean() {
            c.raise_start(target);
        }
        self.min_offset()
    }

    /// Deletes all files of this queue (it will be rebuilt by recovery).
    pub fn destroy(&self) -> Result<()> {
        let mut f = self.files.write().unwrap_or_else(|p| p.into_inner());
        f.list.clear();
        f.base_entry = 0;
        drop(f);
        self.set_clean(None);
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir).map_err(StoreError::io("remove", &self.dir))?;
        }
        for a in [
            &self.entries,
            &self.min_entry,
            &self.max_offset,
            &self.min_offset,
            &self.flushed_entries,
        ] {
            a.store(0, Ordering::Release);
        }
        self.last_msg_ts.store(i64::MIN, Ordering::Relaxed);
        Ok(())
    }
}

fn read_entry(file: &MappedFile, n: u64) -> CqEntry {
    let mut b = [0u8; ENTRY_SIZE];
    file.read_into(n as usize * ENTRY_SIZE, &mut b);
    CqEntry::decode(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(base: u64, count: u32, phys: u64, ts: i64) -> CqEntry {
        CqEntry {
            phys_offset: phys,
            size: 100,
            count,
            base_offset: base,
            tag_code: 0,
            store_timestamp: ts,
            msg_timestamp: ts,
        }
    }

    #[test]
    fn append_find_reload_truncate() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tmp", "/tmp"))?;
        let topic: Arc<str> = Arc::from("t");
        let cq = ConsumeQueue::new(dir.path(), Arc::clone(&topic), 0, 4);
        let mut base = 0;
        for i in 0..10u64 {
            let count = if i % 3 == 0 { 5 } else { 1 };
            cq.append(e(base, count, i * 100, 1000 + i as i64))?;
            base += u64::from(count);
        }
        assert_eq!(cq.max_offset(), base);
        assert_eq!(cq.find(0), Some(0));
        assert_eq!(cq.find(4), Some(0));
        assert_eq!(cq.find(5), Some(1));
        assert_eq!(cq.find(base - 1), Some(9));
        assert_eq!(cq.find(base), None);
        assert_eq!(cq.offset_by_store_time(1003), cq.entry(3).map_or(0, |e| e.base_offset));
        assert_eq!(cq.offset_by_store_time(99_999), base);
        cq.flush()?;
        drop(cq);
        let cq = ConsumeQueue::load(dir.path(), Arc::clone(&topic), 0, 4)?;
        assert_eq!(cq.entry_count(), 10);
        assert_eq!(cq.max_offset(), base);
        cq.truncate_from_phys(500)?;
        assert_eq!(cq.entry_count(), 5);
        assert_eq!(cq.entry(4).map(|e| e.phys_offset), Some(400));
        drop(cq);
        let cq = ConsumeQueue::load(dir.path(), Arc::clone(&topic), 0, 4)?;
        assert_eq!(cq.entry_count(), 5);
        cq.advance_min(250)?;
        assert_eq!(cq.min_offset(), cq.entry(3).map_or(0, |e| e.base_offset));
        assert_eq!(cq.find(0), None);
        Ok(())
    }

    /// Retention past every entry of a queue whose entries end exactly at a
    /// file boundary (the next file made ahead, still empty): the newest
    /// entry's file stays, so a restart still knows where the queue ends.
    #[test]
    fn retention_past_every_entry_keeps_the_queues_end() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tmp", "/tmp"))?;
        let topic: Arc<str> = Arc::from("t");
        let cq = ConsumeQueue::new(dir.path(), Arc::clone(&topic), 0, 4);
        for i in 0..8u64 {
            cq.prepare()?;
            cq.append(e(i, 1, i * 100, 1000 + i as i64))?;
        }
        cq.prepare()?;
        cq.flush()?;
        cq.advance_min(10_000)?;
        assert_eq!((cq.min_offset(), cq.max_offset()), (8, 8));
        drop(cq);
        let cq = ConsumeQueue::load(dir.path(), Arc::clone(&topic), 0, 4)?;
        assert_eq!(cq.max_offset(), 8, "the end survives the restart");
        Ok(())
    }

    /// A kill -9 between a queue file's creation and its allocation leaves
    /// it empty (seen in the crash test): the queue loads without it, keeps
    /// its entries and makes the file again; an empty file before the last
    /// is still damage.
    #[test]
    fn an_empty_newest_file_is_a_creation_cut_short() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tmp", "/tmp"))?;
        let topic: Arc<str> = Arc::from("t");
        let cq = ConsumeQueue::new(dir.path(), Arc::clone(&topic), 0, 4);
        for i in 0..6u64 {
            cq.append(e(i, 1, i * 100, 1000 + i as i64))?;
        }
        cq.flush()?;
        drop(cq);
        let qdir = dir.path().join("t").join("0");
        let empty = qdir.join(file_name(8));
        std::fs::write(&empty, b"").map_err(StoreError::io("write", &empty))?;
        let cq = ConsumeQueue::load(dir.path(), Arc::clone(&topic), 0, 4)?;
        assert_eq!(cq.entry_count(), 6);
        assert!(!empty.exists());
        cq.append(e(6, 1, 600, 1006))?;
        cq.append(e(7, 1, 700, 1007))?;
        cq.append(e(8, 1, 800, 1008))?;
        assert_eq!(cq.find(8), Some(8));
        drop(cq);
        // Empty, but not the newest: refused, naming it.
        let middle = qdir.join(file_name(4));
        std::fs::write(&middle, b"").map_err(StoreError::io("write", &middle))?;
        let err = ConsumeQueue::load(dir.path(), topic, 0, 4).err();
        assert!(matches!(err, Some(StoreError::BadFile { ref path, .. }) if *path == middle));
        Ok(())
    }

    #[test]
    fn foreign_file_is_named() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tmp", "/tmp"))?;
        let qdir = dir.path().join("t").join("0");
        std::fs::create_dir_all(&qdir).map_err(StoreError::io("mkdir", &qdir))?;
        std::fs::write(qdir.join("notes.txt"), b"x").map_err(StoreError::io("write", &qdir))?;
        let err = ConsumeQueue::load(dir.path(), Arc::from("t"), 0, 4).err();
        assert!(matches!(err, Some(StoreError::BadFile { ref path, .. }) if path.ends_with("notes.txt")));
        Ok(())
    }
}

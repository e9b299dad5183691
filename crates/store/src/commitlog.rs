//! The CommitLog: one append stream of entries over fixed-size mapped
//! segments named by their start offset (20 digits).
//!
//! Concurrency: [`CommitLog`] is shared; readers call [`CommitLog::read`] from
//! any thread and see only bytes below `write_pos`, which the writer stores
//! with `Release` once an entry (and its dispatch) is complete. The single
//! [`CommitLogWriter`] lives inside the store's writer mutex. Flushes may run
//! on any thread; `flush_lock` makes them take turns.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;

use bytes::Bytes;

use crate::error::{Result, StoreError};
use crate::mapped::MappedFile;
use crate::record::BLANK_MAGIC;
use crate::{file_name, parse_file_name};

/// One segment file.
#[derive(Debug, Clone)]
pub struct Segment {
    pub start: u64,
    pub file: Arc<MappedFile>,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.start + self.file.len() as u64
    }
}

/// The shared, read side of the CommitLog.
#[derive(Debug)]
pub struct CommitLog {
    dir: PathBuf,
    segments: RwLock<Vec<Segment>>,
    write_pos: AtomicU64,
    flushed_pos: AtomicU64,
    flush_lock: Mutex<()>,
    /// Held across each msync of the segments' mappings and the failure it
    /// records (see [`CommitLog::sync_range`]).
    sync_lock: Mutex<()>,
    /// Number of flushes that wrote something (group commits in sync mode).
    flushes: AtomicU64,
    /// The first failed write-back, if one failed: final (see
    /// [`StoreError::StorageFailed`]).
    failed: std::sync::OnceLock<String>,
}

impl CommitLog {
    /// Opens the segments in `dir`: names must be 20-digit offsets and each
    /// segment must start where the previous one ends.
    pub fn load(dir: &Path) -> Result<CommitLog> {
        std::fs::create_dir_all(dir).map_err(StoreError::io("create dir", dir))?;
        let mut found = Vec::new();
        for item in std::fs::read_dir(dir).map_err(StoreError::io("read dir", dir))? {
            let item = item.map_err(StoreError::io("read dir", dir))?;
            let path = item.path();
            let start = parse_file_name(&item.file_name())
                .ok_or_else(|| StoreError::bad_file(&path, "not a CommitLog segment name (20 digits)"))?;
            let len = item.metadata().map_err(StoreError::io("stat", &path))?.len();
            found.push((start, len, path));
        }
        found.sort();
        // An empty last file is a pre-allocation cut short by a crash.
        if let Some((_, 0, path)) = found.last() {
            std::fs::remove_file(path).map_err(StoreError::io("remove", path))?;
            found.pop();
        }
        let mut segments = Vec::with_capacity(found.len());
        for (i, (start, len, path)) in found.iter().enumerate() {
            if *len < 4096 {
                return Err(StoreError::bad_file(
                    path,
                    format!("segment of {len} bytes is too small"),
                ));
            }
            if let Some((pstart, plen, _)) = i.checked_sub(1).map(|p| &found[p]) {
                if pstart + plen != *start {
                    return Err(StoreError::bad_file(
                        path,
                        format!(
                            "segment starts at {start} but the previous one ends at {}",
                            pstart + plen
                        ),
                    ));
                }
            }
            let file = MappedFile::open(path).map_err(StoreError::io("map", path))?;
            segments.push(Segment {
                start: *start,
                file: Arc::new(file),
            });
        }
        let start = segments.first().map_or(0, |s| s.start);
        Ok(CommitLog {
            dir: dir.to_path_buf(),
            segments: RwLock::new(segments),
            write_pos: AtomicU64::new(start),
            flushed_pos: AtomicU64::new(start),
            flush_lock: Mutex::new(()),
            sync_lock: Mutex::new(()),
            flushes: AtomicU64::new(0),
            failed: std::sync::OnceLock::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn segs(&self) -> std::sync::RwLockReadGuard<'_, Vec<Segment>> {
        self.segments.read().unwrap_or_else(|p| p.into_inner())
    }

    /// A snapshot of the segment list.
    pub fn segments(&self) -> Vec<Segment> {
        self.segs().clone()
    }

    /// End of published data.
    pub fn write_pos(&self) -> u64 {
        self.write_pos.load(Ordering::Acquire)
    }

    /// End of data known to be on disk.
    pub fn flushed_pos(&self) -> u64 {
        self.flushed_pos.load(Ordering::Acquire)
    }

    /// First offset still on disk.
    pub fn min_offset(&self) -> u64 {
        self.segs().first().map_or_else(|| self.write_pos(), |s| s.start)
    }

    pub(crate) fn publish(&self, pos: u64) {
        self.write_pos.store(pos, Ordering::Release);
    }

    pub(crate) fn set_recovered(&self, end: u64) {
        self.write_pos.store(end, Ordering::Release);
        self.flushed_pos.store(end, Ordering::Release);
    }

    fn segment_of(segs: &[Segment], phys: u64) -> Option<&Segment> {
        let i = segs.partition_point(|s| s.start <= phys).checked_sub(1)?;
        segs.get(i).filter(|s| phys < s.end())
    }

    /// A zero-copy view of `[phys, phys + len)`, if published and still on
    /// disk. The range must lie in one segment (entries never span two).
    pub fn read(&self, phys: u64, len: usize) -> Option<Bytes> {
        if phys + len as u64 > self.write_pos() {
            return None;
        }
        let segs = self.segs();
        let seg = Self::segment_of(&segs, phys)?;
        let rel = (phys - seg.start) as usize;
        if rel + len > seg.file.len() {
            return None;
        }
        Some(seg.file.view(rel, len))
    }

    /// Reads the entry starting at `phys` (its size from its first 4 bytes).
    pub fn read_entry_at(&self, phys: u64, max_size: usize) -> Option<Bytes> {
        let head = self.read(phys, 8)?;
        let size = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if !(8..=max_size).contains(&size) {
            return None;
        }
        self.read(phys, size)
    }

    /// Why the CommitLog stopped taking writes, if a write-back failed.
    pub fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// Records a failed write-back as final (the first one wins) and returns
    /// the error every later write gets.
    pub(crate) fn fail(&self, why: String) -> StoreError {
        if self.failed.set(why.clone()).is_ok() {
            tracing::error!(error = %why, "storage failed: writes are refused until restart");
            metrics::gauge!("rokka_store_failed").set(1.0);
        }
        StoreError::StorageFailed(self.failed.get().cloned().unwrap_or(why))
    }

    /// Flushes everything below `target` to disk. Concurrent callers take
    /// turns; a caller whose target is already covered returns at once. A
    /// failed write-back is final: this and every later flush fail, and
    /// `flushed_pos` never passes what was written back before it.
    pub fn flush_to(&self, target: u64) -> Result<()> {
        let _g = self.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        let from = self.flushed_pos();
        if target <= from {
            return self
                .failure()
                .map_or(Ok(()), |why| Err(StoreError::StorageFailed(why.to_string())));
        }
        self.sync_range(from, target)?;
        self.mark_flushed(target);
        Ok(())
    }

    /// Writes `[from, to)` back to disk and waits for it, without taking
    /// turns with other flushes (the sync-mode flushers keep several ranges
    /// in flight) and without moving `flushed_pos`: the caller marks what
    /// is flushed once every range below it is ([`CommitLog::mark_flushed`]).
    /// A failure is final, as in [`CommitLog::flush_to`].
    ///
    /// msyncs take turns: Linux reports a write-back error to the first
    /// fsync or msync of the open file after it, whichever range that one
    /// covers, so an msync running beside one that takes the error would
    /// return success for pages that were lost. Taking turns, and the
    /// failure recorded before the turn ends, a sync that follows one that
    /// failed sees the failure.
    pub(crate) fn sync_range(&self, from: u64, to: u64) -> Result<()> {
        if to <= from {
            return self
                .failure()
                .map_or(Ok(()), |why| Err(StoreError::StorageFailed(why.to_string())));
        }
        let _turn = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = self.failure() {
            return Err(StoreError::StorageFailed(why.to_string()));
        }
        let segs = self.segments();
        for seg in segs.iter().filter(|s| s.end() > from && s.start < to) {
            let a = from.max(seg.start) - seg.start;
            let b = to.min(seg.end()) - seg.start;
            if let Err(e) =
                crate::fault::check("msync").and_then(|()| seg.file.flush_range(a as usize, (b - a) as usize))
            {
                return Err(self.fail(format!("msync {}: {e}", seg.file.path().display())));
            }
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Everything below `pos` is on disk (never moves back; nothing moves it
    /// after a failed write-back).
    pub(crate) fn mark_flushed(&self, pos: u64) {
        if self.failure().is_none() {
            // Never past what is written: a sync started before a replica
            // cut its log ends after the cut, and what is written at the
            // cut's offsets since is not what it synced.
            self.flushed_pos.fetch_max(pos.min(self.write_pos()), Ordering::AcqRel);
        }
    }

    /// Flushes that wrote something since open.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    pub(crate) fn push_segment(&self, seg: Segment) {
        self.segments.write().unwrap_or_else(|p| p.into_inner()).push(seg);
    }

    /// Removes segments after the one holding `end` (recovery truncation).
    pub(crate) fn drop_segments_after(&self, end: u64) -> Result<()> {
        let mut segs = self.segments.write().unwrap_or_else(|p| p.into_inner());
        while segs.len() > 1 && segs.last().is_some_and(|s| s.start > end) {
            if let Some(s) = segs.pop() {
                std::fs::remove_file(s.file.path()).map_err(StoreError::io("remove", s.file.path()))?;
            }
        }
        Ok(())
    }

    /// Removes every segment (a replica restarting its log at its master's
    /// start: `MessageStore::restart_log_at`).
    pub(crate) fn drop_all_segments(&self) -> Result<()> {
        let mut segs = self.segments.write().unwrap_or_else(|p| p.into_inner());
        while let Some(s) = segs.pop() {
            std::fs::remove_file(s.file.path()).map_err(StoreError::io("remove", s.file.path()))?;
        }
        Ok(())
    }

    /// Deletes the oldest segment if `pred` allows it (never the last one).
    pub(crate) fn delete_oldest_if(&self, pred: impl Fn(&Segment) -> bool) -> Result<Option<Segment>> {
        let mut segs = self.segments.write().unwrap_or_else(|p| p.into_inner());
        if segs.len() < 2 || !pred(&segs[0]) {
            return Ok(None);
        }
        let s = segs.remove(0);
        drop(segs);
        std::fs::remove_file(s.file.path()).map_err(StoreError::io("remove", s.file.path()))?;
        Ok(Some(s))
    }
}

/// How the CommitLog prepares the bytes ahead of its writer (from the
/// store config: `preallocate`, `prefault_window_bytes`, the flush mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preparation {
    /// How far ahead of the write position pages are kept faulted in.
    pub window: usize,
    /// Sync flush mode: the window is also written back once (see
    /// [`prepare_range`]).
    pub write_back: bool,
}

impl Preparation {
    /// The preparation a store config asks for (none without `preallocate`).
    pub fn of(config: &crate::config::StoreConfig) -> Option<Preparation> {
        config.preallocate.then(|| Preparation {
            window: usize::try_from(config.prefault_window_bytes).unwrap_or(usize::MAX),
            write_back: config.flush_mode == crate::config::FlushMode::Sync,
        })
    }
}

/// The pages a preparation pass handles at once: small enough that the
/// writer catching up waits little for the one in progress.
const PREPARE_CHUNK: usize = 2 << 20;

/// Prepares what the writer will need next on its own thread: creates the
/// next segment file at full size (its blocks allocated, so a full disk is
/// an error there, not a SIGBUS in the writer) and faults in a sliding
/// window of pages ahead of the write position, so the writer's appends do
/// not take the first-touch faults themselves (the page cache's new pages
/// are zeroed there: on a VM whose freed memory goes back to the host that
/// is ~2–4 µs per KiB, docs/benchmarks.md). Only the window is prepared,
/// never whole segments: a fresh node's first message costs what later
/// ones do, and the pages mapped ahead of the writer stay bounded by it.
///
/// A writer that outruns the allocator faults its pages in itself
/// (populating inline on the writer's path was measured no faster,
/// docs/benchmarks.md).
struct Allocator {
    state: Arc<(Mutex<AllocState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct AllocState {
    want: Option<(u64, u64)>,
    ready: Option<(u64, Arc<MappedFile>)>,
    /// The range of the writer's segment (starting at the CommitLog offset
    /// given) to prepare next: `[from, to)`; `from` advances as the
    /// allocator prepares it, so once nothing is pending it is where the
    /// prepared pages end.
    window: Option<(Arc<MappedFile>, u64, usize, usize)>,
    /// Bytes prepared since start (tests read it).
    prepared: u64,
    /// A range or a segment is being prepared right now.
    busy: bool,
    stop: bool,
}

impl AllocState {
    fn has_work(&self) -> bool {
        self.window.as_ref().is_some_and(|(_, _, from, to)| from < to)
            || self
                .want
                .is_some_and(|(w, _)| self.ready.as_ref().is_none_or(|(r, _)| *r != w))
    }
}

impl Allocator {
    fn start(dir: PathBuf, prep: Preparation) -> Result<Allocator> {
        let state = Arc::new((Mutex::new(AllocState::default()), Condvar::new()));
        let st = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("rokka-segment-alloc".into())
            .spawn(move || allocator_loop(&dir, &st, prep))
            .map_err(StoreError::io("spawn", "rokka-segment-alloc"))?;
        Ok(Allocator {
            state,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AllocState> {
        self.state.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn request(&self, start: u64, len: u64) {
        self.lock().want = Some((start, len));
        self.state.1.notify_all();
    }

    /// Asks for `[from, to)` of `seg` (the writer's segment, written up to
    /// `writer_at`) to be prepared. A range of the same segment extends what
    /// is pending; another segment's replaces it (the writer moved on).
    /// Nothing below the writer is prepared: it has faulted that in itself.
    fn prepare(&self, seg: &Segment, writer_at: usize, from: usize, to: usize) {
        let mut st = self.lock();
        match &mut st.window {
            Some((f, _, pending_from, pending_to)) if Arc::ptr_eq(f, &seg.file) => {
                *pending_from = (*pending_from).min(from).max(writer_at);
                *pending_to = (*pending_to).max(to);
            }
            w => *w = Some((Arc::clone(&seg.file), seg.start, from.max(writer_at), to)),
        }
        drop(st);
        self.state.1.notify_all();
    }

    /// Waits until nothing is left to prepare; returns the bytes prepared
    /// since start and the CommitLog offset where the writer's segment's
    /// prepared pages end.
    fn settle(&self) -> (u64, u64) {
        let mut st = self.lock();
        while (st.has_work() || st.busy) && !st.stop {
            st = self
                .state
                .1
                .wait_timeout(st, std::time::Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let end = st.window.as_ref().map_or(0, |(_, start, from, _)| start + *from as u64);
        (st.prepared, end)
    }

    /// The prepared segment at `start`, waiting for it if it is being made.
    fn take(&self, start: u64) -> Option<Arc<MappedFile>> {
        let mut st = self.lock();
        loop {
            if let Some((s, _)) = &st.ready {
                if *s == start {
                    return st.ready.take().map(|(_, f)| f);
                }
            }
            if st.want.is_some_and(|(s, _)| s == start) {
                st = self.state.1.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            return None;
        }
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        self.lock().stop = true;
        self.state.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Allocator {
    /// Stops the allocator and removes a segment it made ahead that was
    /// never handed to the writer (it is in no segment list).
    fn discard(mut self) {
        self.lock().stop = true;
        self.state.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some((_, f)) = self.lock().ready.take() {
            let path = f.path().to_path_buf();
            drop(f);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "removing an unused pre-made segment failed");
            }
        }
    }
}

fn allocator_loop(dir: &Path, st: &(Mutex<AllocState>, Condvar), prep: Preparation) {
    let mut failures = PrepareFailures::default();
    loop {
        let (chunk, want) = {
            let mut s = st.0.lock().unwrap_or_else(|p| p.into_inner());
            while !s.stop && !s.has_work() {
                s = st.1.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            if s.stop {
                return;
            }
            // The writer's window first: it is what the next appends touch.
            let chunk = match &mut s.window {
                Some((f, _, from, to)) if *from < *to => {
                    let end = (*to).min(*from + PREPARE_CHUNK).min(f.len());
                    let c = (Arc::clone(f), *from, end);
                    *from = if end > *from { end } else { *to };
                    Some(c)
                }
                _ => None,
            };
            let want = if chunk.is_none() {
                s.want.filter(|(w, _)| s.ready.as_ref().is_none_or(|(r, _)| r != w))
            } else {
                None
            };
            s.busy = chunk.is_some() || want.is_some();
            (chunk, want)
        };
        if let Some((f, from, to)) = chunk {
            let done = failures.note(&f, prepare_range(&f, from, to, prep.write_back));
            let mut s = st.0.lock().unwrap_or_else(|p| p.into_inner());
            s.prepared += if done { (to - from) as u64 } else { 0 };
            s.busy = false;
            st.1.notify_all();
            continue;
        }
        if let Some((start, len)) = want {
            let path = dir.join(file_name(start));
            match MappedFile::create(&path, len) {
                Ok(f) => {
                    // The new segment's first window, so the roll into it
                    // costs what any append costs.
                    let first = prep.window.min(f.len());
                    let mut at = 0;
                    while at < first
                        && failures.note(
                            &f,
                            prepare_range(&f, at, first.min(at + PREPARE_CHUNK), prep.write_back),
                        )
                    {
                        at = first.min(at + PREPARE_CHUNK);
                    }
                    let mut s = st.0.lock().unwrap_or_else(|p| p.into_inner());
                    s.prepared += at as u64;
                    s.busy = false;
                    if s.want == Some((start, len)) {
                        s.want = None;
                        s.ready = Some((start, Arc::new(f)));
                    }
                    st.1.notify_all();
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "pre-allocating segment failed");
                    let mut s = st.0.lock().unwrap_or_else(|p| p.into_inner());
                    s.busy = false;
                    if s.want == Some((start, len)) {
                        s.want = None;
                    }
                    st.1.notify_all();
                }
            }
        }
    }
}

/// Faults in `[from, to)` of a segment ahead of the writer without changing
/// its bytes. Async mode populates the page cache and page tables for
/// reading (MADV_POPULATE_READ): the pages stay clean, so nothing the writer
/// has not written is ever written back, and the writer's first write to a
/// page is a cheap minor fault. Sync mode populates for writing and writes
/// the range back once (zeros): a sync flush into a fallocated (unwritten)
/// extent must also convert it, a journal commit per flush (on this disk a
/// 1 KiB msync took 353 µs into an unwritten extent against 130 µs into a
/// written one); done a window at a time, never whole segments.
fn prepare_range(f: &MappedFile, from: usize, to: usize, write_back: bool) -> std::io::Result<()> {
    if from >= to {
        return Ok(());
    }
    f.prefault_range(from, to - from, write_back)?;
    if write_back {
        crate::fault::check("prepare-msync")?;
        // Through a descriptor of its own: an error here must also reach
        // the flusher's msync of this file (see `flush_range_apart`).
        f.flush_range_apart(from, to - from)?;
    }
    metrics::counter!("rokka_store_prepared_bytes_total").increment((to - from) as u64);
    Ok(())
}

/// Preparation failures, logged once per allocator (a kernel without
/// MADV_POPULATE_* would fail every chunk) and counted. A failed range is
/// only a missed optimisation: the writer faults those pages in itself.
#[derive(Default)]
struct PrepareFailures {
    logged: bool,
}

impl PrepareFailures {
    /// Whether `r` succeeded; a failure is counted, and logged the first time.
    fn note(&mut self, f: &MappedFile, r: std::io::Result<()>) -> bool {
        let Err(e) = r else {
            return true;
        };
        metrics::counter!("rokka_store_prepare_failures_total").increment(1);
        if !std::mem::replace(&mut self.logged, true) {
            tracing::warn!(path = %f.path().display(), error = %e, "preparing CommitLog pages ahead of the writer failed (logged once; rokka_store_prepare_failures_total counts)");
        }
        false
    }
}

/// The single writer of the CommitLog.
pub struct CommitLogWriter {
    log: Arc<CommitLog>,
    segment_bytes: u64,
    active: Option<Segment>,
    /// Write position inside `active`.
    wrote: usize,
    allocator: Option<Allocator>,
    /// How far ahead of `wrote` the allocator keeps pages prepared.
    window: usize,
    /// End of what was asked to be prepared in `active` (see `keep_ahead`).
    prepared_to: usize,
    /// The segment after `active` was asked for.
    next_requested: bool,
    /// See [`CommitLogWriter::refuse_writes_above`].
    refuse_above: u8,
}

impl CommitLogWriter {
    /// Continues writing at `end` (the recovered end of data), preparing
    /// pages ahead of the writer as `prep` says (none: never ahead).
    pub fn new(
        log: Arc<CommitLog>,
        end: u64,
        segment_bytes: u64,
        prep: Option<Preparation>,
    ) -> Result<CommitLogWriter> {
        // The segment holding `end`; none when `end` is exactly a segment's
        // end (a crash after its BLANK filler, before the next segment was
        // made): the next append then starts a new segment at `end`.
        let active = log
            .segs()
            .iter()
            .rev()
            .find(|s| s.start <= end && end < s.end())
            .cloned();
        let allocator = match prep {
            Some(p) => Some(Allocator::start(log.dir.clone(), p)?),
            None => None,
        };
        let mut w = CommitLogWriter {
            log,
            segment_bytes,
            wrote: 0,
            active: None,
            allocator,
            window: prep.map_or(0, |p| p.window),
            prepared_to: 0,
            next_requested: false,
            refuse_above: 0,
        };
        if let Some(seg) = active {
            w.wrote = (end - seg.start) as usize;
            w.prepared_to = w.wrote;
            w.active = Some(seg);
            w.keep_ahead();
        }
        Ok(w)
    }

    /// Waits for the allocator to finish what it was asked; the bytes
    /// prepared since this writer started and the CommitLog offset up to
    /// which the writer's segment is prepared ((0, 0) without preallocation).
    pub fn settle_preparation(&self) -> (u64, u64) {
        self.allocator.as_ref().map_or((0, 0), Allocator::settle)
    }

    /// Before this writer is replaced by one elsewhere in the log (a replica
    /// restarting or cutting its log): its allocator stops, and a segment it
    /// made ahead — in no segment list — is removed, before the new writer
    /// may make (or reuse) a file of that name. Left on disk past where the
    /// log now goes, the next open found a gap before it and refused to
    /// start.
    pub fn discard_ahead(&mut self) {
        if let Some(a) = self.allocator.take() {
            a.discard();
        }
    }

    /// Asks the allocator to prepare up to a window ahead of the write
    /// position once less than half a window is prepared (one comparison
    /// per append, a request every half window), and for the next segment
    /// (created, its first window prepared) once the writer is half-way
    /// through this one, or two windows from its end if that comes first:
    /// a fresh store prepares one window, not two segments, and a busy one
    /// has half a segment's time to make the next.
    fn keep_ahead(&mut self) {
        let (Some(a), Some(seg)) = (&self.allocator, &self.active) else {
            return;
        };
        let len = seg.file.len();
        if !self.next_requested
            && (self.wrote >= len / 2 || self.wrote.saturating_add(self.window.saturating_mul(2)) >= len)
        {
            a.request(seg.end(), self.segment_bytes);
            self.next_requested = true;
        }
        if self.prepared_to >= len || self.wrote + self.window / 2 < self.prepared_to {
            return;
        }
        let to = self.wrote.saturating_add(self.window).min(len);
        if to > self.prepared_to {
            a.prepare(seg, self.wrote, self.prepared_to, to);
            self.prepared_to = to;
        }
    }

    /// The offset the next entry will get (before any roll).
    pub fn position(&self) -> u64 {
        self.active
            .as_ref()
            .map_or_else(|| self.log.write_pos(), |s| s.start + self.wrote as u64)
    }

    /// Appends that need a new segment are refused while the data
    /// directory's file system is fuller than `percent` (0 = never).
    pub fn refuse_writes_above(&mut self, percent: u8) {
        self.refuse_above = percent;
    }

    fn next_segment(&mut self, start: u64) -> Result<Segment> {
        // A statvfs, maybe a wait for the allocator or a file to create.
        crate::offload(|| self.next_segment_now(start))
    }

    fn next_segment_now(&mut self, start: u64) -> Result<Segment> {
        if self.refuse_above > 0 {
            if let Some(used) = crate::sys::disk_used_percent(&self.log.dir) {
                if used > f64::from(self.refuse_above) {
                    metrics::counter!("rokka_store_disk_full_refusals_total").increment(1);
                    return Err(StoreError::DiskFull {
                        used,
                        limit: self.refuse_above,
                    });
                }
            }
        }
        let (file, prepared) = match self.allocator.as_ref().and_then(|a| a.take(start)) {
            // The allocator prepared its first window.
            Some(f) => {
                let first = self.window.min(f.len());
                (f, first)
            }
            None => {
                let path = self.log.dir.join(file_name(start));
                let f =
                    Arc::new(MappedFile::create(&path, self.segment_bytes).map_err(StoreError::io("create", &path))?);
                (f, 0)
            }
        };
        self.prepared_to = prepared;
        self.next_requested = false;
        let seg = Segment { start, file };
        if let Some(a) = &self.allocator {
            // What is prepared of the new segment (its first window, or
            // nothing): the allocator's window moves there.
            a.prepare(&seg, 0, prepared, prepared);
        }
        self.log.push_segment(seg.clone());
        Ok(seg)
    }

    /// The offset an entry of `size` bytes would get now (after a roll
    /// when it does not fit): what [`CommitLogWriter::append`] returns.
    pub fn next_position(&self, size: usize) -> u64 {
        match &self.active {
            Some(seg) if self.wrote + size + 8 <= seg.file.len() => seg.start + self.wrote as u64,
            Some(seg) => seg.end(),
            None => self.log.write_pos(),
        }
    }

    /// Rolls to a new segment now when `total` bytes (a batch's entries)
    /// do not fit in the active one but would fit in a fresh one, so the
    /// batch's roll (the step that can fail: a full disk, a file that cannot
    /// be made) happens before any of its entries is written.
    pub fn make_room(&mut self, total: usize) -> Result<()> {
        // (With no active segment the first append rolls before it
        // writes anything: nothing to do here.)
        let fits_fresh = total + 8 <= self.segment_bytes as usize;
        match &self.active {
            Some(seg) if fits_fresh && self.wrote + total + 8 > seg.file.len() => {
                // The roll `append` would do for an entry of that size.
                self.append_roll(total)
            }
            _ => Ok(()),
        }
    }

    /// Makes the segment the next append writes to, if there is none yet
    /// (a log restarted at an offset holds a segment from there at once:
    /// a reopen finds where it starts).
    pub fn open_segment(&mut self) -> Result<()> {
        match self.active {
            Some(_) => Ok(()),
            None => self.append_roll(0),
        }
    }

    fn append_roll(&mut self, size: usize) -> Result<()> {
        let start = match &self.active {
            Some(seg) => {
                let remaining = seg.file.len() - self.wrote;
                if remaining >= 8 {
                    let mut blank = [0u8; 8];
                    blank[0..4].copy_from_slice(&(remaining as u32).to_be_bytes());
                    blank[4..8].copy_from_slice(&BLANK_MAGIC.to_be_bytes());
                    seg.file.write_at(self.wrote, &blank);
                }
                seg.end()
            }
            None => self.log.write_pos(),
        };
        let seg = self.next_segment(start)?;
        if size + 8 > seg.file.len() {
            return Err(StoreError::MessageTooLarge {
                size,
                limit: seg.file.len() - 8,
            });
        }
        self.active = Some(seg);
        self.wrote = 0;
        Ok(())
    }

    /// Reserves `size` bytes for one entry, rolling to a new segment (after a
    /// BLANK filler) when it does not fit with 8 bytes to spare, and lets
    /// `encode` fill them given the entry's offset. Returns that offset.
    /// Nothing is visible to readers until [`CommitLog::publish`].
    pub fn append(&mut self, size: usize, encode: impl FnOnce(&mut [u8], u64)) -> Result<u64> {
        let fits = |seg: &Segment, wrote: usize| wrote + size + 8 <= seg.file.len();
        let need_roll = match &self.active {
            Some(seg) => !fits(seg, self.wrote),
            None => true,
        };
        if need_roll {
            // Appends always leave room for the filler, but a recovered end
            // can fall in a segment's last 7 bytes (a checkpoint's end
            // there, scanned past nothing): those stay zero, which scans
            // step over as they do a filler.
            self.append_roll(size)?;
        }
        let Some(seg) = &self.active else {
            return Err(StoreError::ShutDown);
        };
        let phys = seg.start + self.wrote as u64;
        seg.file.with_region_mut(self.wrote, size, |buf| encode(buf, phys));
        self.wrote += size;
        self.keep_ahead();
        Ok(phys)
    }
}

/// How a scan of the CommitLog ended.
#[derive(Debug)]
pub struct ScanEnd {
    /// End of the last valid entry.
    pub end: u64,
    /// Why the scan stopped before the end of the last segment, if it did.
    pub stopped_by: Option<(PathBuf, u64, String)>,
}

/// Walks entries from `from` (an entry boundary), checking sizes, magic, CRC
/// and that each entry records its own offset, and calls `visit` for each
/// valid one. Stops at the first zero or invalid entry.
pub fn scan(
    log: &CommitLog,
    from: u64,
    max_entry: usize,
    mut visit: impl FnMut(&crate::record::Entry, &Bytes) -> Result<()>,
) -> Result<ScanEnd> {
    let segs = log.segments();
    let Some(first) = segs.iter().position(|s| from < s.end()) else {
        return Ok(ScanEnd {
            end: from,
            stopped_by: None,
        });
    };
    let mut pos = from;
    for seg in &segs[first..] {
        if pos < seg.start {
            pos = seg.start;
        }
        let len = seg.file.len();
        loop {
            let rel = (pos - seg.start) as usize;
            if rel + 8 > len {
                break;
            }
            let size = seg.file.read_u32(rel) as usize;
            let magic = seg.file.read_u32(rel + 4);
            if size == 0 && magic == 0 {
                return Ok(ScanEnd {
                    end: pos,
                    stopped_by: None,
                });
            }
            if magic == BLANK_MAGIC {
                if size == len - rel {
                    pos = seg.end();
                    break;
                }
                return Ok(stop(pos, seg, "BLANK filler with a wrong size"));
            }
            if size < 8 || size > max_entry || rel + size + 8 > len {
                return Ok(stop(pos, seg, &format!("entry size {size} out of range")));
            }
            let bytes = seg.file.view(rel, size);
            match crate::record::decode_checked(&bytes) {
                Ok(e) if e.phys_offset() == pos => {
                    visit(&e, &bytes)?;
                    pos += size as u64;
                }
                Ok(e) => {
                    return Ok(stop(
                        pos,
                        seg,
                        &format!("entry records offset {} (stale data)", e.phys_offset()),
                    ));
                }
                Err(err) => return Ok(stop(pos, seg, &err.to_string())),
            }
        }
    }
    Ok(ScanEnd {
        end: pos,
        stopped_by: None,
    })
}

fn stop(pos: u64, seg: &Segment, why: &str) -> ScanEnd {
    ScanEnd {
        end: pos,
        stopped_by: Some((seg.file.path().to_path_buf(), pos, why.to_string())),
    }
}

/// Whether a valid entry starts at `phys` (used to tell a torn tail from
/// damage in the middle of the log).
pub fn valid_entry_at(log: &CommitLog, phys: u64, max_entry: usize) -> bool {
    let segs = log.segments();
    let Some(seg) = CommitLog::segment_of(&segs, phys) else {
        return false;
    };
    let rel = (phys - seg.start) as usize;
    if rel + 8 > seg.file.len() {
        return false;
    }
    let size = seg.file.read_u32(rel) as usize;
    if size < 8 || size > max_entry || rel + size > seg.file.len() {
        return false;
    }
    let bytes = seg.file.view(rel, size);
    matches!(crate::record::decode_checked(&bytes), Ok(e) if e.phys_offset() == phys)
}

/// Whether a valid entry starts right after the (damaged) entry at `pos`,
/// judging by the size it declares.
pub fn valid_entry_follows(log: &CommitLog, pos: u64, max_entry: usize) -> bool {
    let segs = log.segments();
    let Some(seg) = CommitLog::segment_of(&segs, pos) else {
        return false;
    };
    let rel = (pos - seg.start) as usize;
    if rel + 8 > seg.file.len() {
        return false;
    }
    let size = seg.file.read_u32(rel) as u64;
    (8..=max_entry as u64).contains(&size) && valid_entry_at(log, pos + size, max_entry)
}

/// Whether the copy at `path` holds the segment's `[from, to)` at every
/// byte that is not zero there (zeroed since), a chunk (`buf`) at a time.
fn same_where_not_zero(seg: &Segment, from: usize, to: usize, path: &Path, buf: &mut [u8]) -> Result<bool> {
    use std::io::Read as _;
    // A copy that cannot be read is not the same: set aside, not a reason
    // for recovery to fail.
    let Ok(mut f) = std::fs::File::open(path) else {
        return Ok(false);
    };
    let mut old = vec![0u8; buf.len()];
    let mut at = from;
    while at < to {
        let n = (to - at).min(buf.len());
        seg.file.read_into(at, &mut buf[..n]);
        if f.read_exact(&mut old[..n]).is_err() {
            return Ok(false);
        }
        if !buf[..n].iter().zip(&old[..n]).all(|(new, was)| *new == 0 || new == was) {
            return Ok(false);
        }
        at += n;
    }
    Ok(true)
}

/// Copies the bytes of the segment holding `pos` from `pos` to its last
/// non-zero byte into `dir/<pos as 20 digits>`, before recovery cuts them;
/// None when there are none (a tail of zeros: nothing to keep). Read and
/// written a chunk at a time: a cut near the start of a 1 GiB segment
/// costs a chunk of memory, not the segment.
pub fn save_tail(log: &CommitLog, pos: u64, dir: &Path) -> Result<Option<PathBuf>> {
    use std::io::Write as _;
    const CHUNK: usize = 1 << 20;
    let segs = log.segments();
    let Some(seg) = CommitLog::segment_of(&segs, pos) else {
        return Ok(None);
    };
    let rel = (pos - seg.start) as usize;
    let len = seg.file.len();
    let mut buf = vec![0u8; CHUNK];
    // The last non-zero byte, looking back from the segment's end.
    let mut keep_end = rel;
    let mut hi = len;
    while hi > rel {
        let lo = hi.saturating_sub(CHUNK).max(rel);
        let b = &mut buf[..hi - lo];
        seg.file.read_into(lo, b);
        if let Some(i) = b.iter().rposition(|x| *x != 0) {
            keep_end = lo + i + 1;
            break;
        }
        hi = lo;
    }
    if keep_end == rel {
        return Ok(None);
    }
    let path = dir.join(file_name(pos));
    std::fs::create_dir_all(dir).map_err(StoreError::io("create dir", dir))?;
    // A copy of a tail cut at the same offset is there already (a recovery
    // interrupted while zeroing the tail, or not re-appended yet): never
    // overwritten with less — a recovery killed part-way through zeroing
    // would leave a copy with zeroed chunks in place of the whole one.
    if let Ok(meta) = std::fs::metadata(&path) {
        // Kept if it holds at least this tail and agrees with every byte
        // of it that is not zero (the same tail, partly zeroed since); a
        // different tail cut at the same offset later (a new crash there)
        // is saved, and the old copy set aside.
        if meta.len() >= (keep_end - rel) as u64 && same_where_not_zero(seg, rel, keep_end, &path, &mut buf)? {
            return Ok(Some(path));
        }
        let mut n = 1;
        let kept = loop {
            let p = dir.join(format!("{}.earlier-{n}", file_name(pos)));
            if !p.exists() {
                break p;
            }
            n += 1;
        };
        std::fs::rename(&path, &kept).map_err(StoreError::io("rename", &path))?;
    }
    crate::checkpoint::write_atomically_with(&path, |f| {
        let mut at = rel;
        while at < keep_end {
            let n = (keep_end - at).min(CHUNK);
            seg.file.read_into(at, &mut buf[..n]);
            f.write_all(&buf[..n]).map_err(StoreError::io("write", &path))?;
            at += n;
        }
        Ok(())
    })?;
    Ok(Some(path))
}

/// Zeroes the segment holding `end` from `end` onwards and flushes it.
pub fn zero_tail(log: &CommitLog, end: u64) -> Result<()> {
    let segs = log.segments();
    let Some(seg) = CommitLog::segment_of(&segs, end) else {
        return Ok(());
    };
    let rel = (end - seg.start) as usize;
    // Zero the whole rest of the segment (skipping chunks that are zero
    // already): stale bytes left past the new end could otherwise be taken
    // for entries once new writes reach them.
    const CHUNK: usize = 64 * 1024;
    let mut at = rel;
    let zeros = vec![0u8; CHUNK];
    let mut buf = vec![0u8; CHUNK];
    while at < seg.file.len() {
        let n = CHUNK.min(seg.file.len() - at);
        seg.file.read_into(at, &mut buf[..n]);
        if buf[..n].iter().any(|b| *b != 0) {
            seg.file.write_at(at, &zeros[..n]);
        }
        at += n;
    }
    // On the segment's own mapping, so in turn with the syncs, and final
    // when it fails as theirs are (Linux reports the error once).
    let _turn = log.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
    crate::fault::check("msync")
        .and_then(|()| seg.file.flush_range(rel, at - rel))
        .map_err(|e| log.fail(format!("msync {}: {e}", seg.file.path().display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(buf: &mut [u8], _phys: u64) {
        buf.fill(7);
    }

    const MIB: usize = 1 << 20;

    /// Preparation follows the writer a window at a time: a few messages
    /// prepare about one window, never the segments whole; later appends keep a window
    /// prepared ahead; the next segment is made two windows before the end.
    #[test]
    fn pages_are_prepared_a_window_ahead_not_whole_segments() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tempdir", "."))?;
        let log = Arc::new(CommitLog::load(dir.path())?);
        let seg = 64 * MIB as u64;
        let prep = Preparation {
            window: 4 * MIB,
            write_back: false,
        };
        let mut w = CommitLogWriter::new(Arc::clone(&log), 0, seg, Some(prep))?;
        for _ in 0..10 {
            w.append(1024, entry)?;
        }
        let (first, ready) = w.settle_preparation();
        assert!(first >= 4 * MIB as u64, "prepared {first}");
        assert!(
            first <= 6 * MIB as u64 + 64 * 1024,
            "prepared {first} of a 64 MiB segment"
        );
        assert!(ready >= 4 * MIB as u64, "prepared up to {ready}");
        let files = std::fs::read_dir(dir.path()).map_err(StoreError::io("list", dir.path()))?;
        assert_eq!(files.count(), 1, "the next segment was made early");
        // 20 MiB further on: the window moved with the writer.
        for _ in 0..20 * 1024 {
            w.append(1024, entry)?;
        }
        let (_, ready) = w.settle_preparation();
        let wrote = w.position() as usize;
        assert!(ready as usize >= wrote, "prepared up to {ready}, wrote {wrote}");
        assert!(
            ready as usize <= wrote + 4 * MIB + 2 * MIB,
            "prepared up to {ready}, wrote {wrote}"
        );
        // Into the next segment, whose first window was ready.
        while w.position() < seg {
            let left = seg as usize - w.position() as usize;
            w.append((8 * MIB).min(left.saturating_sub(16)).max(64), entry)?;
        }
        w.append(1024, entry)?;
        assert_eq!(log.segments().len(), 2);
        let (_, ready) = w.settle_preparation();
        assert!(ready >= w.position(), "prepared up to {ready}");
        assert!(
            ready as usize <= seg as usize + 4 * MIB + 2 * MIB,
            "prepared up to {ready}"
        );
        // Near this segment's end the third is made ahead; a writer dropped
        // then (a replica restarting or cutting its log) leaves no file
        // past its log, which the next open would take for a gap.
        while w.position() < 2 * seg - 8 * MIB as u64 {
            w.append(8 * MIB - 64, entry)?;
        }
        let _ = w.settle_preparation();
        let count = || std::fs::read_dir(dir.path()).map(|d| d.count()).unwrap_or(0);
        assert_eq!(count(), 3, "the next segment is made ahead");
        w.discard_ahead();
        assert_eq!(count(), 2, "the unused pre-made segment is left behind");
        Ok(())
    }

    /// Sync mode writes the window back once: the pages are on disk (as
    /// zeros) before the writer reaches them, and the data is intact.
    #[test]
    fn sync_mode_preparation_keeps_written_data() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tempdir", "."))?;
        let log = Arc::new(CommitLog::load(dir.path())?);
        let prep = Preparation {
            window: MIB,
            write_back: true,
        };
        let mut w = CommitLogWriter::new(Arc::clone(&log), 0, 8 * MIB as u64, Some(prep))?;
        let mut last = 0;
        for i in 0..3000u32 {
            last = w.append(1024, |buf, _| buf.fill((i % 251) as u8))?;
            log.publish(w.position());
        }
        assert!(w.settle_preparation().0 >= MIB as u64);
        let e = log.read(last, 1024).ok_or(StoreError::ShutDown)?;
        assert!(e.iter().all(|b| *b == (2999 % 251) as u8));
        Ok(())
    }
}

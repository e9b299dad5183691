//! Clean logs of compacted topics (docs/decisions/0003-compacted-topics.md).
//!
//! A compacted topic is written through the CommitLog like any other. A
//! compaction pass (policy in the broker crate: which records survive)
//! copies the survivors of a queue's range `[start, end)` into that queue's
//! clean log, and from then on reads below `end` are served from it:
//!
//! ```text
//! compacted/<topic>/COMPACT             the topic is compacted (retention holds
//!                                       the CommitLog segments of its dirty range)
//! compacted/<topic>/<queue>/state.json  {"generation": g, "end": e}: the switch point
//! compacted/<topic>/<queue>/clean.<g>   survivors, in the store's own entry formats
//! compacted/<topic>/<queue>/index.<g>   one 48-byte ConsumeQueue entry per survivor
//!                                       (position = where it lies in clean.<g>)
//! ```
//!
//! Survivors keep their offsets (a Kafka batch keeps its records' offsets;
//! the offsets of removed records become gaps, as after Kafka's cleaner), so
//! committed offsets and positions stay valid. A pass writes and fsyncs the
//! next generation's files, then replaces `state.json` atomically: a crash
//! before that leaves the previous generation in force (the new files are
//! removed when the store opens), after it the new one. Readers holding the
//! previous generation keep reading its still-mapped files.
#![allow(unsafe_code)]

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::consume_queue::{ConsumeQueue, CqEntry, ENTRY_SIZE};
use crate::error::{Result, StoreError};

/// Marker file: the topic is compacted.
pub(crate) const MARKER: &str = "COMPACT";
const STATE: &str = "state.json";

#[derive(Debug, Serialize, Deserialize)]
struct State {
    generation: u64,
    /// Offsets below come from the clean log.
    end: u64,
    /// The queue's first offset when the generation was written.
    start: u64,
}

/// One queue's clean log: the survivors of `[start, end)`.
pub struct CleanLog {
    generation: u64,
    end: u64,
    start: AtomicU64,
    data: Bytes,
    index: Vec<CqEntry>,
}

impl std::fmt::Debug for CleanLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CleanLog")
            .field("generation", &self.generation)
            .field("start", &self.start())
            .field("end", &self.end)
            .field("entries", &self.index.len())
            .finish()
    }
}

impl CleanLog {
    /// Offsets below this are served from the clean log.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The queue's first readable offset.
    pub fn start(&self) -> u64 {
        self.start.load(Ordering::Acquire)
    }

    pub(crate) fn raise_start(&self, offset: u64) {
        self.start.fetch_max(offset, Ordering::AcqRel);
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Checks every surviving entry (CRCs, and that it is the record of its
    /// topic, queue and offset); the problems found.
    pub(crate) fn verify(&self, topic: &str, queue_id: u32) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.index {
            let (from, to) = (e.phys_offset as usize, e.phys_offset as usize + e.size as usize);
            let why = match crate::record::verify_entry(&self.data[from..to]) {
                Err(err) => err.to_string(),
                Ok(r) if r.topic != topic.as_bytes() || r.queue_id != queue_id => {
                    format!("belongs to {}/{}", String::from_utf8_lossy(r.topic), r.queue_id)
                }
                Ok(r) if r.queue_offset != e.base_offset => format!("records offset {}", r.queue_offset),
                Ok(_) => continue,
            };
            out.push(format!(
                "clean log {topic}/{queue_id} generation {}: entry for offset {} at {}: {why}",
                self.generation, e.base_offset, e.phys_offset
            ));
        }
        out
    }

    /// Surviving entries.
    pub fn entry_count(&self) -> usize {
        self.index.len()
    }

    /// Bytes of surviving entries.
    pub fn bytes(&self) -> u64 {
        self.data.len() as u64
    }

    /// Surviving entries covering offsets at or after `offset` (whole
    /// entries; at least one if any), with their bytes.
    pub(crate) fn read(&self, offset: u64, max_offsets: u32, max_bytes: usize) -> Vec<crate::ReadEntry> {
        let offset = offset.max(self.start());
        let first = self.index.partition_point(|e| e.end_offset() <= offset);
        let mut out = Vec::new();
        let (mut offsets, mut bytes) = (0u64, 0usize);
        for e in &self.index[first..] {
            if !out.is_empty() && (offsets >= u64::from(max_offsets) || bytes + e.size as usize > max_bytes) {
                break;
            }
            let (from, len) = (e.phys_offset as usize, e.size as usize);
            let Some(end) = from.checked_add(len).filter(|end| *end <= self.data.len()) else {
                break; // checked at load; never past the file
            };
            offsets += e.end_offset() - offset.max(e.base_offset);
            bytes += len;
            out.push(crate::ReadEntry {
                cq: *e,
                data: self.data.slice(from..end),
            });
        }
        out
    }

    /// Loads the generation `state.json` names (None if the queue has no
    /// clean log) and removes files of other generations (a pass that
    /// crashed before its switch, or one already replaced).
    pub(crate) fn load(dir: &Path) -> Result<Option<CleanLog>> {
        CleanLog::open(dir, true)
    }

    /// As [`CleanLog::load`]; `tidy` = false changes nothing on disk
    /// (`rokka store check`).
    pub(crate) fn open(dir: &Path, tidy: bool) -> Result<Option<CleanLog>> {
        let state_path = dir.join(STATE);
        let state: Option<State> = match std::fs::read(&state_path) {
            Ok(b) => Some(
                serde_json::from_slice(&b)
                    .map_err(|e| StoreError::bad_file(&state_path, format!("not valid JSON: {e}")))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(StoreError::io("read", &state_path)(e)),
        };
        let keep = state.as_ref().map(|s| s.generation);
        for item in std::fs::read_dir(dir).map_err(StoreError::io("read dir", dir))? {
            let item = item.map_err(StoreError::io("read dir", dir))?;
            let name = item.file_name();
            let name = name.to_str().unwrap_or("");
            let generation = name
                .strip_prefix("clean.")
                .or_else(|| name.strip_prefix("index."))
                .and_then(|g| g.parse::<u64>().ok());
            match generation {
                Some(g) if Some(g) != keep && tidy => {
                    std::fs::remove_file(item.path()).map_err(StoreError::io("remove", item.path()))?;
                }
                Some(_) => {}
                None if name == STATE || name == "state.tmp" => {}
                None => return Err(StoreError::bad_file(item.path(), "not a file the store writes")),
            }
        }
        let Some(state) = state else {
            return Ok(None);
        };
        let data_path = dir.join(format!("clean.{}", state.generation));
        let index_path = dir.join(format!("index.{}", state.generation));
        let data = map(&data_path)?;
        let raw = std::fs::read(&index_path).map_err(StoreError::io("read", &index_path))?;
        if raw.len() % ENTRY_SIZE != 0 {
            return Err(StoreError::bad_file(&index_path, "length is not a multiple of 48"));
        }
        let mut index = Vec::with_capacity(raw.len() / ENTRY_SIZE);
        let mut prev: Option<CqEntry> = None;
        for chunk in raw.chunks_exact(ENTRY_SIZE) {
            let mut b = [0u8; ENTRY_SIZE];
            b.copy_from_slice(chunk);
            let e = CqEntry::decode(&b);
            let in_file = (e.phys_offset as usize)
                .checked_add(e.size as usize)
                .is_some_and(|end| end <= data.len());
            let ordered = prev.is_none_or(|p| p.end_offset() <= e.base_offset);
            if !in_file || !ordered || e.count == 0 || e.end_offset() > state.end {
                return Err(StoreError::bad_file(
                    &index_path,
                    format!("entry for offset {} does not fit the clean log", e.base_offset),
                ));
            }
            prev = Some(e);
            index.push(e);
        }
        Ok(Some(CleanLog {
            generation: state.generation,
            end: state.end,
            start: AtomicU64::new(state.start),
            data,
            index,
        }))
    }
}

fn map(path: &Path) -> Result<Bytes> {
    let f = File::open(path).map_err(StoreError::io("open", path))?;
    let len = f.metadata().map_err(StoreError::io("stat", path))?.len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the file is written once, fsynced before `state.json` names
    // it, and never written again (a later pass writes a new generation).
    let m = unsafe { memmap2::Mmap::map(&f) }.map_err(StoreError::io("map", path))?;
    Ok(Bytes::from_owner(m))
}

/// Writes the next generation of one queue's clean log.
pub struct CleanWriter {
    dir: PathBuf,
    data_path: PathBuf,
    generation: u64,
    start: u64,
    data: BufWriter<File>,
    index: Vec<CqEntry>,
    pos: u64,
}

impl CleanWriter {
    pub(crate) fn create(dir: PathBuf, generation: u64, start: u64) -> Result<CleanWriter> {
        std::fs::create_dir_all(&dir).map_err(StoreError::io("create dir", &dir))?;
        let data_path = dir.join(format!("clean.{generation}"));
        let f = File::create(&data_path).map_err(StoreError::io("create", &data_path))?;
        Ok(CleanWriter {
            dir,
            data_path,
            generation,
            start,
            data: BufWriter::with_capacity(1 << 20, f),
            index: Vec::new(),
            pos: 0,
        })
    }

    /// The queue's first offset this generation keeps.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Appends one surviving entry: `data` is a whole stored entry (as
    /// read, or re-encoded with fewer records), `cq` its ConsumeQueue
    /// entry (base offset and count of the stored entry). Entries come in
    /// offset order.
    pub fn push(&mut self, data: &[u8], cq: &CqEntry) -> Result<()> {
        if let Some(p) = self.index.last() {
            if cq.base_offset < p.end_offset() {
                return Err(StoreError::Config(format!(
                    "clean log entries out of order: {} after {}",
                    cq.base_offset,
                    p.end_offset()
                )));
            }
        }
        self.data
            .write_all(data)
            .map_err(StoreError::io("write", &self.data_path))?;
        self.index.push(CqEntry {
            phys_offset: self.pos,
            size: data.len() as u32,
            ..*cq
        });
        self.pos += data.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.pos
    }

    /// Makes the generation's files durable (data, then index); nothing
    /// reads them until [`Sealed::switch`].
    pub(crate) fn seal(self) -> Result<Sealed> {
        let index_path = self.dir.join(format!("index.{}", self.generation));
        let f = self
            .data
            .into_inner()
            .map_err(|e| StoreError::io("write", &self.data_path)(e.into_error()))?;
        crate::fault::check("clean_log_sync").map_err(StoreError::io("fsync", &self.data_path))?;
        f.sync_all().map_err(StoreError::io("fsync", &self.data_path))?;
        let mut raw = Vec::with_capacity(self.index.len() * ENTRY_SIZE);
        for e in &self.index {
            raw.extend_from_slice(&e.encode());
        }
        let mut idx = File::create(&index_path).map_err(StoreError::io("create", &index_path))?;
        idx.write_all(&raw).map_err(StoreError::io("write", &index_path))?;
        idx.sync_all().map_err(StoreError::io("fsync", &index_path))?;
        Ok(Sealed {
            dir: self.dir,
            generation: self.generation,
            start: self.start,
        })
    }
}

/// A generation on disk, not yet in force.
pub(crate) struct Sealed {
    dir: PathBuf,
    generation: u64,
    start: u64,
}

impl Sealed {
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Puts the generation in force: `state.json` is replaced atomically
    /// (a crash before leaves the previous one), then it is loaded.
    pub(crate) fn switch(self, end: u64) -> Result<CleanLog> {
        let state = State {
            generation: self.generation,
            end,
            start: self.start,
        };
        let json = serde_json::to_vec(&state).map_err(|e| StoreError::bad_file(self.dir.join(STATE), e.to_string()))?;
        crate::checkpoint::write_atomically(&self.dir.join(STATE), &json)?;
        let log = CleanLog::load(&self.dir)?;
        log.ok_or_else(|| StoreError::bad_file(self.dir.join(STATE), "missing right after it was written"))
    }
}

/// `compacted/<topic>` under the data directory.
pub(crate) fn topic_dir(root: &Path, topic: &str) -> PathBuf {
    root.join("compacted").join(topic)
}

/// Generation number after the queue's current one.
pub(crate) fn next_generation(current: Option<&Arc<CleanLog>>) -> u64 {
    current.map_or(1, |c| c.generation + 1)
}

/// Loads `compacted/`: which topics are compacted, and each queue's clean
/// log, attached to its ConsumeQueue (made if the queue has none left).
pub(crate) fn load_all(
    root: &Path,
    queues: &mut HashMap<Arc<str>, HashMap<u32, Arc<ConsumeQueue>>>,
    entries_per_file: u32,
) -> Result<BTreeSet<String>> {
    let mut compacted = BTreeSet::new();
    let dir = root.join("compacted");
    if !dir.exists() {
        return Ok(compacted);
    }
    let cq_root = root.join("consumequeue");
    for t in std::fs::read_dir(&dir).map_err(StoreError::io("read dir", &dir))? {
        let t = t.map_err(StoreError::io("read dir", &dir))?;
        let tpath = t.path();
        let topic = t
            .file_name()
            .to_str()
            .filter(|n| crate::validate_topic(n).is_ok() && tpath.is_dir())
            .map(Arc::<str>::from)
            .ok_or_else(|| StoreError::bad_file(&tpath, "not a topic directory"))?;
        for q in std::fs::read_dir(&tpath).map_err(StoreError::io("read dir", &tpath))? {
            let q = q.map_err(StoreError::io("read dir", &tpath))?;
            let qpath = q.path();
            let name = q.file_name();
            let name = name.to_str().unwrap_or("");
            if name == MARKER {
                compacted.insert(topic.to_string());
                continue;
            }
            let queue_id: u32 = Some(name)
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && qpath.is_dir())
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| StoreError::bad_file(&qpath, "not a queue directory"))?;
            let Some(log) = CleanLog::load(&qpath)? else {
                continue;
            };
            let cq = queues
                .entry(Arc::clone(&topic))
                .or_default()
                .entry(queue_id)
                .or_insert_with(|| {
                    Arc::new(ConsumeQueue::new(
                        &cq_root,
                        Arc::clone(&topic),
                        queue_id,
                        entries_per_file,
                    ))
                });
            cq.set_clean(Some(Arc::new(log)));
        }
    }
    Ok(compacted)
}

/// After recovery: a compacted queue whose ConsumeQueue has no live entry
/// continues after its clean log (its offsets are never handed out again).
pub(crate) fn continue_after_clean(queues: &HashMap<Arc<str>, HashMap<u32, Arc<ConsumeQueue>>>) {
    for q in queues.values().flat_map(|m| m.values()) {
        if let Some(c) = q.clean() {
            q.continue_at(c.end());
        }
    }
}

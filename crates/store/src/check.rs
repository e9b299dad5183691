//! `rokka store check`: verifies a stopped data directory without changing
//! it, and re-appends what recovery saved in `lost+found/`.
//!
//! The check reads every CommitLog entry (size, magic, CRCs, own offset),
//! every ConsumeQueue entry against the record it points at (topic, queue,
//! queue offset, size), the queues' offset contiguity, and each queue's end
//! against both the records the CommitLog holds for it and `queues.json`;
//! and every entry of the compacted topics' clean logs (CRCs, and that it
//! is the record of its topic, queue and offset).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::error::{Result, StoreError};
use crate::manifest::Manifest;
use crate::record::{self, DispatchInfo, Entry, BLANK_MAGIC};
use crate::{parse_file_name, MessageStore};

/// Problems beyond this many per kind are counted, not listed.
const MAX_LISTED: usize = 20;

/// What a check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub segments: usize,
    /// Valid CommitLog entries read.
    pub entries: u64,
    /// End of the last valid entry.
    pub commitlog_end: u64,
    pub queues: usize,
    pub queue_entries: u64,
    /// Entries of compacted topics' clean logs checked.
    pub clean_entries: u64,
    /// Files in `lost+found/` waiting to be re-appended.
    pub lost_found_files: usize,
    /// Each problem found, precisely (file, position, what).
    pub problems: Vec<String>,
    /// Problems found but not listed (over [`MAX_LISTED`] of a kind).
    pub unlisted: u64,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.unlisted == 0
    }

    fn problem(&mut self, listed: &mut usize, p: String) {
        if *listed < MAX_LISTED {
            self.problems.push(p);
            *listed += 1;
        } else {
            self.unlisted += 1;
        }
    }
}

struct Segment {
    start: u64,
    len: u64,
    file: File,
    path: PathBuf,
}

fn segments(dir: &Path) -> Result<Vec<Segment>> {
    let cl = dir.join("commitlog");
    let mut out = Vec::new();
    if !cl.exists() {
        return Ok(out);
    }
    for item in std::fs::read_dir(&cl).map_err(StoreError::io("read dir", &cl))? {
        let item = item.map_err(StoreError::io("read dir", &cl))?;
        let path = item.path();
        let start = parse_file_name(&item.file_name())
            .ok_or_else(|| StoreError::bad_file(&path, "not a CommitLog segment name (20 digits)"))?;
        let file = File::open(&path).map_err(StoreError::io("open", &path))?;
        let len = file.metadata().map_err(StoreError::io("stat", &path))?.len();
        out.push(Segment { start, len, file, path });
    }
    out.sort_by_key(|s| s.start);
    Ok(out)
}

fn read_at(seg: &Segment, rel: u64, len: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; len];
    seg.file.read_exact_at(&mut b, rel).ok()?;
    Some(b)
}

/// The entry at CommitLog offset `phys` of `size` bytes, decoded and checked.
fn entry_at(segs: &[Segment], phys: u64, size: u32) -> std::result::Result<Entry, String> {
    let i = segs
        .partition_point(|s| s.start <= phys)
        .checked_sub(1)
        .ok_or("before the CommitLog")?;
    let seg = &segs[i];
    let rel = phys - seg.start;
    if rel + u64::from(size) > seg.len {
        return Err("past its segment's end".into());
    }
    let b = read_at(seg, rel, size as usize).ok_or("unreadable")?;
    let e = record::decode_checked(&Bytes::from(b)).map_err(|e| e.to_string())?;
    if e.phys_offset() != phys {
        return Err(format!("the record there says it is at {}", e.phys_offset()));
    }
    Ok(e)
}

/// Checks the data directory `dir` of a stopped store. Refuses (an error)
/// if a running store holds it.
pub fn check_dir(dir: &Path, max_entry: usize) -> Result<CheckReport> {
    if !dir.join("commitlog").exists() {
        return Err(StoreError::Config(format!(
            "{} holds no store (no commitlog directory)",
            dir.display()
        )));
    }
    // Held for the check: no store may start on the directory meanwhile.
    let _lock = crate::recovery::lock(dir)?;
    let mut r = CheckReport::default();
    let segs = segments(dir)?;
    r.segments = segs.len();
    let manifest = Manifest::load(dir).unwrap_or_default();

    // 1. The CommitLog, entry by entry; what each queue's records reach.
    let mut reach: HashMap<(String, u32), u64> = HashMap::new();
    let mut listed = 0;
    let mut pos = segs.first().map_or(0, |s| s.start);
    'segs: for (i, seg) in segs.iter().enumerate() {
        if i > 0 && segs[i - 1].start + segs[i - 1].len != seg.start {
            r.problem(
                &mut listed,
                format!(
                    "{}: starts at {} but the previous segment ends at {}",
                    seg.path.display(),
                    seg.start,
                    segs[i - 1].start + segs[i - 1].len
                ),
            );
        }
        if pos < seg.start {
            pos = seg.start;
        }
        loop {
            let rel = pos - seg.start;
            if rel + 8 > seg.len {
                continue 'segs;
            }
            let Some(head) = read_at(seg, rel, 8) else {
                r.problem(&mut listed, format!("{}: unreadable at {rel}", seg.path.display()));
                break 'segs;
            };
            let size = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as u64;
            let magic = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            if size == 0 && magic == 0 {
                break 'segs; // the end
            }
            if magic == BLANK_MAGIC && size == seg.len - rel {
                pos = seg.start + seg.len;
                continue 'segs;
            }
            if size < 8 || size as usize > max_entry || rel + size > seg.len {
                r.problem(
                    &mut listed,
                    format!(
                        "{} at {rel} (CommitLog offset {pos}): entry size {size} out of range",
                        seg.path.display()
                    ),
                );
                break 'segs;
            }
            match entry_at(&segs, pos, size as u32) {
                Ok(e) => {
                    let info = DispatchInfo::from_entry(&e);
                    let topic = e.topic_str().to_string();
                    let deleted = manifest.deleted.get(&topic).is_some_and(|d| pos < *d);
                    if info.consumable && !deleted {
                        let end = info.queue_offset + u64::from(info.count);
                        let v = reach.entry((topic, info.queue_id)).or_insert(0);
                        *v = (*v).max(end);
                    }
                    r.entries += 1;
                    pos += size;
                }
                Err(why) => {
                    r.problem(
                        &mut listed,
                        format!(
                            "{} at {rel} (CommitLog offset {pos}): damaged entry: {why}",
                            seg.path.display()
                        ),
                    );
                    break 'segs;
                }
            }
        }
    }
    r.commitlog_end = pos;

    // 2. Every ConsumeQueue entry against its record.
    let mut listed = 0;
    let mut ends: BTreeMap<(String, u32), u64> = BTreeMap::new();
    let root = dir.join("consumequeue");
    let topics = if root.exists() {
        std::fs::read_dir(&root)
            .map_err(StoreError::io("read dir", &root))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(StoreError::io("read dir", &root))?
    } else {
        Vec::new()
    };
    for t in topics {
        let topic = t.file_name().to_string_lossy().into_owned();
        let tdir = t.path();
        for q in std::fs::read_dir(&tdir).map_err(StoreError::io("read dir", &tdir))? {
            let q = q.map_err(StoreError::io("read dir", &tdir))?;
            let Some(qid) = q.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                r.problem(&mut listed, format!("{}: not a queue directory", q.path().display()));
                continue;
            };
            r.queues += 1;
            let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(q.path())
                .map_err(StoreError::io("read dir", q.path()))?
                .filter_map(|f| f.ok())
                .filter_map(|f| parse_file_name(&f.file_name()).map(|n| (n, f.path())))
                .collect();
            files.sort();
            let mut expect: Option<u64> = None;
            let mut end = 0u64;
            'files: for (_, path) in &files {
                let data = std::fs::read(path).map_err(StoreError::io("read", path))?;
                for (k, raw) in data.chunks_exact(48).enumerate() {
                    let u64at = |a: usize| u64::from_be_bytes(raw[a..a + 8].try_into().unwrap_or([0; 8]));
                    let phys = u64at(0);
                    let size = u32::from_be_bytes(raw[8..12].try_into().unwrap_or([0; 4]));
                    let count = u32::from_be_bytes(raw[12..16].try_into().unwrap_or([0; 4]));
                    let base = u64at(16);
                    if size == 0 {
                        break 'files; // the queue's end
                    }
                    r.queue_entries += 1;
                    let at = format!("{}/{qid} entry {k} of {} (offset {base})", topic, path.display());
                    if let Some(want) = expect {
                        if base != want {
                            r.problem(&mut listed, format!("{at}: offsets jump from {want} to {base}"));
                        }
                    }
                    expect = Some(base + u64::from(count.max(1)));
                    end = base + u64::from(count.max(1));
                    if phys < segs.first().map_or(0, |s| s.start) {
                        continue; // deleted by retention; the queue's start moves at open
                    }
                    match entry_at(&segs, phys, size) {
                        Ok(e) if e.topic_str() != topic || e.queue_id() != qid => r.problem(
                            &mut listed,
                            format!(
                                "{at}: points at a record of {}/{} (CommitLog offset {phys})",
                                e.topic_str(),
                                e.queue_id()
                            ),
                        ),
                        Ok(e) if e.queue_offset() != base => r.problem(
                            &mut listed,
                            format!(
                                "{at}: points at the record of offset {} (CommitLog offset {phys})",
                                e.queue_offset()
                            ),
                        ),
                        Ok(_) => {}
                        Err(why) => r.problem(&mut listed, format!("{at}: CommitLog offset {phys}: {why}")),
                    }
                }
            }
            ends.insert((topic.clone(), qid), end);
        }
    }

    // 3. Queue ends against the records and the manifest.
    let mut listed = 0;
    for ((topic, q), reached) in &reach {
        let end = ends.get(&(topic.clone(), *q)).copied().unwrap_or(0);
        if end < *reached {
            r.problem(
                &mut listed,
                format!("{topic}/{q}: the CommitLog holds records up to offset {reached} but the ConsumeQueue ends at {end} (hidden messages; a restart rebuilds it)"),
            );
        }
    }
    for (key, want) in &manifest.queues {
        let Some((topic, q)) = Manifest::parse_key(key) else {
            continue;
        };
        if manifest.deleted.contains_key(topic) {
            continue;
        }
        let end = ends.get(&(topic.to_string(), q)).copied().unwrap_or(0);
        if end < *want {
            r.problem(
                &mut listed,
                format!("{key}: the ConsumeQueue ends at {end}, the last checkpoint recorded {want}"),
            );
        }
    }
    // 4. Clean logs of compacted topics.
    let mut listed = 0;
    let compacted = dir.join("compacted");
    if compacted.exists() {
        for t in std::fs::read_dir(&compacted).map_err(StoreError::io("read dir", &compacted))? {
            let t = t.map_err(StoreError::io("read dir", &compacted))?;
            let topic = t.file_name().to_string_lossy().into_owned();
            if !t.path().is_dir() {
                continue;
            }
            for q in std::fs::read_dir(t.path()).map_err(StoreError::io("read dir", t.path()))? {
                let q = q.map_err(StoreError::io("read dir", t.path()))?;
                let Some(qid) = q.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                match crate::compacted::CleanLog::open(&q.path(), false) {
                    Ok(Some(log)) => {
                        r.clean_entries += log.entry_count() as u64;
                        for p in log.verify(&topic, qid) {
                            r.problem(&mut listed, p);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => r.problem(&mut listed, e.to_string()),
                }
            }
        }
    }
    let lf = dir.join("lost+found");
    if lf.exists() {
        r.lost_found_files = std::fs::read_dir(&lf)
            .map_err(StoreError::io("read dir", &lf))?
            .filter_map(|f| f.ok())
            .filter(|f| parse_file_name(&f.file_name()).is_some())
            .count();
    }
    Ok(r)
}

/// What re-appending `lost+found/` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reappended {
    pub files: usize,
    /// Entries appended again (each to its topic and queue, at new offsets).
    pub entries: u64,
    /// Bytes of each file that held no valid entry.
    pub skipped_bytes: u64,
}

/// Re-appends every valid entry saved in `lost+found/` to its topic and
/// queue (new offsets; the cut log gave their old ones away), then renames
/// each file `<name>.reappended` so it is never appended twice.
pub fn reappend_lost_found(store: &MessageStore) -> Result<Reappended> {
    let lf = store.config().data_dir.join("lost+found");
    let mut out = Reappended::default();
    if !lf.exists() {
        return Ok(out);
    }
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(&lf)
        .map_err(StoreError::io("read dir", &lf))?
        .filter_map(|f| f.ok())
        .filter_map(|f| parse_file_name(&f.file_name()).map(|n| (n, f.path())))
        .collect();
    files.sort();
    for (base, path) in files {
        let data = Bytes::from(std::fs::read(&path).map_err(StoreError::io("read", &path))?);
        let mut p = 0usize;
        while p + 8 <= data.len() {
            let size = u32::from_be_bytes([data[p], data[p + 1], data[p + 2], data[p + 3]]) as usize;
            let valid = (8..=data.len() - p).contains(&size)
                && matches!(record::decode_checked(&data.slice(p..p + size)), Ok(e) if e.phys_offset() == base + p as u64);
            if !valid {
                p += 1;
                out.skipped_bytes += 1;
                continue;
            }
            match record::decode_checked(&data.slice(p..p + size)) {
                Ok(Entry::Message(m)) => {
                    let topic = m.topic_str().to_string();
                    let props = m.properties.clone();
                    store.append_message(&m.as_input(&topic, m.queue_id, &props[..]))?;
                }
                Ok(Entry::KafkaBatch(k)) => {
                    let topic = k.topic_str().to_string();
                    store.append_kafka_batch(&topic, k.queue_id, &k.batch)?;
                }
                Err(_) => {}
            }
            out.entries += 1;
            p += size;
        }
        out.skipped_bytes += (data.len() - p) as u64;
        // What was appended is on disk before the file is marked done (a
        // power loss after the rename lost the entries for good).
        store.checkpoint()?;
        let done = path.with_file_name(format!("{}.reappended", crate::file_name(base)));
        std::fs::rename(&path, &done).map_err(StoreError::io("rename", &path))?;
        out.files += 1;
        tracing::info!(file = %path.display(), "lost+found file re-appended");
    }
    Ok(out)
}

//! Opening the store: checking the data directory, then either trusting a
//! clean checkpoint (no scan) or recovering after an unclean stop.
//!
//! After an unclean stop (abort marker present, or no usable checkpoint):
//! 1. ConsumeQueues lose entries at or past the checkpoint's safe offset, and
//!    the index goes back to its checkpointed state (both were on disk up to
//!    there).
//! 2. The CommitLog is scanned from the safe offset (from its start when the
//!    checkpoint is missing or damaged), checking size, magic, CRC and each
//!    entry's own offset; every valid entry is re-dispatched.
//! 3. A torn or corrupt tail past the safe offset is zeroed. Damage *below*
//!    the safe offset, or valid data after the damage, is not a torn write:
//!    the store refuses to start with an error naming the file, rather than
//!    drop acknowledged data.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Instant;

use tokio::sync::watch;

use crate::checkpoint::{Checkpoint, Loaded};
use crate::commitlog::{self, CommitLog, CommitLogWriter};
use crate::config::StoreConfig;
use crate::consume_queue::ConsumeQueue;
use crate::error::{Result, StoreError};
use crate::index::IndexService;
use crate::metrics::StoreMetrics;
use crate::offsets::ConsumerOffsets;
use crate::record::{DispatchInfo, Entry};
use crate::store::{FlushRequests, FlushSync, Inner, MessageStore, RecoveryReport, Writer};
use crate::validate_topic;

/// Names the store may find at the top of its data directory.
const KNOWN_TOP_LEVEL: &[&str] = &[
    "commitlog",
    "compacted",
    "consumequeue",
    "index",
    "checkpoint",
    "checkpoint.tmp",
    "abort",
    "lock",
    "offsets.json",
    "offsets.tmp",
    "log_starts.json",
    "log_starts.tmp",
    crate::manifest::FILE,
    "queues.tmp",
    "config",
    "lost+found",
    DAMAGED,
    crate::replication::EPOCHS_FILE,
    "epochs.tmp",
    crate::replication::RESTART_MARKER,
    "restarting.tmp",
    crate::replication::CUT_MARKER,
];

pub(crate) fn open(config: StoreConfig) -> Result<MessageStore> {
    config.validate()?;
    let started = Instant::now();
    let dir = config.data_dir.clone();
    std::fs::create_dir_all(&dir).map_err(StoreError::io("create dir", &dir))?;
    let lock_file = lock(&dir)?;
    check_top_level(&dir)?;
    crate::replication::finish_restart(&dir)?;

    let abort = dir.join("abort");
    let had_abort = abort.exists();
    let cp = match Checkpoint::load(&dir.join("checkpoint"))? {
        Loaded::Ok(c) => Some(c),
        Loaded::Missing => None,
        Loaded::Damaged(why) => {
            tracing::warn!(path = %dir.join("checkpoint").display(), why, "checkpoint damaged: falling back to a full scan");
            None
        }
    };
    let log = Arc::new(CommitLog::load(&dir.join("commitlog"))?);
    let mut manifest = crate::manifest::Manifest::load(&dir);
    // A cut of the log (a replica following a master whose history
    // diverged) that a crash interrupted: finished before recovering. The
    // checkpoint and manifest may still speak of queues past the cut.
    let interrupted_cut = crate::replication::cut_marker(&dir)?;
    let cp = match (interrupted_cut, cp) {
        (Some(at), cp) => {
            tracing::warn!(at, "finishing a cut of the CommitLog a crash interrupted");
            crate::commitlog::zero_tail(&log, at)?;
            log.drop_segments_after(at)?;
            crate::replication::drop_epochs_after(&dir, at)?;
            if let Some(m) = manifest.as_mut() {
                m.queues.clear();
                // Tombstones past the cut: as of the cut (as the cut itself
                // lowers them).
                for end in m.deleted.values_mut() {
                    *end = (*end).min(at);
                }
            }
            cp.map(|c| Checkpoint {
                safe_offset: c.safe_offset.min(at),
                clean: false,
                ..c
            })
        }
        (None, cp) => cp,
    };
    let deleted = manifest.as_ref().map(|m| m.deleted.clone()).unwrap_or_default();
    let rebuild_marker = dir.join(DAMAGED).join(REBUILD_MARKER);
    let rebuild_unfinished = rebuild_marker.exists();
    let (mut queues, set_aside) = load_queues(&dir, config.consume_queue_entries_per_file)?;
    finish_deletes(&dir, &deleted, &mut queues)?;
    let compacted = crate::compacted::load_all(&dir, &mut queues, config.consume_queue_entries_per_file)?;
    let mut index = if config.index_enabled {
        Some(
            IndexService::load(&dir.join("index"), config.index_slots, config.index_entries)?
                .with_max_keys(config.index_max_keys_per_message),
        )
    } else {
        None
    };
    // Entries the log may hold: bounded by the segment (an entry never
    // spans two), not by today's `max_message_bytes` — lowered since, it
    // would read larger records already written as damage and cut them.
    let max_entry = config.max_stored_entry();

    let clean_end = match &cp {
        Some(c) if c.clean && !had_abort => verify_clean_end(&log, c, max_entry),
        _ => None,
    };
    let (end, report) = match clean_end {
        Some(end) => {
            tracing::info!(end, "clean shutdown: no recovery scan");
            (
                end,
                RecoveryReport {
                    clean: true,
                    ..RecoveryReport::default()
                },
            )
        }
        None => {
            // A clean checkpoint whose last record fails its check: the
            // damage is inside what the checkpoint calls durable, so a scan
            // from it would find nothing. Scan everything instead.
            let clean_but_damaged = cp.as_ref().is_some_and(|c| c.clean && !had_abort);
            if clean_but_damaged {
                tracing::error!("the last record of a clean stop fails its check: full recovery scan");
            }
            recover(
                &log,
                &mut queues,
                (&dir.join("consumequeue"), config.consume_queue_entries_per_file),
                index.as_mut(),
                cp.as_ref().filter(|_| !clean_but_damaged),
                max_entry,
                &deleted,
            )?
        }
    };
    // Every queue must reach the end the last checkpoint recorded for it;
    // one that does not (zeroed entries, a deleted directory) would hide
    // messages and hand out their offsets again: rebuild from the CommitLog.
    crate::compacted::continue_after_clean(&queues);
    let mut short = manifest.as_ref().map_or_else(Vec::new, |m| short_queues(m, &queues));
    // A queue set aside is rebuilt even with no manifest to miss it by
    // (and counted once, not again as missing).
    short.retain(|why| !set_aside.iter().any(|(key, _)| why.starts_with(&format!("{key}: "))));
    short.extend(set_aside.into_iter().map(|(_, why)| why));
    // (Queues the rebuild is for: the marker's reason is not one.)
    let queues_short = short.len() as u64;
    if rebuild_unfinished && short.is_empty() {
        short.push("the last rebuild of the ConsumeQueues was cut short: rebuilding again".into());
    }
    let (end, report) = if short.is_empty() {
        (end, report)
    } else {
        for why in &short {
            tracing::error!(problem = %why, "ConsumeQueue damaged or missing");
        }
        tracing::error!(queues = short.len(), "rebuilding every ConsumeQueue from the CommitLog");
        let (end2, mut r) = recover(
            &log,
            &mut queues,
            (&dir.join("consumequeue"), config.consume_queue_entries_per_file),
            index.as_mut(),
            None,
            max_entry,
            &deleted,
        )?;
        r.queues_rebuilt = queues_short;
        crate::compacted::continue_after_clean(&queues);
        let still = manifest.as_ref().map_or_else(Vec::new, |m| short_queues(m, &queues));
        if let Some(why) = still.first() {
            return Err(StoreError::bad_file(
                dir.join(crate::manifest::FILE),
                format!("after a rebuild from the CommitLog {why}: records are missing from the CommitLog itself"),
            ));
        }
        (end2, r)
    };
    // Pre-allocated segments past the end (empty by construction: recovery
    // checked that no valid entry starts them) are dropped; the allocator
    // makes them again.
    log.drop_segments_after(end)?;
    // After a crash what was written past the checkpoint may still be only
    // in the page cache the killed process left (the scan read it from
    // there): written back now, before anything — the open's checkpoint,
    // a sync-mode reader, a replica — takes it as on disk.
    if !report.clean {
        let from = cp.as_ref().map_or(0, |c| c.safe_offset).min(end);
        log.sync_range(from, end)?;
    }
    log.set_recovered(end);
    let min = log.min_offset();
    for q in queues.values().flat_map(|m| m.values()) {
        q.advance_min(min)?;
    }

    let log_starts = load_log_starts(&dir.join("log_starts.json"))?;
    for (key, start) in &log_starts {
        if let Some((t, q)) = key.rsplit_once('/') {
            if let Some(cq) = q
                .parse::<u32>()
                .ok()
                .and_then(|q| queues.get(t).and_then(|m| m.get(&q)))
            {
                cq.raise_min_offset(*start);
            }
        }
    }

    let mut cl = CommitLogWriter::new(
        Arc::clone(&log),
        end,
        config.commitlog_segment_bytes,
        crate::commitlog::Preparation::of(&config),
    )?;
    cl.refuse_writes_above(config.disk_refuse_writes_percent);
    let writer = Writer {
        cl,
        queues: queues.clone(),
        last_store_ts: 0,
        // The scan's last entry, else the checkpoint's: a clean stop right
        // after a recovery must name the record the log really ends with,
        // or the next start scans everything again.
        last_record: report
            .last_record
            .unwrap_or_else(|| cp.as_ref().map_or(0, |c| c.last_record_offset)),
    };
    let offsets = ConsumerOffsets::load(&dir.join("offsets.json"))?;
    offsets.set_max_entries(config.max_committed_offsets);
    offsets.set_max_bytes(config.max_committed_offset_bytes);
    // After a recovery that rebuilt anything (a crash can lose an async
    // tail, a scan can cut a torn one), committed offsets and delay/timer
    // progress (same table) past their queue's recovered end are pulled back
    // to it, so consumers read what is written there next instead of
    // skipping it. A clean start leaves them as committed (Kafka lets a
    // client commit past the end; its reset policy handles that).
    let mut clamped = 0u64;
    let rebuilt = !report.clean || report.queues_rebuilt > 0;
    for (group, topic, q, committed) in offsets.all().into_iter().filter(|_| rebuilt) {
        let Some(end) = queues
            .get(topic.as_str())
            .and_then(|m| m.get(&q))
            .map(|cq| cq.max_offset())
        else {
            continue;
        };
        if committed > end {
            let meta = offsets.get(&group, &topic, q).map(|o| o.metadata).unwrap_or_default();
            offsets.commit(&group, &topic, q, end, &meta);
            clamped += 1;
        }
    }
    if clamped > 0 {
        tracing::warn!(clamped, "committed offsets past their queue's end pulled back to it");
        metrics::counter!("rokka_store_offsets_clamped_total").increment(clamped);
    }
    let metrics = StoreMetrics::new();
    let inner = Arc::new(Inner {
        dir: dir.clone(),
        log,
        writer: Mutex::new(writer),
        queues: RwLock::new(queues),
        index: index
            .map(|mut i| {
                // An index that has seen offsets past the log's end: the log
                // was cut (a replica's divergent tail) after they were
                // indexed; what is written there from now on is indexed.
                if i.end_phys().is_some_and(|e| e > end) {
                    i.cut_at(end);
                }
                i
            })
            .map(Mutex::new),
        offsets,
        flush: FlushSync {
            requested: Mutex::new(FlushRequests {
                target: end,
                issued: end,
                ..FlushRequests::default()
            }),
            wake_flusher: Condvar::new(),
        },
        stop: AtomicBool::new(false),
        sleep: (Mutex::new(()), Condvar::new()),
        metrics,
        closed: AtomicBool::new(false),
        _lock_file: lock_file,
        recovery: report,
        // A table read back is a version (1) of its own: one a replica has
        // not said it took (its first fetch says 0).
        log_starts_changes: AtomicU64::new(u64::from(!log_starts.is_empty())),
        log_starts: Mutex::new(log_starts),
        log_starts_written: Mutex::new(0),
        deleted: Mutex::new(deleted),
        flush_listener: std::sync::OnceLock::new(),
        append_listener: std::sync::OnceLock::new(),
        replicated_listener: std::sync::OnceLock::new(),
        watermark_listener: std::sync::OnceLock::new(),
        checkpoint_lock: Mutex::new(()),
        damage_log: crate::LogEvery::new(1000),
        compacted: RwLock::new(compacted),
        compaction_wanted: Mutex::new(Default::default()),
        compaction_lock: Mutex::new(()),
        epochs: Mutex::new(crate::replication::load_epochs(&dir)?),
        hw: std::sync::atomic::AtomicU64::new(u64::MAX),
        leader: AtomicBool::new(true),
        replica_writes_closed: AtomicBool::new(false),
        acked: watch::channel(0).0,
        ack_timeout_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
        too_few_replicas: AtomicBool::new(false),
        in_sync_replicas: std::sync::atomic::AtomicU32::new(1),
        config,
    });
    // The abort marker goes first: from here on the store may take writes,
    // and a stop that does not remove it makes the next start recover.
    // Its content (the pid) is for people; on a full disk an empty marker
    // does the same job (creating it takes no data block).
    let mut f = File::create(&abort).map_err(StoreError::io("create", &abort))?;
    if let Err(e) = writeln!(f, "{}", std::process::id()) {
        tracing::warn!(path = %abort.display(), error = %e, "abort marker left empty");
    }
    f.sync_all().map_err(StoreError::io("fsync", &abort))?;
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io("fsync", &dir))?;
    // Everything recovered is now on disk; record that before accepting
    // writes. A disk with no room left for the checkpoint file does not
    // stop the start (retention may be what frees it, and reads need no
    // room): the last checkpoint stays, so the next start recovers from it
    // again, and the periodic checkpoint tries again.
    match crate::tasks::checkpoint(&inner, false) {
        Ok(_) => {
            // An interrupted cut finished above is checkpointed.
            if interrupted_cut.is_some() {
                crate::replication::remove_cut_marker(&dir)?;
            }
            // The rebuild a set-aside queue called for is checkpointed.
            match std::fs::remove_file(&rebuild_marker) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(StoreError::Io {
                        op: "remove",
                        path: rebuild_marker,
                        source: e,
                    })
                }
            }
        }
        Err(e) if e.is_no_space() && inner.log.failure().is_none() => {
            tracing::warn!(error = %e, "no room for the checkpoint at start: starting on the last one");
            inner.metrics.background_write_failed("checkpoint");
        }
        Err(e) => return Err(e),
    }

    // The epoch history goes no further than the log recovered.
    crate::replication::trim_epochs_past(&inner, inner.log.write_pos())?;
    let threads = crate::tasks::spawn(&inner)?;
    let secs = started.elapsed().as_secs_f64();
    inner.metrics.recovery_seconds.set(secs);
    inner.metrics.segments.set(inner.log.segments().len() as f64);
    tracing::info!(dir = %dir.display(), end, seconds = secs, "store open");
    Ok(MessageStore {
        inner,
        threads: Mutex::new(threads),
    })
}

pub(crate) fn lock(dir: &Path) -> Result<File> {
    let path = dir.join("lock");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(StoreError::io("open", &path))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Locked(dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Io {
            op: "lock",
            path,
            source: e,
        }),
    }
}

/// Where ConsumeQueue directories found damaged at start are moved (kept
/// for a look, never read again): the queues are rebuilt from the CommitLog.
pub(crate) const DAMAGED: &str = "damaged";
/// In `damaged/`, from before a queue is set aside until the rebuild it
/// calls for is checkpointed: a start that finds it rebuilds every
/// ConsumeQueue (the one before was cut short), manifest or not.
const REBUILD_MARKER: &str = "rebuild";

fn check_top_level(dir: &Path) -> Result<()> {
    for item in std::fs::read_dir(dir).map_err(StoreError::io("read dir", dir))? {
        let item = item.map_err(StoreError::io("read dir", dir))?;
        let name = item.file_name();
        if !name.to_str().is_some_and(|n| KNOWN_TOP_LEVEL.contains(&n)) {
            return Err(StoreError::bad_file(item.path(), "not a file the store writes"));
        }
    }
    Ok(())
}

type QueueMap = HashMap<Arc<str>, HashMap<u32, Arc<ConsumeQueue>>>;

/// Every ConsumeQueue under `<dir>/consumequeue`, and the queues whose
/// files were found damaged (a file of the wrong length, a gap, a name the
/// store does not write): those are moved to `<dir>/damaged/` and left out,
/// to be rebuilt from the CommitLog — a ConsumeQueue is derived data, and a
/// store that refused to start over one would keep every queue from its
/// consumers.
fn load_queues(dir: &Path, entries_per_file: u32) -> Result<(QueueMap, Vec<(String, String)>)> {
    let root = dir.join("consumequeue");
    let mut map: QueueMap = HashMap::new();
    let mut set_aside = Vec::new();
    if !root.exists() {
        return Ok((map, set_aside));
    }
    for t in std::fs::read_dir(&root).map_err(StoreError::io("read dir", &root))? {
        let t = t.map_err(StoreError::io("read dir", &root))?;
        let tpath = t.path();
        // A directory that cannot be looked at (EIO, EACCES) is an error,
        // not damage to set aside.
        let is_dir = std::fs::metadata(&tpath)
            .map_err(StoreError::io("stat", &tpath))?
            .is_dir();
        let Some(topic) = t
            .file_name()
            .to_str()
            .filter(|n| validate_topic(n).is_ok() && is_dir)
            .map(Arc::<str>::from)
        else {
            let key = t.file_name().to_string_lossy().into_owned();
            set_aside.push((key, move_damaged(dir, &tpath, "not a topic directory")?));
            continue;
        };
        for q in std::fs::read_dir(&tpath).map_err(StoreError::io("read dir", &tpath))? {
            let q = q.map_err(StoreError::io("read dir", &tpath))?;
            let qpath = q.path();
            let is_dir = std::fs::metadata(&qpath)
                .map_err(StoreError::io("stat", &qpath))?
                .is_dir();
            let Some(queue_id) = q
                .file_name()
                .to_str()
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && is_dir)
                .and_then(|n| n.parse::<u32>().ok())
            else {
                let key = format!("{topic}/{}", q.file_name().to_string_lossy());
                set_aside.push((key, move_damaged(dir, &qpath, "not a queue directory")?));
                continue;
            };
            match ConsumeQueue::load(&root, Arc::clone(&topic), queue_id, entries_per_file) {
                Ok(cq) => {
                    map.entry(Arc::clone(&topic))
                        .or_default()
                        .insert(queue_id, Arc::new(cq));
                }
                Err(StoreError::BadFile { path, reason }) => {
                    let why = format!("{}: {reason}", path.display());
                    let key = crate::manifest::Manifest::key(&topic, queue_id);
                    set_aside.push((key, move_damaged(dir, &qpath, &why)?));
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok((map, set_aside))
}

/// Moves `path` (under `<dir>/consumequeue`) to the same place under
/// `<dir>/damaged/` (a free name: `.1`, `.2`, ... if taken); what happened,
/// for the log and the recovery report (after the queue's key).
fn move_damaged(dir: &Path, path: &Path, why: &str) -> Result<String> {
    // First, what makes a start cut short before the rebuild is
    // checkpointed rebuild again (the queue is gone from consumequeue/).
    let damaged = dir.join(DAMAGED);
    let marker = damaged.join(REBUILD_MARKER);
    if !marker.exists() {
        std::fs::create_dir_all(&damaged).map_err(StoreError::io("create dir", &damaged))?;
        File::create(&marker)
            .and_then(|f| f.sync_all())
            .map_err(StoreError::io("create", &marker))?;
        File::open(&damaged)
            .and_then(|d| d.sync_all())
            .map_err(StoreError::io("fsync", &damaged))?;
    }
    let rel = path.strip_prefix(dir).unwrap_or(path);
    let mut to = dir.join(DAMAGED).join(rel);
    let mut n = 0;
    while to.exists() {
        n += 1;
        to = dir.join(DAMAGED).join(format!("{}.{n}", rel.display()));
    }
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(StoreError::io("create dir", parent))?;
    }
    std::fs::rename(path, &to).map_err(StoreError::io("rename", path))?;
    tracing::error!(from = %path.display(), to = %to.display(), why, "ConsumeQueue damaged: set aside, rebuilt from the CommitLog");
    let key = rel
        .strip_prefix("consumequeue")
        .map(|k| k.display().to_string())
        .unwrap_or_default();
    Ok(format!("{key}: {why} (moved to {})", to.display()))
}

/// After a clean stop: the last record must be intact and end exactly at the
/// checkpointed end. Returns that end, or `None` to fall back to a scan.
fn verify_clean_end(log: &CommitLog, cp: &Checkpoint, max_entry: usize) -> Option<u64> {
    let segs = log.segments();
    let Some(last) = segs.last() else {
        return (cp.safe_offset == 0).then_some(0);
    };
    if cp.safe_offset < segs[0].start || cp.safe_offset > last.end() {
        return None;
    }
    if cp.safe_offset == segs[0].start && cp.last_record_offset == 0 {
        return Some(cp.safe_offset);
    }
    let ok = commitlog::valid_entry_at(log, cp.last_record_offset, max_entry) && {
        let segs = log.segments();
        let seg = segs
            .iter()
            .find(|s| s.start <= cp.last_record_offset && cp.last_record_offset < s.end());
        seg.is_some_and(|s| {
            let size = s.file.read_u32((cp.last_record_offset - s.start) as usize) as u64;
            let end = cp.last_record_offset + size;
            // The clean end is right after the last record, or the next
            // segment's start when that record was followed by a BLANK.
            end == cp.safe_offset || (cp.safe_offset == s.end() && end < s.end())
        })
    };
    if ok {
        Some(cp.safe_offset)
    } else {
        tracing::warn!(
            last_record = cp.last_record_offset,
            end = cp.safe_offset,
            "clean checkpoint does not match the CommitLog: scanning"
        );
        None
    }
}

fn recover(
    log: &CommitLog,
    queues: &mut QueueMap,
    (cq_root, entries_per_file): (&Path, u32),
    mut index: Option<&mut IndexService>,
    cp: Option<&Checkpoint>,
    max_entry: usize,
    deleted: &std::collections::BTreeMap<String, u64>,
) -> Result<(u64, RecoveryReport)> {
    let segs = log.segments();
    let (Some(first), Some(last)) = (segs.first(), segs.last()) else {
        // No CommitLog at all: nothing to rebuild from.
        for q in queues.values().flat_map(|m| m.values()) {
            q.truncate_from_phys(0)?;
        }
        if let Some(idx) = index.as_deref_mut() {
            idx.restore(None)?;
        }
        return Ok((0, RecoveryReport::default()));
    };
    let safe = cp.map(|c| c.safe_offset);
    let start = safe.unwrap_or(first.start).max(first.start);
    if start > last.end() {
        return Err(StoreError::bad_file(
            last.file.path(),
            format!(
                "checkpoint says {start} bytes are durable but the CommitLog ends at {}",
                last.end()
            ),
        ));
    }
    tracing::warn!(from = start, full_scan = safe.is_none(), "unclean shutdown: recovering");
    for q in queues.values().flat_map(|m| m.values()) {
        q.truncate_from_phys(start)?;
    }
    if let Some(idx) = index.as_deref_mut() {
        idx.restore(cp.and_then(|c| c.index))?;
        // A checkpoint written after the log was cut (a replica's divergent
        // tail) may carry an index mark past its safe offset: the records
        // re-dispatched from here are indexed all the same.
        if idx.end_phys().is_some_and(|e| e > start) {
            idx.cut_at(start);
        }
    }
    let mut redispatched = 0u64;
    let mut last_record = None;
    let scan_end = commitlog::scan(log, start, max_entry, |entry, _| {
        let info = DispatchInfo::from_entry(entry);
        last_record = Some(info.phys_offset);
        let (topic, props) = match entry {
            Entry::Message(m) => (m.topic_str(), Some(&m.properties[..])),
            Entry::KafkaBatch(k) => (k.topic_str(), None),
        };
        // A record of a topic deleted after it was written stays deleted.
        if deleted.get(topic).is_some_and(|d| info.phys_offset < *d) {
            return Ok(());
        }
        if validate_topic(topic).is_err() {
            return Err(StoreError::bad_file(
                log.dir(),
                format!("record at {} names an invalid topic {topic:?}", info.phys_offset),
            ));
        }
        // A queue created just before the crash may have no directory yet.
        let q = Arc::clone(
            queues
                .entry(Arc::from(topic))
                .or_default()
                .entry(info.queue_id)
                .or_insert_with(|| {
                    Arc::new(ConsumeQueue::new(
                        cq_root,
                        Arc::from(topic),
                        info.queue_id,
                        entries_per_file,
                    ))
                }),
        );
        // A queue whose entries all point below the log's first segment
        // (retention deleted what they name, and a power loss took the
        // entries written after them, past the checkpoint) is continued
        // past the gap: those records are gone, a reader moves on from the
        // queue's new start (as Apache's ConsumeQueue only warns).
        let gap_past_retention = info.queue_offset > q.max_offset()
            && q.entry_count()
                .checked_sub(1)
                .and_then(|i| q.entry(i))
                .is_some_and(|e| e.phys_offset < first.start);
        if gap_past_retention {
            tracing::warn!(
                topic,
                queue = info.queue_id,
                from = q.max_offset(),
                to = info.queue_offset,
                "queue entries lost past records retention deleted: the queue continues past the gap"
            );
        }
        if info.consumable && q.entry_count() > 0 && info.queue_offset != q.max_offset() && !gap_past_retention {
            return Err(StoreError::bad_file(
                log.dir(),
                format!(
                    "record at {} has offset {} in {topic}/{} but its ConsumeQueue ends at {}",
                    info.phys_offset,
                    info.queue_offset,
                    info.queue_id,
                    q.max_offset()
                ),
            ));
        }
        if info.consumable {
            q.append(crate::consume_queue::CqEntry {
                phys_offset: info.phys_offset,
                size: info.size,
                count: info.count,
                base_offset: info.queue_offset,
                tag_code: info.tag_code,
                store_timestamp: info.store_timestamp,
                msg_timestamp: info.msg_timestamp,
            })?;
        }
        if let (Some(idx), Some(props), true) = (index.as_deref_mut(), props, info.indexable) {
            let max_keys = idx.max_keys();
            for (t, key) in crate::record::index_keys(topic, props, max_keys) {
                idx.put(t, key, info.phys_offset, info.store_timestamp)?;
            }
        }
        redispatched += 1;
        Ok(())
    })?;
    let end = scan_end.end;
    // Data past the end in a later segment means a hole, not a torn tail.
    // Without a checkpoint that cannot be told from damage: refused. Past
    // the checkpoint those entries were never known durable (write-back is
    // not in order, and a group commit's msync of two segments is not one
    // write), so the log is cut as within a segment, the later segments'
    // entries kept in lost+found.
    let mut later_intact = Vec::new();
    for seg in log.segments().iter().filter(|s| s.start > end) {
        if commitlog::valid_entry_at(log, seg.start, max_entry) {
            if safe.is_none() {
                return Err(StoreError::bad_file(
                    seg.file.path(),
                    format!(
                        "valid entries follow damaged or missing data at CommitLog offset {end}; refusing to drop them"
                    ),
                ));
            }
            tracing::error!(
                path = %seg.file.path().display(),
                offset = end,
                "valid entries in a later segment follow a torn tail past the checkpoint: cutting the log there"
            );
            later_intact.push(seg.start);
        }
    }
    if let Some((path, pos, why)) = &scan_end.stopped_by {
        if commitlog::valid_entry_follows(log, *pos, max_entry) {
            // Not a plain torn tail: a damaged entry with intact ones after it.
            if safe.is_none() {
                return Err(StoreError::bad_file(
                    path,
                    format!(
                        "damaged entry at CommitLog offset {pos} ({why}) is followed by valid entries and there is \
                         no usable checkpoint to tell a torn write from damage; refusing to drop them"
                    ),
                ));
            }
            // Past the checkpoint these were never known durable (a crash can
            // write pages out of order), so the log is cut here as Kafka and
            // RocketMQ do — but the cut bytes are kept (below), not silently dropped.
            tracing::error!(
                path = %path.display(),
                offset = pos,
                why,
                "damaged entry followed by valid ones past the checkpoint: cutting the log there"
            );
        } else {
            tracing::warn!(path = %path.display(), offset = pos, why, "truncating torn CommitLog tail");
        }
    }
    // Whatever is cut, and not zeros, is kept in lost+found first: a torn
    // last entry, or a damaged header (a zeroed sector, a size out of
    // range) whose followers a scan cannot find — a tail that is only a
    // torn write costs its few bytes, one that is not is not lost.
    // A copy that cannot be written (a full disk, a lost+found the broker
    // may not write) stops the start only when intact entries were cut; a
    // torn tail is cut with an error logged, as before copies were kept.
    let intact_cut = scan_end
        .stopped_by
        .as_ref()
        .is_some_and(|(_, pos, _)| commitlog::valid_entry_follows(log, *pos, max_entry));
    for start in later_intact {
        if let Some(saved) = commitlog::save_tail(log, start, &log.dir().join("../lost+found"))? {
            tracing::error!(
                offset = start,
                saved = %saved.display(),
                "a later segment's entries past the recovered end were cut; a copy is kept"
            );
        }
    }
    match commitlog::save_tail(log, end, &log.dir().join("../lost+found")) {
        Ok(Some(saved)) => tracing::error!(
            offset = end,
            saved = %saved.display(),
            "bytes past the recovered end of the CommitLog were cut; a copy is kept (`rokka store check` can re-append them)"
        ),
        Ok(None) => {}
        Err(e) if !intact_cut => tracing::error!(
            offset = end,
            error = %e,
            "bytes past the recovered end of the CommitLog were cut and could not be copied to lost+found"
        ),
        Err(e) => return Err(e),
    }
    commitlog::zero_tail(log, end)?;
    log.drop_segments_after(end)?;
    tracing::info!(end, redispatched, "recovery scan done");
    let report = RecoveryReport {
        clean: false,
        scanned_from: Some(start),
        full_scan: safe.is_none(),
        redispatched,
        truncated_at: scan_end.stopped_by.map(|(_, pos, _)| pos),
        queues_rebuilt: 0,
        last_record,
    };
    Ok((end, report))
}

/// A topic deletion a crash interrupted (its tombstone is on disk before
/// any file goes): queue files of a deleted topic whose last entry lies
/// below the tombstone are the deleted incarnation's, removed now (a topic
/// made again after the delete writes a fresh directory, every entry past
/// the tombstone).
fn finish_deletes(dir: &Path, deleted: &std::collections::BTreeMap<String, u64>, queues: &mut QueueMap) -> Result<()> {
    for (topic, end) in deleted {
        let Some(qs) = queues.get_mut(topic.as_str()) else {
            continue;
        };
        let old: Vec<u32> = qs
            .iter()
            .filter(|(_, cq)| {
                // (An empty queue holds nothing of either incarnation.)
                let n = cq.entry_count();
                n > 0 && cq.entry(n - 1).is_some_and(|e| e.phys_offset < *end)
            })
            .map(|(q, _)| *q)
            .collect();
        for q in old {
            if let Some(cq) = qs.remove(&q) {
                tracing::warn!(
                    topic,
                    queue = q,
                    "finishing the deletion of a topic a crash interrupted"
                );
                cq.destroy()?;
            }
        }
        if qs.is_empty() {
            queues.remove(topic.as_str());
            for tdir in [
                dir.join("consumequeue").join(topic),
                crate::compacted::topic_dir(dir, topic),
            ] {
                if tdir.exists() {
                    std::fs::remove_dir_all(&tdir).map_err(StoreError::io("remove", &tdir))?;
                }
            }
        }
    }
    Ok(())
}

/// Queues that end before the manifest says they did at the last checkpoint.
fn short_queues(m: &crate::manifest::Manifest, queues: &QueueMap) -> Vec<String> {
    let mut out = Vec::new();
    for (key, want) in &m.queues {
        let Some((topic, q)) = crate::manifest::Manifest::parse_key(key) else {
            continue;
        };
        if m.deleted.contains_key(topic) || *want == 0 {
            continue;
        }
        match queues.get(topic).and_then(|qs| qs.get(&q)) {
            None => out.push(format!("{key}: no ConsumeQueue, but it ended at offset {want}")),
            Some(cq) if cq.max_offset() < *want => out.push(format!(
                "{key}: ConsumeQueue ends at {} but ended at {want} at the last checkpoint",
                cq.max_offset()
            )),
            Some(_) => {}
        }
    }
    out
}

fn load_log_starts(path: &Path) -> Result<std::collections::BTreeMap<String, u64>> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| StoreError::bad_file(path, format!("not valid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
        Err(e) => Err(StoreError::Io {
            op: "read",
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

//! The store's background threads and the periodic jobs they run:
//!
//! * `rokka-flush` — async mode: flushes the CommitLog every
//!   `flush_interval_ms`. Sync mode: `sync_flush_depth` threads share a
//!   pipelined group commit (see [`sync_flusher`]).
//! * `rokka-store-tasks` — checkpoint (ConsumeQueues, index, checkpoint file)
//!   every `checkpoint_interval_ms`, retention every
//!   `retention_check_interval_ms`, consumer offsets every
//!   `offsets_flush_interval_ms`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::checkpoint::Checkpoint;
use crate::config::FlushMode;
use crate::error::{Result, StoreError};
use crate::store::{snapshot, write_checkpoint, InFlightSync, Inner};

pub(crate) fn spawn(inner: &Arc<Inner>) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let flushers = match inner.config.flush_mode {
        FlushMode::Async => 1,
        FlushMode::Sync => inner.config.sync_flush_depth.max(1),
    };
    let mut threads = Vec::with_capacity(flushers + 1);
    for _ in 0..flushers {
        let a = Arc::clone(inner);
        let flusher = std::thread::Builder::new()
            .name("rokka-flush".into())
            .spawn(move || match a.config.flush_mode {
                FlushMode::Async => async_flusher(&a),
                FlushMode::Sync => sync_flusher(&a),
            })
            .map_err(StoreError::io("spawn", "rokka-flush"))?;
        threads.push(flusher);
    }
    let b = Arc::clone(inner);
    let tasks = std::thread::Builder::new()
        .name("rokka-store-tasks".into())
        .spawn(move || task_loop(&b))
        .map_err(StoreError::io("spawn", "rokka-store-tasks"))?;
    threads.push(tasks);
    Ok(threads)
}

fn flush_commitlog(inner: &Inner) {
    let target = inner.log.write_pos();
    // After a failed write-back nothing more is flushed (logged once, by
    // the failure itself).
    if target <= inner.log.flushed_pos() || inner.log.failure().is_some() {
        return;
    }
    let t = Instant::now();
    match inner.log.flush_to(target) {
        Ok(()) => inner.metrics.flush_seconds.record(t.elapsed().as_secs_f64()),
        Err(e) => tracing::error!(error = %e, "CommitLog flush failed"),
    }
}

fn async_flusher(inner: &Inner) {
    let interval = Duration::from_millis(inner.config.flush_interval_ms);
    while !inner.stop.load(Ordering::Acquire) {
        sleep(inner, interval);
        flush_commitlog(inner);
    }
}

/// Sync mode's group commit, run by `sync_flush_depth` threads at once.
///
/// A sync takes everything written since the last sync started
/// (`[issued, write_pos)`), so the appenders it wakes append into the next
/// range while it is in flight, and with a depth above 1 that next range
/// is synced without waiting for this one: on a disk whose sync latency
/// barely depends on its size (docs/benchmarks.md) two syncs in flight
/// carry what one cannot. The flushed position moves only over syncs that
/// all finished, oldest first.
///
/// A sync waits, up to its gather window from its first waiter, for as many
/// waiters as recent syncs could have covered split over the depth, so
/// concurrent producers share a sync instead of taking turns and settle
/// into `depth` cohorts; a lone producer (a batch of 1) never waits. The
/// window is a share of what recent syncs took (see [`gather_window`]).
fn sync_flusher(inner: &Inner) {
    let depth = inner.config.sync_flush_depth.max(1);
    let flush = &inner.flush;
    let lock = || flush.requested.lock().unwrap_or_else(|p| p.into_inner());
    let mut req = lock();
    inner
        .metrics
        .sync_gather_window
        .set(gather_window(req.sync_micros, inner.config.sync_gather_max_us).as_secs_f64());
    while !inner.stop.load(Ordering::Acquire) {
        if inner.log.failure().is_some() {
            // Final: tell waiters (they fail at once) and idle.
            req.in_flight.clear();
            req.wake_all();
            drop(req);
            sleep(inner, Duration::from_millis(100));
            req = lock();
            continue;
        }
        let flushed = inner.log.flushed_pos();
        req.issued = req.issued.max(flushed);
        // Waiters covered by a flush made elsewhere (a checkpoint's).
        req.wake_through(flushed);
        if req.target <= req.issued || inner.log.write_pos() <= req.issued || req.in_flight.len() >= depth {
            if req.target <= flushed && req.in_flight.is_empty() {
                req.arrivals = 0;
                req.first_arrival = None;
            }
            req = flush
                .wake_flusher
                .wait_timeout(req, Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            continue;
        }
        let gather = gather_window(req.sync_micros, inner.config.sync_gather_max_us);
        if req.arrivals < req.batch_goal(depth) {
            if let Some(deadline) = req.first_arrival.map(|t| t + gather) {
                let now = Instant::now();
                if now < deadline {
                    req = flush
                        .wake_flusher
                        .wait_timeout(req, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    continue;
                }
            }
        }
        // Published data only: a waiter's end is published before it asks.
        let (from, to) = (req.issued, inner.log.write_pos());
        let waiters = req.arrivals;
        let covered: u64 = req.in_flight.iter().map(|s| s.waiters).sum();
        let slot = req.recent_next % req.recent_waiters.len();
        req.recent_waiters[slot] = waiters + covered;
        req.recent_next = req.recent_next.wrapping_add(1);
        req.arrivals = 0;
        req.first_arrival = None;
        req.issued = to;
        req.in_flight.push_back(InFlightSync {
            end: to,
            mark: to,
            waiters,
            done: false,
        });
        inner.metrics.syncs_in_flight.set(req.in_flight.len() as f64);
        drop(req);

        let t = Instant::now();
        let synced = inner.log.sync_range(from, to);
        let took = t.elapsed();
        match &synced {
            Ok(()) => {
                inner.metrics.flush_seconds.record(took.as_secs_f64());
                inner.metrics.group_commit_waiters.record(waiters as f64);
            }
            Err(e) => tracing::error!(error = %e, "CommitLog sync failed"),
        }

        req = lock();
        if synced.is_err() {
            continue;
        }
        // A moving average over about the last eight syncs.
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        req.sync_micros = if req.sync_micros == 0 {
            took
        } else {
            req.sync_micros.saturating_mul(7).saturating_add(took) / 8
        };
        inner
            .metrics
            .sync_gather_window
            .set(gather_window(req.sync_micros, inner.config.sync_gather_max_us).as_secs_f64());
        if let Some(s) = req.in_flight.iter_mut().find(|s| s.end == to && !s.done) {
            s.done = true;
        }
        let mut reached = None;
        while req.in_flight.front().is_some_and(|s| s.done) {
            reached = req.in_flight.pop_front().map(|s| s.mark);
        }
        inner.metrics.syncs_in_flight.set(req.in_flight.len() as f64);
        if let Some(end) = reached {
            inner.log.mark_flushed(end);
            req.wake_through(inner.log.flushed_pos());
            if let Some(f) = inner.flush_listener.get() {
                drop(req);
                f();
                req = lock();
            }
        }
    }
    // Stopping: whoever still waits learns it now.
    req.wake_all();
}

/// How long a sync waits for expected producers to join it: a third of
/// what recent syncs took (`sync_micros`, a moving average), at least
/// [`GATHER_MIN`] and at most `max_us` (`store.sync_gather_max_us`).
/// Waiting costs the producers already there that long once; a batch split
/// in two costs those left out a whole sync more, and the split persists
/// (the halves take turns). Where a sync takes 2–3 ms, 64–256 producers
/// woken together need more than 200 µs to append again on two cores
/// (docs/benchmarks.md); where it takes 0.4 ms, 200 µs is what they get.
pub(crate) fn gather_window(sync_micros: u64, max_us: u64) -> Duration {
    let max = Duration::from_micros(max_us);
    Duration::from_micros(sync_micros / 3).clamp(GATHER_MIN.min(max), max)
}

const GATHER_MIN: Duration = Duration::from_micros(200);

/// Sleeps up to `d`, waking early on shutdown.
fn sleep(inner: &Inner, d: Duration) {
    let g = inner.sleep.0.lock().unwrap_or_else(|p| p.into_inner());
    if inner.stop.load(Ordering::Acquire) {
        return;
    }
    let _ = inner.sleep.1.wait_timeout(g, d).unwrap_or_else(|p| p.into_inner());
}

fn task_loop(inner: &Inner) {
    let cfg = &inner.config;
    let every = |ms: u64| Duration::from_millis(ms);
    let mut next_cp = Instant::now() + every(cfg.checkpoint_interval_ms);
    let mut next_ret = Instant::now() + every(cfg.retention_check_interval_ms);
    let mut next_off = Instant::now() + every(cfg.offsets_flush_interval_ms);
    let (mut cp_streak, mut ret_streak, mut off_streak) = (
        Streak::new("checkpoint"),
        Streak::new("retention"),
        Streak::new("offsets"),
    );
    while !inner.stop.load(Ordering::Acquire) {
        let wake = next_cp.min(next_ret).min(next_off);
        sleep(inner, wake.saturating_duration_since(Instant::now()));
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if now >= next_cp && inner.log.failure().is_none() {
            cp_streak.note(inner, checkpoint(inner, false).map(|_| ()));
            next_cp = now + every(cfg.checkpoint_interval_ms);
        }
        if now >= next_ret {
            ret_streak.note(inner, retention(inner).map(|_| ()));
            next_ret = now + every(cfg.retention_check_interval_ms);
        }
        if now >= next_off {
            off_streak.note(inner, inner.offsets.persist_if_dirty());
            next_off = now + every(cfg.offsets_flush_interval_ms);
        }
    }
}

/// A periodic write that may fail again and again (a full disk fails the
/// checkpoint every second until retention or an operator frees room):
/// logged when it starts failing and when it works again, counted every
/// time (`rokka_store_background_write_failures_total{what}`).
struct Streak {
    what: &'static str,
    failures: u64,
}

impl Streak {
    fn new(what: &'static str) -> Streak {
        Streak { what, failures: 0 }
    }

    fn note(&mut self, inner: &Inner, result: Result<()>) {
        match result {
            Ok(()) if self.failures > 0 => {
                tracing::info!(what = self.what, failures = self.failures, "periodic write works again");
                self.failures = 0;
            }
            Ok(()) => {}
            Err(e) => {
                inner.metrics.background_write_failed(self.what);
                if self.failures == 0 {
                    tracing::error!(what = self.what, error = %e, "periodic write failed (logged again when it works)");
                }
                self.failures += 1;
            }
        }
    }
}

/// Flushes the CommitLog, every ConsumeQueue and the index up to a consistent
/// point and records it in the checkpoint file.
pub(crate) fn checkpoint(inner: &Inner, clean: bool) -> Result<Checkpoint> {
    let _turn = inner.checkpoint_lock.lock().unwrap_or_else(|p| p.into_inner());
    let (end, mark, last_record, mut manifest) = snapshot(inner);
    let t = Instant::now();
    inner.log.flush_to(end)?;
    inner.metrics.flush_seconds.record(t.elapsed().as_secs_f64());
    // A failed write-back of a queue or the index is final, as the
    // CommitLog's: Linux reports it once, so the next checkpoint's msync
    // would succeed and record as durable entries whose pages were lost.
    for q in inner.all_queues() {
        if let Err(e) = q.flush() {
            return Err(inner.log.fail(format!("ConsumeQueue write-back: {e}")));
        }
    }
    if let Some(index) = &inner.index {
        // msync outside the index lock so appends are not held up; everything
        // up to `mark` was written before the snapshot.
        let file = {
            let index = index.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(why) = index.write_back_failure() {
                return Err(inner.log.fail(why.to_string()));
            }
            index.active_file()
        };
        if let Some(f) = file {
            if let Err(e) = crate::fault::check("index-msync").and_then(|()| f.flush_range(0, f.len())) {
                return Err(inner
                    .log
                    .fail(format!("IndexFile write-back {}: {e}", f.path().display())));
            }
        }
    }
    let cp = Checkpoint {
        safe_offset: end,
        clean,
        last_record_offset: last_record,
        index: mark,
    };
    write_checkpoint(inner, &cp)?;
    // Tombstones of deleted topics whose records retention has removed are
    // no longer needed.
    let min = inner.log.min_offset();
    manifest.deleted.retain(|_, end| *end > min);
    inner
        .deleted
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|_, end| *end > min);
    manifest.store(&inner.dir)?;
    let segs = inner.log.segments();
    inner.metrics.segments.set(segs.len() as f64);
    inner
        .metrics
        .commitlog_bytes
        .set(segs.iter().map(|s| s.file.len() as f64).sum::<f64>());
    Ok(cp)
}

/// Deletes whole expired segments, oldest first (never the active one), then
/// moves ConsumeQueue starts forward and drops index files below the new
/// CommitLog start. Returns how many segments were deleted.
pub(crate) fn retention(inner: &Inner) -> Result<usize> {
    let cfg = &inner.config;
    let max_age = Duration::from_secs(cfg.retention_hours.saturating_mul(3600));
    let mut deleted = 0;
    // Segments holding a compacted queue's dirty range stay until a
    // compaction pass has cleaned it.
    let held = compaction_floor(inner);
    let floor = held.iter().map(|(_, _, phys)| *phys).min();
    // Bounded per pass, as RocketMQ's deleteFileBatchMax.
    while deleted < 10 {
        let total: u64 = inner.log.segments().iter().map(|s| s.file.len() as u64).sum();
        let over_size = cfg.retention_max_bytes > 0 && total > cfg.retention_max_bytes;
        let disk_full = cfg.disk_max_used_percent > 0
            && crate::sys::disk_used_percent(&inner.dir).is_some_and(|p| p > f64::from(cfg.disk_max_used_percent));
        let gone = inner.log.delete_oldest_if(|seg| {
            let expired = std::fs::metadata(seg.file.path())
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age >= max_age);
            let due = expired || over_size || disk_full;
            if due && floor.is_some_and(|f| seg.end() > f) {
                let mut wanted = inner.compaction_wanted.lock().unwrap_or_else(|p| p.into_inner());
                for (topic, q, phys) in &held {
                    if *phys < seg.end() {
                        wanted.insert((topic.clone(), *q));
                    }
                }
                inner.metrics.retention_held.increment(1);
                return false;
            }
            due
        })?;
        match gone {
            Some(seg) => {
                tracing::info!(path = %seg.file.path().display(), over_size, disk_full, "deleted CommitLog segment");
                inner.metrics.segments_deleted.increment(1);
                deleted += 1;
            }
            None => break,
        }
    }
    if deleted > 0 {
        let min = inner.log.min_offset();
        {
            let _w = inner.writer();
            for q in inner.all_queues() {
                q.advance_min(min)?;
            }
        }
        if let Some(index) = &inner.index {
            index.lock().unwrap_or_else(|p| p.into_inner()).delete_below(min)?;
        }
        inner.metrics.segments.set(inner.log.segments().len() as f64);
    }
    Ok(deleted)
}

/// Compacted queues with a dirty range: (topic, queue, CommitLog position
/// of its first dirty entry).
fn compaction_floor(inner: &Inner) -> Vec<(String, u32, u64)> {
    let topics = inner.compacted.read().unwrap_or_else(|p| p.into_inner()).clone();
    if topics.is_empty() {
        return Vec::new();
    }
    let queues = inner.queues.read().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    for topic in topics {
        let Some(qs) = queues.get(topic.as_str()) else {
            continue;
        };
        for (id, q) in qs {
            if let Some(e) = q.first_dirty().and_then(|i| q.entry(i)) {
                out.push((topic.clone(), *id, e.phys_offset));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gather_window_is_a_third_of_recent_syncs_within_its_bounds() {
        let us = Duration::from_micros;
        // Before any sync, and for fast syncs: the floor.
        assert_eq!(gather_window(0, 5_000), us(200));
        assert_eq!(gather_window(400, 5_000), us(200));
        // Slow syncs: a third of them.
        assert_eq!(gather_window(3_000, 5_000), us(1_000));
        // At most the configured longest, which also lowers the floor.
        assert_eq!(gather_window(60_000, 5_000), us(5_000));
        assert_eq!(gather_window(3_000, 100), us(100));
        assert_eq!(gather_window(3_000, 0), Duration::ZERO);
    }
}

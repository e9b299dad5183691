//! Store benchmarks (a bench binary, not criterion: each case is a long,
//! bounded run whose throughput is the number we want).
//!
//! ```sh
//! cargo bench -p rokka-store --bench store            # all cases
//! cargo bench -p rokka-store --bench store -- sync    # cases whose name contains "sync"
//! cargo bench -p rokka-store --bench store -- sustained  # 3 GiB appends past the first segments
//! cargo bench -p rokka-store --bench store -- startup    # open after a clean close, 4 and 16 GiB (not in "all")
//! ```
//! Data goes to `$ROKKA_BENCH_DIR` (default `target/bench-data`), deleted after
//! each case. Results are in docs/benchmarks.md.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rokka_store::record::kafka::build_test_batch;
use rokka_store::record::properties;
use rokka_store::{FlushMode, MessageInput, MessageStore, ReadStatus, StoreConfig};

type R = Result<(), Box<dyn std::error::Error>>;

fn bench_dir(name: &str) -> PathBuf {
    let root =
        std::env::var_os("ROKKA_BENCH_DIR").map_or_else(|| PathBuf::from("../../target/bench-data"), PathBuf::from);
    let d = root.join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn config(name: &str, mode: FlushMode) -> StoreConfig {
    let mut cfg = StoreConfig {
        data_dir: bench_dir(name),
        flush_mode: mode,
        ..StoreConfig::default()
    };
    // ROKKA_BENCH_SYNC_DEPTH=1 measures the group commit without pipelining.
    if let Some(depth) = std::env::var("ROKKA_BENCH_SYNC_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.sync_flush_depth = depth;
    }
    // ROKKA_BENCH_GATHER_MAX_US=200: the fixed 200 µs gather window the
    // group commit had before it followed the syncs' time.
    if let Some(us) = std::env::var("ROKKA_BENCH_GATHER_MAX_US")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.sync_gather_max_us = us;
    }
    cfg
}

/// Opens a store, appends one message and waits a second: the window the
/// store prepares ahead of its writer (`store.prefault_window_bytes`, not
/// whole segments since 2026-12-04) is ready when the measurement starts.
fn open_prepared(cfg: StoreConfig) -> Result<MessageStore, Box<dyn std::error::Error>> {
    let store = MessageStore::open(cfg)?;
    store.append_message(&MessageInput::new("warmup", 0, b"x", b""))?;
    std::thread::sleep(Duration::from_secs(1));
    Ok(store)
}

fn report(name: &str, msgs: u64, payload: u64, stored: u64, t: Duration) {
    let s = t.as_secs_f64();
    println!(
        "{name:<34} {:>10.0} msg/s  {:>8.1} MB/s payload  {:>8.1} MB/s stored  ({msgs} msgs in {s:.2} s)",
        msgs as f64 / s,
        payload as f64 / s / 1e6,
        stored as f64 / s / 1e6,
    );
}

/// This process's CPU time, every thread (the allocator's included), from
/// /proc/self/stat (USER_HZ is 100 on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn append_async(size: usize, count: u64) -> R {
    append_async_named(&format!("append_async_{size}B"), size, count, true)
}

/// Opens the case's store: prepared (see `open_prepared`), or fresh with
/// the CPU count starting before the open, so every page the store
/// prepares for the run is in the measurement (sustained cases).
fn open_for(name: &str, mode: FlushMode, prepared: bool) -> Result<(MessageStore, f64), Box<dyn std::error::Error>> {
    if prepared {
        let store = open_prepared(config(name, mode))?;
        Ok((store, cpu_seconds()))
    } else {
        let cpu = cpu_seconds();
        Ok((MessageStore::open(config(name, mode))?, cpu))
    }
}

fn append_async_named(name: &str, size: usize, count: u64, prepared: bool) -> R {
    let name = name.to_string();
    let (store, cpu) = open_for(&name, FlushMode::Async, prepared)?;
    let body = vec![0x5Au8; size];
    let props = properties::encode([("UNIQ_KEY", "0123456789ABCDEF0123456789ABCDEF")]);
    let (_, start_end, _) = store.commitlog_offsets();
    let t = Instant::now();
    for i in 0..count {
        let m = MessageInput::new("bench", (i % 8) as u32, &body, props.as_bytes());
        store.append_message(&m)?;
    }
    let el = t.elapsed();
    let (_, end, _) = store.commitlog_offsets();
    report(&name, count, count * size as u64, end - start_end, el);
    report_cpu(cpu_seconds() - cpu, end - start_end);
    store.close()?;
    let _ = std::fs::remove_dir_all(&store.config().data_dir);
    Ok(())
}

fn report_cpu(cpu: f64, stored: u64) {
    println!(
        "{:<34} {cpu:.2} s CPU (all threads, from the first append or the open), {:.2} s per GB stored",
        "",
        cpu / (stored as f64 / 1e9)
    );
}

fn append_kafka(records: usize, size: usize, count: u64) -> R {
    append_kafka_named(&format!("append_kafka_{records}x{size}B"), records, size, count, true)
}

fn append_kafka_named(name: &str, records: usize, size: usize, count: u64, prepared: bool) -> R {
    let name = name.to_string();
    let (store, cpu) = open_for(&name, FlushMode::Async, prepared)?;
    let value = vec![0x5Au8; size];
    let values: Vec<&[u8]> = (0..records).map(|_| value.as_slice()).collect();
    let batch = build_test_batch(&values, 1_700_000_000_000);
    let (_, start_end, _) = store.commitlog_offsets();
    let t = Instant::now();
    for i in 0..count {
        store.append_kafka_batch("kbench", (i % 8) as u32, &batch)?;
    }
    let el = t.elapsed();
    let (_, end, _) = store.commitlog_offsets();
    let msgs = count * records as u64;
    report(&name, msgs, msgs * size as u64, end - start_end, el);
    report_cpu(cpu_seconds() - cpu, end - start_end);
    store.close()?;
    let _ = std::fs::remove_dir_all(&store.config().data_dir);
    Ok(())
}

/// With `ROKKA_BENCH_SYNC_PREPARED=1` the sync cases open their store with
/// a 2 GiB preparation window (in an 8 GiB segment), prepared before the
/// clock starts, and run 3 s (the allocator asks for more only once half
/// of it is used): what the group commit costs without the page
/// preparation running beside it.
fn sync_prepared() -> bool {
    std::env::var_os("ROKKA_BENCH_SYNC_PREPARED").is_some()
}

fn sync_duration() -> Duration {
    Duration::from_secs(if sync_prepared() { 3 } else { 4 })
}

fn sync_store(name: &str) -> Result<MessageStore, Box<dyn std::error::Error>> {
    let mut cfg = config(name, FlushMode::Sync);
    if sync_prepared() {
        cfg.commitlog_segment_bytes = 8 << 30;
        cfg.prefault_window_bytes = 2 << 30;
        let store = open_prepared(cfg)?;
        store.settle_preparation();
        return Ok(store);
    }
    open_prepared(cfg)
}

fn append_sync(size: usize, threads: u64, duration: Duration) -> R {
    let name = format!("append_sync_{size}B_{threads}thr");
    let store = Arc::new(sync_store(&name)?);
    let cpu = cpu_seconds();
    let done = Arc::new(AtomicU64::new(0));
    let (_, start_end, _) = store.commitlog_offsets();
    let syncs_before = store.flush_count();
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|th| {
            let store = Arc::clone(&store);
            let done = Arc::clone(&done);
            std::thread::spawn(move || -> rokka_store::Result<()> {
                let body = vec![0x5Au8; size];
                let deadline = Instant::now() + duration;
                while Instant::now() < deadline {
                    let r = store.append_message(&MessageInput::new("sbench", (th % 8) as u32, &body, b""))?;
                    store.wait_durable(r.end_offset)?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "appender panicked")??;
    }
    let el = t.elapsed();
    let n = done.load(Ordering::Relaxed);
    let (_, end, _) = store.commitlog_offsets();
    report(&name, n, n * size as u64, end - start_end, el);
    let syncs = store.flush_count() - syncs_before;
    println!(
        "{:<34} {syncs} group commits, {:.1} appends each, {:.1} µs CPU per append",
        "",
        n as f64 / syncs.max(1) as f64,
        (cpu_seconds() - cpu) * 1e6 / n.max(1) as f64
    );
    store.close()?;
    let _ = std::fs::remove_dir_all(&store.config().data_dir);
    Ok(())
}

/// `ROKKA_BENCH_THINK_US=N`: each sync-mode task pauses a random 0..N µs
/// after each durable append (producers that do not arrive together).
fn think_us() -> Option<u64> {
    std::env::var("ROKKA_BENCH_THINK_US").ok().and_then(|v| v.parse().ok())
}

/// The production shape: `tasks` tokio tasks on a 2-worker runtime, each
/// appending and awaiting `durable()`.
fn append_sync_async(size: usize, tasks: u64, duration: Duration) -> R {
    let name = format!("append_sync_{size}B_{tasks}tasks");
    let store = Arc::new(sync_store(&name)?);
    let cpu = cpu_seconds();
    let done = Arc::new(AtomicU64::new(0));
    let (_, start_end, _) = store.commitlog_offsets();
    let syncs_before = store.flush_count();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let t = Instant::now();
    rt.block_on(async {
        let mut handles = Vec::new();
        for th in 0..tasks {
            let store = Arc::clone(&store);
            let done = Arc::clone(&done);
            let think = think_us();
            handles.push(tokio::spawn(async move {
                let body = vec![0x5Au8; size];
                let deadline = Instant::now() + duration;
                let mut seed = th.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                while Instant::now() < deadline {
                    let r = store.append_message(&MessageInput::new("sbench", (th % 8) as u32, &body, b""))?;
                    store.durable(r.end_offset).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                    if let Some(think) = think {
                        // xorshift: each producer pauses a different while.
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        tokio::time::sleep(Duration::from_micros(seed % think.max(1))).await;
                    }
                }
                Ok::<(), rokka_store::StoreError>(())
            }));
        }
        for h in handles {
            h.await.map_err(|_| rokka_store::StoreError::ShutDown)??;
        }
        Ok::<(), rokka_store::StoreError>(())
    })?;
    let el = t.elapsed();
    let n = done.load(Ordering::Relaxed);
    let (_, end, _) = store.commitlog_offsets();
    report(&name, n, n * size as u64, end - start_end, el);
    let syncs = store.flush_count() - syncs_before;
    println!(
        "{:<34} {syncs} group commits, {:.1} appends each, {:.1} µs CPU per append",
        "",
        n as f64 / syncs.max(1) as f64,
        (cpu_seconds() - cpu) * 1e6 / n.max(1) as f64
    );
    store.close()?;
    let _ = std::fs::remove_dir_all(&store.config().data_dir);
    Ok(())
}

/// The disk's own limit for `appenders` concurrent sync appends: a loop
/// that writes `appenders` stored 1 KiB messages' worth of bytes (1 141
/// each: record header, topic and properties included) into a mapped,
/// already written file and msyncs just that range, as one group commit
/// of that many appenders would with no time between syncs. Reported as
/// messages per second, the number the sync cases are compared with.
fn raw_msync(appenders: usize, duration: Duration) -> R {
    const STORED: usize = 1141;
    let name = format!("raw_msync_{appenders}x1141B");
    let dir = bench_dir(&name);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("raw");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let len = 1usize << 30;
    file.set_len(len as u64)?;
    // SAFETY: the file is this bench's own, nothing else maps or resizes it.
    #[allow(unsafe_code)]
    let mut map = unsafe { memmap2::MmapMut::map_mut(&file)? };
    // Written and on disk first (the store's sync mode writes its window
    // back once too), so the loop measures syncs of data only.
    map.fill(0);
    map.flush()?;
    let chunk = appenders * STORED;
    let (mut pos, mut syncs) = (0usize, 0u64);
    let t = Instant::now();
    while t.elapsed() < duration {
        if pos + chunk > len {
            pos = 0;
        }
        map[pos..pos + chunk].fill(0x5A);
        map.flush_range(pos, chunk)?;
        pos += chunk;
        syncs += 1;
    }
    let el = t.elapsed();
    let msgs = syncs * appenders as u64;
    report(&name, msgs, msgs * 1024, msgs * STORED as u64, el);
    println!(
        "{:<34} {syncs} syncs, {:.0} µs each",
        "",
        el.as_secs_f64() * 1e6 / syncs.max(1) as f64
    );
    drop(map);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Reads back `count` messages of `size` bytes, with the read-time checks
/// (`store.verify_reads`: CRCs and the record-against-queue check) on or off.
fn read_sequential(size: usize, count: u64, verify: bool) -> R {
    let name = format!("read_seq_{size}B{}", if verify { "_verified" } else { "_unverified" });
    let mut cfg = config(&name, FlushMode::Async);
    cfg.verify_reads = verify;
    let store = open_prepared(cfg)?;
    let body = vec![0x5Au8; size];
    for _ in 0..count {
        store.append_message(&MessageInput::new("rbench", 0, &body, b""))?;
    }
    let mut sink = vec![0u8; 1 << 20];
    for copy in [false, true] {
        let t = Instant::now();
        let (mut off, mut msgs, mut payload, mut stored) = (0u64, 0u64, 0u64, 0u64);
        loop {
            let r = store.read("rbench", 0, off, 1024, 1 << 20);
            if r.status != ReadStatus::Found {
                break;
            }
            for e in &r.entries {
                let rokka_store::Entry::Message(m) = e.decode()? else {
                    return Err("not a message".into());
                };
                payload += m.body.len() as u64;
                stored += e.data.len() as u64;
                if copy {
                    // What a socket write costs at least: one copy of the bytes.
                    let n = e.data.len().min(sink.len());
                    sink[..n].copy_from_slice(&e.data[..n]);
                }
                msgs += 1;
            }
            off = r.next_offset;
        }
        let el = t.elapsed();
        std::hint::black_box(&sink);
        report(
            &format!("{name}{}", if copy { "_copy" } else { "_views" }),
            msgs,
            payload,
            stored,
            el,
        );
    }
    store.close()?;
    let _ = std::fs::remove_dir_all(&store.config().data_dir);
    Ok(())
}

fn main() -> R {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let want = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    if want("append_async") {
        append_async(100, 4_000_000)?;
        append_async(1024, 900_000)?;
    }
    if want("append_kafka") {
        append_kafka(16, 1024, 50_000)?;
        append_kafka(100, 100, 40_000)?;
    }
    // 3 GiB from a fresh store (no settling first), CPU counted from the
    // open: every page written is prepared (or faulted in) inside the
    // measurement, whatever the store prepares ahead and when.
    if want("sustained") {
        append_kafka_named("sustained_kafka_16x1024B_3GiB", 16, 1024, 3 << 16, false)?;
        append_async_named("sustained_async_1024B_3GiB", 1024, 2_700_000, false)?;
    }
    for (size, threads) in [(1024, 1), (1024, 8), (1024, 64), (100, 64)] {
        if want(&format!("append_sync_{size}B_{threads}thr")) {
            append_sync(size, threads, sync_duration())?;
        }
    }
    for tasks in [64, 256] {
        if want(&format!("append_sync_1024B_{tasks}tasks")) {
            append_sync_async(1024, tasks, sync_duration())?;
        }
    }
    // The disk's limit for the same numbers of appenders, in the same run;
    // 32 and 128: half of them per sync, what appenders that each wait for
    // their own sync can at best keep the disk busy with (two cohorts).
    for appenders in [1, 32, 64, 128, 256] {
        if want(&format!("raw_msync_{appenders}x1141B")) || want("append_sync") {
            raw_msync(appenders, sync_duration())?;
        }
    }
    // Only when asked for: it writes ROKKA_BENCH_STARTUP_GIB (16) GiB.
    if std::env::args().skip(1).any(|a| a.contains("startup")) {
        startup()?;
    }
    if want("read_seq") {
        // Same run, both ways: the cost of checking what is served.
        for verify in [false, true] {
            read_sequential(1024, 900_000, verify)?;
        }
        read_sequential(100, 3_000_000, true)?;
    }
    Ok(())
}

/// Drops the page cache (root only); whether it did.
fn drop_caches() -> bool {
    // Written back first, so dropping leaves nothing dirty behind.
    std::process::Command::new("sync").status().is_ok_and(|s| s.success())
        && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// How long a store with a clean checkpoint takes to open, as it grows:
/// Kafka batches (16 × 1 KiB) over 8 queues up to a quarter of
/// ROKKA_BENCH_STARTUP_GIB (default 16) and then to all of it, closed
/// cleanly, opened again with the page cache warm and dropped (root).
fn startup() -> R {
    let gib: u64 = std::env::var("ROKKA_BENCH_STARTUP_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let cfg = config("startup", FlushMode::Async);
    let dir = cfg.data_dir.clone();
    let value = vec![0x5Au8; 1024];
    let values: Vec<&[u8]> = (0..16).map(|_| value.as_slice()).collect();
    let batch = build_test_batch(&values, 1_700_000_000_000);
    let mut i = 0u64;
    for target in [(gib / 4).max(1) << 30, gib << 30] {
        let store = MessageStore::open(cfg.clone())?;
        let t = Instant::now();
        loop {
            let (_, end, _) = store.commitlog_offsets();
            if end >= target {
                break;
            }
            store.append_kafka_batch("startup", (i % 8) as u32, &batch)?;
            i += 1;
        }
        let filled = t.elapsed();
        let (_, mut end, _) = store.commitlog_offsets();
        store.close()?;
        drop(store);
        println!(
            "startup: {:.1} GiB stored ({:.0} s to write), clean close",
            end as f64 / (1u64 << 30) as f64,
            filled.as_secs_f64()
        );
        for cold in [false, true] {
            if cold && !drop_caches() {
                println!("startup: page cache not dropped (not root): cold open not measured");
                continue;
            }
            let t = Instant::now();
            let store = MessageStore::open(cfg.clone())?;
            let open = t.elapsed();
            let (_, reopened_end, _) = store.commitlog_offsets();
            assert_eq!(reopened_end, end, "the reopened store ends where it was closed");
            let t = Instant::now();
            store.append_kafka_batch("startup", 0, &batch)?;
            let first = t.elapsed();
            end = store.commitlog_offsets().1;
            store.close()?;
            drop(store);
            println!(
                "startup_open_{}_{:.0}GiB {:>8.3} s to open, first append {:.1} ms",
                if cold { "cold" } else { "warm" },
                end as f64 / (1u64 << 30) as f64,
                open.as_secs_f64(),
                first.as_secs_f64() * 1e3
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

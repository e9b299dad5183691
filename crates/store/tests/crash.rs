//! Crash test: a child process appends with sync flush and reports each
//! acknowledged (durable) append on stdout; the parent SIGKILLs it at a random
//! moment, reopens the store and checks that every acknowledged message is
//! readable byte-exact and that offsets are contiguous. Repeated for 24
//! cycles on one data directory, so recovery also runs over earlier
//! recoveries' output.
//!
//! The child is this same test binary re-run with `ROKKA_CRASH_CHILD` set,
//! executing only `crash_child_entry`.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use rokka_store::{FlushMode, MessageStore, StoreConfig};

const QUEUES: u32 = 4;
const CYCLES: usize = 24;

fn config(dir: &std::path::Path) -> StoreConfig {
    let mut c = small_config(dir);
    c.flush_mode = FlushMode::Sync;
    // Two syncs in flight: an acknowledged append survives a kill -9 when
    // syncs overlap too (the flushed position only passes finished ones).
    c.sync_flush_depth = 2;
    c.checkpoint_interval_ms = 37;
    c.preallocate = true;
    c
}

/// The child: append forever (until killed), 4 threads, sync flush. Each
/// line is `ack <queue> <offset> <seed> <i>` once the append is durable.
#[test]
fn crash_child_entry() -> TestResult {
    let Ok(dir) = std::env::var("ROKKA_CRASH_CHILD") else {
        return Ok(());
    };
    let cycle: u64 = std::env::var("ROKKA_CRASH_CYCLE")?.parse()?;
    let store = std::sync::Arc::new(MessageStore::open(config(std::path::Path::new(&dir)))?);
    let out = std::sync::Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let deadline = Instant::now() + Duration::from_secs(20);
    let threads: Vec<_> = (0..QUEUES)
        .map(|q| {
            let s = std::sync::Arc::clone(&store);
            let out = std::sync::Arc::clone(&out);
            std::thread::spawn(move || -> rokka_store::Result<()> {
                let seed = cycle * 100 + u64::from(q);
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let r = append(&s, "C", q, seed, i)?;
                    s.wait_durable(r.end_offset)?;
                    {
                        use std::io::Write;
                        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                        let _ = writeln!(o, "ack {q} {} {seed} {i}", r.queue_offset);
                        let _ = o.flush();
                    }
                    i += 1;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

#[test]
fn sigkill_during_sync_appends_loses_no_acknowledged_message() -> TestResult {
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let mut rng = rand::thread_rng();
    // (queue, offset) -> (seed, i) of every acknowledged append.
    let mut acked: HashMap<(u32, u64), (u64, u64)> = HashMap::new();
    let mut total_acks = 0usize;
    for cycle in 0..CYCLES {
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child_entry", "--nocapture", "--test-threads=1"])
            .env("ROKKA_CRASH_CHILD", dir.path())
            .env("ROKKA_CRASH_CYCLE", cycle.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                lines.push(std::mem::take(&mut line));
            }
            let mut rest = String::new();
            let _ = r.read_to_string(&mut rest);
            lines
        });
        // Kill at a random moment: sometimes during recovery, mostly mid-append.
        let wait_ms = if cycle % 6 == 5 {
            rng.gen_range(1..15)
        } else {
            rng.gen_range(30..250)
        };
        std::thread::sleep(Duration::from_millis(wait_ms));
        child.kill()?; // SIGKILL
        child.wait()?;
        let lines = reader.join().map_err(|_| "reader panicked")?;
        for l in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            // A line cut by the kill is not an acknowledgement.
            if f.len() != 5 || f[0] != "ack" || !l.ends_with('\n') {
                continue;
            }
            let key = (f[1].parse()?, f[2].parse()?);
            let prev = acked.insert(key, (f[3].parse()?, f[4].parse()?));
            assert!(prev.is_none(), "offset {key:?} acknowledged twice");
            total_acks += 1;
        }

        // Recover in this process and check.
        let store = MessageStore::open(config(dir.path()))?;
        for q in 0..QUEUES {
            let all = read_all(&store, "C", q);
            for (k, (off, _)) in all.iter().enumerate() {
                assert_eq!(*off, k as u64, "cycle {cycle}: offsets of queue {q} contiguous");
            }
            let by_off: HashMap<u64, &Vec<u8>> = all.iter().map(|(o, b)| (*o, b)).collect();
            for ((aq, off), (seed, i)) in acked.iter().filter(|((aq, _), _)| *aq == q) {
                let got = by_off
                    .get(off)
                    .unwrap_or_else(|| panic!("cycle {cycle}: acknowledged {aq}/{off} lost"));
                assert_eq!(**got, body(*seed, *i), "cycle {cycle}: {aq}/{off} not byte-exact");
            }
        }
        drop(store); // unclean again: the next child recovers too
    }
    assert!(
        total_acks > 1000,
        "too few acknowledged appends to mean anything: {total_acks}"
    );
    eprintln!("crash test: {CYCLES} kills, {total_acks} acknowledged appends verified");
    Ok(())
}

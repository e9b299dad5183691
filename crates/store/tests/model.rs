//! Operation-sequence property test: random appends (messages and Kafka
//! batches), checkpoints, clean reopens, crashes and torn tails, checked
//! against a simple model of what each queue must hold.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use proptest::prelude::*;
use rokka_store::record::kafka::build_test_batch;
use rokka_store::{Entry, MessageInput, MessageStore, ReadStatus, StoreConfig};

#[derive(Debug, Clone)]
enum Op {
    Append {
        queue: u32,
        len: usize,
    },
    Batch {
        queue: u32,
        n: usize,
    },
    Checkpoint,
    Reopen,
    Crash,
    /// Crash, then damage the last `cut` bytes written since the last
    /// checkpoint, as a torn write would.
    CrashTorn {
        cut: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..3u32, 0..3000usize).prop_map(|(queue, len)| Op::Append { queue, len }),
        3 => (0..3u32, 1..6usize).prop_map(|(queue, n)| Op::Batch { queue, n }),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
        2 => (1..5000u64).prop_map(|cut| Op::CrashTorn { cut }),
    ]
}

/// What one offset range of a queue must read back as.
#[derive(Debug, Clone, PartialEq)]
struct Expect {
    offset: u64,
    count: u32,
    /// Message body, or the batch bytes after its base offset.
    payload: Vec<u8>,
    /// CommitLog end of the entry (to know what a torn tail removes).
    end: u64,
}

fn config(dir: &Path) -> StoreConfig {
    let mut c = StoreConfig::for_tests(dir);
    c.commitlog_segment_bytes = 80 * 1024;
    c.max_message_bytes = 8 * 1024;
    c.consume_queue_entries_per_file = 16;
    c.index_slots = 64;
    c.index_entries = 128;
    c.checkpoint_interval_ms = 3_600_000;
    c
}

/// Damages `[from, to)` of the CommitLog as a torn write would, making sure
/// every byte changes (zeroing would leave bytes that were already zero —
/// e.g. a Kafka record's trailing header count — intact).
fn tear_range(dir: &Path, seg_bytes: u64, from: u64, to: u64) -> std::io::Result<()> {
    let mut at = from;
    while at < to {
        let start = at - at % seg_bytes;
        let path = dir.join("commitlog").join(format!("{start:020}"));
        let n = (start + seg_bytes).min(to) - at;
        if path.exists() {
            let f = OpenOptions::new().read(true).write(true).open(&path)?;
            let mut buf = vec![0u8; n as usize];
            f.read_exact_at(&mut buf, at - start)?;
            for b in &mut buf {
                *b ^= 0xA5;
            }
            f.write_all_at(&buf, at - start)?;
        }
        at += n;
    }
    Ok(())
}

fn read_queue(store: &MessageStore, queue: u32) -> Vec<Expect> {
    let mut out = Vec::new();
    let mut off = store.min_offset("M", queue);
    loop {
        let r = store.read("M", queue, off, 7, 10_000);
        if r.status != ReadStatus::Found {
            break;
        }
        for e in &r.entries {
            let end = e.cq.phys_offset + u64::from(e.cq.size);
            match e.decode() {
                Ok(Entry::Message(m)) => out.push(Expect {
                    offset: m.queue_offset,
                    count: 1,
                    payload: m.body.to_vec(),
                    end,
                }),
                Ok(Entry::KafkaBatch(k)) => out.push(Expect {
                    offset: k.queue_offset,
                    count: k.count,
                    payload: k.batch[8..].to_vec(),
                    end,
                }),
                Err(err) => panic!("undecodable entry: {err}"),
            }
        }
        off = r.next_offset;
    }
    out
}

fn check<T: PartialEq + std::fmt::Debug>(got: &T, want: &T, what: &str) -> TestResult {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}").into())
    }
}

fn run(ops: Vec<Op>) -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let mut store = Some(MessageStore::open(cfg.clone())?);
    let mut model: Vec<Vec<Expect>> = vec![Vec::new(); 3];
    // CommitLog offset below which data is checkpointed (never torn).
    let mut safe = 0u64;
    let mut n = 0u64;
    for op in ops {
        let s = store.as_ref().ok_or("store closed")?;
        match op {
            Op::Append { queue, len } => {
                n += 1;
                let body: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + n) as u8).collect();
                let p = props(n);
                let r = s.append_message(&MessageInput::new("M", queue, &body, p.as_bytes()))?;
                let q = &mut model[queue as usize];
                let expect_off = q.last().map_or(0, |e| e.offset + u64::from(e.count));
                check(&r.queue_offset, &expect_off, "append offset")?;
                q.push(Expect {
                    offset: r.queue_offset,
                    count: 1,
                    payload: body,
                    end: r.phys_offset + u64::from(r.size),
                });
            }
            Op::Batch { queue, n: count } => {
                n += 1;
                let values: Vec<Vec<u8>> = (0..count).map(|j| body(n, j as u64)).collect();
                let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
                let b = build_test_batch(&refs, n as i64);
                let r = s.append_kafka_batch("M", queue, &b)?;
                let q = &mut model[queue as usize];
                let expect_off = q.last().map_or(0, |e| e.offset + u64::from(e.count));
                check(&r.queue_offset, &expect_off, "append offset")?;
                q.push(Expect {
                    offset: r.queue_offset,
                    count: count as u32,
                    payload: b[8..].to_vec(),
                    end: r.phys_offset + u64::from(r.size),
                });
            }
            Op::Checkpoint => {
                s.checkpoint()?;
                safe = s.commitlog_offsets().1;
            }
            Op::Reopen => {
                let st = store.take().ok_or("no store")?;
                st.close()?;
                safe = st.commitlog_offsets().1;
                drop(st);
                store = Some(MessageStore::open(cfg.clone())?);
            }
            Op::Crash => {
                drop(store.take());
                let st = MessageStore::open(cfg.clone())?;
                safe = st.commitlog_offsets().1;
                store = Some(st);
            }
            Op::CrashTorn { cut } => {
                let end = s.commitlog_offsets().1;
                drop(store.take());
                let from = end.saturating_sub(cut).max(safe);
                tear_range(dir.path(), cfg.commitlog_segment_bytes, from, end)?;
                for q in &mut model {
                    q.retain(|e| e.end <= from);
                }
                let st = MessageStore::open(cfg.clone())?;
                safe = st.commitlog_offsets().1;
                store = Some(st);
            }
        }
        let s = store.as_ref().ok_or("store closed")?;
        for (q, want) in model.iter().enumerate() {
            let got = read_queue(s, q as u32);
            check(&got, want, &format!("contents of queue {q}"))?;
            let max = want.last().map_or(0, |e| e.offset + u64::from(e.count));
            check(&s.max_offset("M", q as u32), &max, &format!("max offset of queue {q}"))?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn random_operation_sequences_match_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run(ops).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

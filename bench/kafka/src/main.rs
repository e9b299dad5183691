//! Produce then consume `--messages` messages of `--size` bytes through
//! librdkafka, printing msg/s and MB/s. The client is tuned so that it is not
//! the bottleneck (large batches, lz4 off, many messages in flight).
//! Exits non-zero when a delivery failed or not every message came back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::client::ClientContext;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{Message, Offset, TopicPartitionList};

/// Counts delivery reports: a benchmark that lost messages measured nothing.
#[derive(Default)]
struct Deliveries {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.ok.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    #[arg(long, default_value = "bench")]
    topic: String,
    #[arg(long, default_value_t = 2_000_000)]
    messages: u64,
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// "1" or "all"
    #[arg(long, default_value = "1")]
    acks: String,
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Skip the consume phase.
    #[arg(long)]
    produce_only: bool,
    /// Only the raw fetch phase (data produced by an earlier run).
    #[arg(long)]
    raw_fetch_only: bool,
    /// Messages produced (unmeasured) before the measured run, then a pause:
    /// lets the broker prepare its first segments, so the run measures the
    /// steady state.
    #[arg(long, default_value_t = 100_000)]
    warmup: u64,
    #[arg(long, default_value_t = 10)]
    warmup_pause_s: u64,
    /// An idempotent producer (enable.idempotence).
    #[arg(long)]
    idempotent: bool,
    /// A transactional producer committing every this many messages (0 = not transactional).
    #[arg(long, default_value_t = 0)]
    transactional_every: u64,
    /// Connect over TLS (security.protocol=ssl) trusting this CA file; the
    /// raw fetch phase (plain TCP) is skipped.
    #[arg(long)]
    ssl_ca: Option<String>,
}

/// TLS settings of `a`, if any, on a client config.
fn secure(c: &mut ClientConfig, a: &Args) {
    if let Some(ca) = &a.ssl_ca {
        c.set("security.protocol", "ssl").set("ssl.ca.location", ca);
    }
}

/// Polls delivery reports until none is outstanding.
fn drain(p: &BaseProducer<Deliveries>, within: Duration) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + within;
    while p.in_flight_count() > 0 {
        if Instant::now() > deadline {
            return Err("deliveries outstanding past the deadline".into());
        }
        p.poll(Duration::from_millis(1));
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    if a.raw_fetch_only {
        return raw_fetch(&a);
    }
    let payload = vec![0x61u8; a.size];
    let mut producer = ClientConfig::new();
    producer
        .set("bootstrap.servers", &a.brokers)
        .set("acks", &a.acks)
        .set("linger.ms", "5")
        .set("batch.size", "1048576")
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "2097151")
        .set("enable.idempotence", if a.idempotent || a.transactional_every > 0 { "true" } else { "false" })
        .set("compression.codec", "none");
    secure(&mut producer, &a);
    let txn = a.transactional_every > 0;
    let mut config = producer;
    if txn {
        config.set("transactional.id", format!("bench-tx-{}", a.topic));
    }
    let producer: BaseProducer<Deliveries> = config.create_with_context(Deliveries::default())?;
    if txn {
        producer.init_transactions(Duration::from_secs(30))?;
    }
    if a.warmup > 0 {
        if txn {
            producer.begin_transaction()?;
        }
        for i in 0..a.warmup {
            let p = (i % a.partitions as u64) as i32;
            while producer
                .send(BaseRecord::<(), [u8]>::to(&format!("{}-warmup", a.topic)).payload(&payload).partition(p))
                .is_err()
            {
                producer.poll(Duration::from_millis(1));
            }
        }
        producer.flush(Duration::from_secs(60))?;
        if txn {
            producer.commit_transaction(Duration::from_secs(60))?;
        }
        std::thread::sleep(Duration::from_secs(a.warmup_pause_s));
    }
    let t = Instant::now();
    let mut sent = 0u64;
    let mut commits = 0u64;
    if txn {
        producer.begin_transaction()?;
    }
    while sent < a.messages {
        if txn && sent > 0 && sent % a.transactional_every == 0 {
            // A commit waits for every message of the transaction: its cost
            // is what this mode measures. (BaseProducer serves delivery
            // reports only when polled, and librdkafka's flush, inside the
            // commit, then waits in 100 ms slices: poll them in first.)
            let t0 = Instant::now();
            drain(&producer, Duration::from_secs(60))?;
            let t1 = Instant::now();
            producer.commit_transaction(Duration::from_secs(60))?;
            let t2 = Instant::now();
            commits += 1;
            producer.begin_transaction()?;
            if commits <= 5 && std::env::var_os("BENCH_DEBUG").is_some() {
                eprintln!(
                    "commit {commits}: flush {:?} commit {:?} begin {:?}",
                    t1 - t0,
                    t2 - t1,
                    t2.elapsed()
                );
            }
        }
        let p = (sent % a.partitions as u64) as i32;
        match producer.send(BaseRecord::<(), [u8]>::to(&a.topic).payload(&payload).partition(p)) {
            Ok(()) => sent += 1,
            Err((e, _)) => {
                if !matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::QueueFull)) {
                    return Err(e.into());
                }
                producer.poll(Duration::from_millis(1));
            }
        }
        if sent % 10_000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    if txn {
        drain(&producer, Duration::from_secs(120))?;
        producer.commit_transaction(Duration::from_secs(120))?;
        commits += 1;
    }
    producer.flush(Duration::from_secs(120))?;
    let el = t.elapsed().as_secs_f64();
    let (ok, failed) = (
        producer.context().ok.load(Ordering::Relaxed),
        producer.context().failed.load(Ordering::Relaxed),
    );
    if failed > 0 || ok != a.messages + a.warmup {
        return Err(format!(
            "{failed} deliveries failed, {ok} of {} acknowledged",
            a.messages + a.warmup
        )
        .into());
    }
    let mode = if txn {
        format!(" transactional(commit every {}, {commits} commits)", a.transactional_every)
    } else if a.idempotent {
        " idempotent".to_string()
    } else {
        String::new()
    };
    println!(
        "produce{mode} size={} acks={} {:.0} msg/s {:.1} MB/s ({} msgs in {:.2} s)",
        a.size,
        a.acks,
        a.messages as f64 / el,
        (a.messages * a.size as u64) as f64 / el / 1e6,
        a.messages,
        el
    );
    if a.produce_only {
        return Ok(());
    }
    // Let the broker finish preparing segments so consumption is measured alone.
    std::thread::sleep(Duration::from_secs(a.warmup_pause_s));
    if a.ssl_ca.is_none() {
        raw_fetch(&a)?;
    }
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &a.brokers)
        .set("group.id", "rokka-bench")
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "10485760")
        .set("queued.max.messages.kbytes", "1048576")
        .set("check.crcs", "false");
    secure(&mut cc, &a);
    let consumer: BaseConsumer = cc.create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..a.partitions {
        tpl.add_partition_offset(&a.topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let t = Instant::now();
    let (mut got, mut bytes) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(300);
    while got < a.messages && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m?;
            got += 1;
            bytes += m.payload().map_or(0, |p| p.len() as u64);
        }
    }
    let el = t.elapsed().as_secs_f64();
    println!(
        "consume size={} {:.0} msg/s {:.1} MB/s ({} msgs in {:.2} s)",
        a.size,
        got as f64 / el,
        bytes as f64 / el / 1e6,
        got,
        el
    );
    if got < a.messages {
        return Err(format!("consumed {got} of {} messages", a.messages).into());
    }
    Ok(())
}

/// Consumes with hand-written Fetch v4 requests, counting records from the
/// batch headers without decoding them: measures the broker's fetch path
/// where librdkafka's per-message poll would be the bottleneck.
fn raw_fetch(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&a.brokers)?;
    s.set_nodelay(true)?;
    let mut offsets = vec![0i64; a.partitions as usize];
    let (mut records, mut bytes) = (0u64, 0u64);
    let t = Instant::now();
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while records < a.messages && Instant::now() < deadline {
        let mut req = Vec::new();
        req.extend_from_slice(&1i16.to_be_bytes()); // Fetch
        req.extend_from_slice(&4i16.to_be_bytes()); // v4
        req.extend_from_slice(&1i32.to_be_bytes());
        req.extend_from_slice(&5i16.to_be_bytes());
        req.extend_from_slice(b"bench");
        req.extend_from_slice(&(-1i32).to_be_bytes()); // replica
        req.extend_from_slice(&500i32.to_be_bytes()); // max wait
        req.extend_from_slice(&1i32.to_be_bytes()); // min bytes
        req.extend_from_slice(&(64i32 << 20).to_be_bytes()); // max bytes
        req.push(0); // isolation
        req.extend_from_slice(&1i32.to_be_bytes());
        req.extend_from_slice(&(a.topic.len() as i16).to_be_bytes());
        req.extend_from_slice(a.topic.as_bytes());
        req.extend_from_slice(&a.partitions.to_be_bytes());
        for (p, off) in offsets.iter().enumerate() {
            req.extend_from_slice(&(p as i32).to_be_bytes());
            req.extend_from_slice(&off.to_be_bytes());
            req.extend_from_slice(&(16i32 << 20).to_be_bytes());
        }
        s.write_all(&(req.len() as i32).to_be_bytes())?;
        s.write_all(&req)?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len)?;
        buf.resize(i32::from_be_bytes(len) as usize, 0);
        s.read_exact(&mut buf)?;
        let rd = |at: usize, n: usize| -> Result<i64, Box<dyn std::error::Error>> {
            let b = buf.get(at..at + n).ok_or("short response")?;
            Ok(b.iter().fold(0i64, |acc, x| (acc << 8) | i64::from(*x)) << (64 - 8 * n) >> (64 - 8 * n))
        };
        // correlation(4) throttle(4) topics(4) topic name(2+n) partitions(4)
        let mut at = 12;
        let tlen = rd(at, 2)? as usize;
        at += 2 + tlen;
        let nparts = rd(at, 4)?;
        at += 4;
        for _ in 0..nparts {
            let p = rd(at, 4)? as usize;
            at += 4 + 2 + 8 + 8; // partition, error, hw, lso
            let aborted = rd(at, 4)?;
            at += 4 + if aborted > 0 { aborted as usize * 16 } else { 0 };
            let rlen = rd(at, 4)?;
            at += 4;
            let end = at + rlen.max(0) as usize;
            bytes += rlen.max(0) as u64;
            let mut b = at;
            while b + 61 <= end {
                let base = rd(b, 8)?;
                let blen = rd(b + 8, 4)? as usize;
                if b + 12 + blen > end {
                    break; // partial batch at the end
                }
                let last_delta = rd(b + 23, 4)?;
                let count = rd(b + 57, 4)?;
                if base + last_delta >= offsets[p] {
                    records += count as u64;
                }
                offsets[p] = offsets[p].max(base + last_delta + 1);
                b += 12 + blen;
            }
            at = end;
        }
    }
    let el = t.elapsed().as_secs_f64();
    println!(
        "raw-fetch size={} {:.0} msg/s {:.1} MB/s of batches ({} msgs in {:.2} s)",
        a.size,
        records as f64 / el,
        bytes as f64 / el / 1e6,
        records,
        el
    );
    if records < a.messages {
        return Err(format!("raw fetch read {records} of {} records", a.messages).into());
    }
    Ok(())
}

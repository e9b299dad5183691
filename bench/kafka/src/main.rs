//! Produce then consume `--messages` messages of `--size` bytes through
//! librdkafka, printing msg/s and MB/s. The client is tuned so that it is not
//! the bottleneck (large batches, lz4 off, many messages in flight).

use std::time::{Duration, Instant};

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

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
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let payload = vec![0x61u8; a.size];
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &a.brokers)
        .set("acks", &a.acks)
        .set("linger.ms", "5")
        .set("batch.size", "1048576")
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "2097151")
        .set("enable.idempotence", "false")
        .set("compression.codec", "none")
        .create()?;
    let t = Instant::now();
    let mut sent = 0u64;
    while sent < a.messages {
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
    producer.flush(Duration::from_secs(120))?;
    let el = t.elapsed().as_secs_f64();
    println!(
        "produce size={} acks={} {:.0} msg/s {:.1} MB/s ({} msgs in {:.2} s)",
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
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &a.brokers)
        .set("group.id", "rokka-bench")
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "10485760")
        .set("queued.max.messages.kbytes", "1048576")
        .set("check.crcs", "false")
        .create()?;
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
    Ok(())
}

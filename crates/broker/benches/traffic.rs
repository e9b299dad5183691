//! The per-topic traffic counters' cost per request:
//! `cargo bench -p rokka-broker --bench traffic`.
//!
//! Against the Prometheus recorder rokka installs, one request's update of a
//! topic's messages and bytes counters as the frontends did it before
//! (`metrics::counter!` with a `topic` label built as a new String, twice)
//! and through `rokka_broker::traffic` (cached handles found by `&str`).
//! Prints ns per request for 1 and 1,000 topics, on one thread and on two.

use std::hint::black_box;
use std::time::Instant;

use metrics_exporter_prometheus::PrometheusBuilder;
use rokka_broker::traffic::TopicCounters;

const N: usize = 2_000_000;

fn labelled(topic: &str) {
    metrics::counter!("bench_messages_total", "topic" => topic.to_string()).increment(1);
    metrics::counter!("bench_bytes_total", "topic" => topic.to_string()).increment(1024);
}

fn run(threads: usize, topics: &[String], f: &(dyn Fn(&str) + Sync)) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for k in 0..threads {
            s.spawn(move || {
                for i in 0..N / threads {
                    f(black_box(&topics[(i + k) % topics.len()]));
                }
            });
        }
    });
    t.elapsed().as_nanos() as f64 / (N / threads) as f64
}

fn main() {
    let recorder = PrometheusBuilder::new().build_recorder();
    // Global, so the threads of the two-thread rows record into it too.
    if metrics::set_global_recorder(recorder).is_err() {
        eprintln!("a recorder was already installed");
        return;
    }
    let cached = TopicCounters::new("bench_messages_total", "bench_bytes_total", 65_536);
    println!("{:<36} {:>12} {:>12}", "update per request", "1 thread", "2 threads");
    for n in [1usize, 1000] {
        let topics: Vec<String> = (0..n).map(|i| format!("topic-{i:04}")).collect();
        let old1 = run(1, &topics, &labelled);
        let old2 = run(2, &topics, &labelled);
        let rec = |t: &str| cached.record(t, 1, 1024);
        let new1 = run(1, &topics, &rec);
        let new2 = run(2, &topics, &rec);
        println!(
            "{:<36} {:>9.1} ns {:>9.1} ns",
            format!("counter! + String label, {n} topics"),
            old1,
            old2
        );
        println!(
            "{:<36} {:>9.1} ns {:>9.1} ns",
            format!("cached handles, {n} topics"),
            new1,
            new2
        );
    }
}

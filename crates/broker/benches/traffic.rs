//! The per-topic traffic counters' cost per request:
//! `cargo bench -p rokka-broker --bench traffic`.
//!
//! Against the Prometheus recorder rokka installs, one request's update of a
//! topic's messages and bytes counters as the frontends did it before
//! (`metrics::counter!` with a `topic` label built as a new String, twice)
//! and through `rokka_broker::traffic` (cached handles found by `&str`).
//! Prints ns per request for 1 and 1,000 topics, on one thread and on two.
//!
//! Then a request's count and duration by request code (the
//! `rokka_rocketmq_requests_total` / `_request_seconds` shape, one of 20
//! codes per request): `counter!` + `histogram!` with the code label (a
//! label vector allocated and a registry lookup, twice) against
//! `rokka_broker::hot_metrics` (per-thread kept handles).

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
    const CODES: [&str; 20] = [
        "10", "11", "12", "14", "15", "17", "21", "29", "30", "31", "32", "33", "34", "35", "36", "38", "41", "46",
        "105", "310",
    ];
    let labels: Vec<String> = CODES.iter().map(|c| c.to_string()).collect();
    let code = |s: &str| CODES.iter().copied().find(|c| *c == s).unwrap_or("other");
    let old = |s: &str| {
        let c = code(s);
        metrics::counter!("bench_requests_total", "code" => c).increment(1);
        metrics::histogram!("bench_request_seconds", "code" => c).record(0.000_01);
    };
    let new = |s: &str| {
        let c = code(s);
        rokka_broker::hot_metrics::count("bench_requests_total", "code", c, 1);
        rokka_broker::hot_metrics::record("bench_request_seconds", "code", c, 0.000_01);
    };
    let (old1, old2) = (run(1, &labels, &old), run(2, &labels, &old));
    let (new1, new2) = (run(1, &labels, &new), run(2, &labels, &new));
    println!(
        "{:<36} {:>9.1} ns {:>9.1} ns",
        "counter! + histogram!, code label", old1, old2
    );
    println!("{:<36} {:>9.1} ns {:>9.1} ns", "hot_metrics count + record", new1, new2);
}

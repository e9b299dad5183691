//! Store metrics. Gauges and counters are registered once, so the append
//! path only bumps atomics; the counters are kept exported for good
//! ([`hot_metrics::keep_exported`]: the recorder would otherwise drop one
//! idle for `metrics.idle_timeout_ms`, and the kept handle would count
//! unseen). Histograms, which cannot be kept so, go through the per-thread
//! handles made again each epoch (they are recorded per flush, not per
//! append). Names are documented in `docs/metrics.md`.

use metrics::{counter, gauge, Counter, Gauge};

use crate::hot_metrics;

/// A histogram series (no labels), updated through the thread's kept handle.
pub struct Histogram(&'static str);

impl Histogram {
    pub fn record(&self, v: f64) {
        hot_metrics::record(self.0, "", "", v);
    }
}

/// The store's counters, kept exported.
const COUNTERS: &[(&str, &str, &str)] = &[
    ("rokka_store_appends_total", "kind", "message"),
    ("rokka_store_appends_total", "kind", "kafka_batch"),
    ("rokka_store_append_bytes_total", "", ""),
    ("rokka_store_segments_deleted_total", "", ""),
    ("rokka_store_flush_timeouts_total", "", ""),
    ("rokka_store_damaged_entries_total", "", ""),
    ("rokka_store_clean_logs_installed_total", "", ""),
    ("rokka_store_retention_held_total", "", ""),
    ("rokka_store_disk_full_refusals_total", "", ""),
    ("rokka_store_background_write_failures_total", "what", "checkpoint"),
    ("rokka_store_background_write_failures_total", "what", "retention"),
    ("rokka_store_background_write_failures_total", "what", "offsets"),
];

pub struct StoreMetrics {
    pub appends_message: Counter,
    pub appends_kafka: Counter,
    pub append_bytes: Counter,
    pub flush_seconds: Histogram,
    pub syncs_in_flight: Gauge,
    pub group_commit_waiters: Histogram,
    pub sync_gather_window: Gauge,
    pub segments: Gauge,
    pub recovery_seconds: Gauge,
    pub segments_deleted: Counter,
    pub flush_timeouts: Counter,
    pub commitlog_bytes: Gauge,
    pub damaged_entries: Counter,
    pub compactions: Counter,
    pub retention_held: Counter,
    checkpoint_failures: Counter,
    retention_failures: Counter,
    offsets_failures: Counter,
}

impl StoreMetrics {
    pub fn new() -> StoreMetrics {
        // Exported from the start (0: healthy), so alerts on it have a series.
        gauge!("rokka_store_failed").set(0.0);
        hot_metrics::keep_exported(COUNTERS);
        StoreMetrics {
            appends_message: counter!("rokka_store_appends_total", "kind" => "message"),
            appends_kafka: counter!("rokka_store_appends_total", "kind" => "kafka_batch"),
            append_bytes: counter!("rokka_store_append_bytes_total"),
            flush_seconds: Histogram("rokka_store_flush_seconds"),
            syncs_in_flight: gauge!("rokka_store_syncs_in_flight"),
            group_commit_waiters: Histogram("rokka_store_group_commit_waiters"),
            sync_gather_window: gauge!("rokka_store_sync_gather_window_seconds"),
            segments: gauge!("rokka_store_commitlog_segments"),
            recovery_seconds: gauge!("rokka_store_recovery_seconds"),
            segments_deleted: counter!("rokka_store_segments_deleted_total"),
            flush_timeouts: counter!("rokka_store_flush_timeouts_total"),
            commitlog_bytes: gauge!("rokka_store_commitlog_bytes"),
            damaged_entries: counter!("rokka_store_damaged_entries_total"),
            compactions: counter!("rokka_store_clean_logs_installed_total"),
            retention_held: counter!("rokka_store_retention_held_total"),
            checkpoint_failures: counter!("rokka_store_background_write_failures_total", "what" => "checkpoint"),
            retention_failures: counter!("rokka_store_background_write_failures_total", "what" => "retention"),
            offsets_failures: counter!("rokka_store_background_write_failures_total", "what" => "offsets"),
        }
    }

    /// Counts a failed periodic write: `what` is "checkpoint", "retention"
    /// or "offsets".
    pub fn background_write_failed(&self, what: &str) {
        match what {
            "checkpoint" => self.checkpoint_failures.increment(1),
            "retention" => self.retention_failures.increment(1),
            _ => self.offsets_failures.increment(1),
        }
    }
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_counters_stay_exported_and_histograms_reach_a_live_series() {
        let _serial = hot_metrics::EPOCH_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let first = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let m = metrics::with_local_recorder(&first, StoreMetrics::new);
        let text = first.handle().render();
        for name in [
            "rokka_store_flush_timeouts_total 0",
            "rokka_store_appends_total{kind=\"kafka_batch\"} 0",
        ] {
            assert!(text.contains(name), "{name}: {text}");
        }
        // Counters are plain handles (an atomic add per append)...
        m.flush_timeouts.increment(2);
        m.appends_kafka.increment(3);
        let text = first.handle().render();
        assert!(text.contains("rokka_store_flush_timeouts_total 2"), "{text}");
        assert!(
            text.contains("rokka_store_appends_total{kind=\"kafka_batch\"} 3"),
            "{text}"
        );
        // ...kept exported by the epoch ticker's touch (a recorder that had
        // dropped them gets them again at 0).
        let fresh = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&fresh, hot_metrics::touch_kept);
        let text = fresh.handle().render();
        for (name, label, value) in COUNTERS {
            let series = if label.is_empty() {
                format!("{name} 0")
            } else {
                format!("{name}{{{label}=\"{value}\"}} 0")
            };
            assert!(text.contains(&series), "{series}: {text}");
        }
        // A histogram reaches a registered series again after an epoch.
        let after = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        hot_metrics::new_epoch();
        metrics::with_local_recorder(&after, || m.flush_seconds.record(0.5));
        assert!(after.handle().render().contains("rokka_store_flush_seconds_count 1"));
    }
}

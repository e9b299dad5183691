//! Store metrics. Gauges are registered once (the recorder never drops
//! them); counters and histograms go through [`crate::hot_metrics`]'s
//! per-thread handles, made again each epoch, so a series the recorder
//! dropped as idle (`metrics.idle_timeout_ms`) is registered again when it
//! is next updated instead of counting unseen. Names are documented in
//! `docs/metrics.md`.

use metrics::{counter, gauge, Gauge};

use crate::hot_metrics;

/// A counter series, updated through the thread's kept handle.
pub struct Counter {
    name: &'static str,
    label: &'static str,
    value: &'static str,
}

impl Counter {
    const fn new(name: &'static str) -> Counter {
        Counter::labelled(name, "", "")
    }

    const fn labelled(name: &'static str, label: &'static str, value: &'static str) -> Counter {
        Counter { name, label, value }
    }

    pub fn increment(&self, n: u64) {
        if self.label.is_empty() {
            hot_metrics::count0(self.name, n);
        } else {
            hot_metrics::count(self.name, self.label, self.value, n);
        }
    }
}

/// A histogram series (no labels), updated through the thread's kept handle.
pub struct Histogram(&'static str);

impl Histogram {
    pub fn record(&self, v: f64) {
        hot_metrics::record0(self.0, v);
    }
}

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
}

impl StoreMetrics {
    pub fn new() -> StoreMetrics {
        // Exported from the start (0: healthy), so alerts on it have a series.
        gauge!("rokka_store_failed").set(0.0);
        counter!("rokka_store_disk_full_refusals_total").increment(0);
        counter!("rokka_store_flush_timeouts_total").increment(0);
        counter!("rokka_store_damaged_entries_total").increment(0);
        StoreMetrics {
            appends_message: Counter::labelled("rokka_store_appends_total", "kind", "message"),
            appends_kafka: Counter::labelled("rokka_store_appends_total", "kind", "kafka_batch"),
            append_bytes: Counter::new("rokka_store_append_bytes_total"),
            flush_seconds: Histogram("rokka_store_flush_seconds"),
            syncs_in_flight: gauge!("rokka_store_syncs_in_flight"),
            group_commit_waiters: Histogram("rokka_store_group_commit_waiters"),
            sync_gather_window: gauge!("rokka_store_sync_gather_window_seconds"),
            segments: gauge!("rokka_store_commitlog_segments"),
            recovery_seconds: gauge!("rokka_store_recovery_seconds"),
            segments_deleted: Counter::new("rokka_store_segments_deleted_total"),
            flush_timeouts: Counter::new("rokka_store_flush_timeouts_total"),
            commitlog_bytes: gauge!("rokka_store_commitlog_bytes"),
            damaged_entries: Counter::new("rokka_store_damaged_entries_total"),
            compactions: Counter::new("rokka_store_clean_logs_installed_total"),
            retention_held: Counter::new("rokka_store_retention_held_total"),
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
    fn store_counters_reach_a_series_registered_again_after_a_drop() {
        let _serial = hot_metrics::EPOCH_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let first = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let m = metrics::with_local_recorder(&first, StoreMetrics::new);
        assert!(first.handle().render().contains("rokka_store_flush_timeouts_total 0"));
        metrics::with_local_recorder(&first, || m.flush_timeouts.increment(2));
        assert!(first.handle().render().contains("rokka_store_flush_timeouts_total 2"));
        // The recorder dropped every series as idle (a new recorder stands
        // for it): a handle kept from StoreMetrics::new would count into
        // nothing; after the next epoch the count is exported again.
        let after = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        hot_metrics::new_epoch();
        metrics::with_local_recorder(&after, || {
            m.flush_timeouts.increment(1);
            m.appends_kafka.increment(3);
            m.flush_seconds.record(0.5);
        });
        let text = after.handle().render();
        assert!(text.contains("rokka_store_flush_timeouts_total 1"), "{text}");
        assert!(
            text.contains("rokka_store_appends_total{kind=\"kafka_batch\"} 3"),
            "{text}"
        );
        assert!(text.contains("rokka_store_flush_seconds_count 1"), "{text}");
        // The alert counters are registered at 0 by the epoch ticker's touch.
        let fresh = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&fresh, hot_metrics::touch_always_exported);
        let text = fresh.handle().render();
        for name in hot_metrics::ALWAYS_EXPORTED {
            assert!(text.contains(&format!("{name} 0")), "{name}: {text}");
        }
    }
}

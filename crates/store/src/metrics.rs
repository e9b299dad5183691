//! Store metrics, registered once so the append path only bumps atomics.
//! Names are documented in `docs/metrics.md`.

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

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
        StoreMetrics {
            appends_message: counter!("rokka_store_appends_total", "kind" => "message"),
            appends_kafka: counter!("rokka_store_appends_total", "kind" => "kafka_batch"),
            append_bytes: counter!("rokka_store_append_bytes_total"),
            flush_seconds: histogram!("rokka_store_flush_seconds"),
            syncs_in_flight: gauge!("rokka_store_syncs_in_flight"),
            group_commit_waiters: histogram!("rokka_store_group_commit_waiters"),
            sync_gather_window: gauge!("rokka_store_sync_gather_window_seconds"),
            segments: gauge!("rokka_store_commitlog_segments"),
            recovery_seconds: gauge!("rokka_store_recovery_seconds"),
            segments_deleted: counter!("rokka_store_segments_deleted_total"),
            flush_timeouts: counter!("rokka_store_flush_timeouts_total"),
            commitlog_bytes: gauge!("rokka_store_commitlog_bytes"),
            damaged_entries: counter!("rokka_store_damaged_entries_total"),
            compactions: counter!("rokka_store_clean_logs_installed_total"),
            retention_held: counter!("rokka_store_retention_held_total"),
        }
    }
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self::new()
    }
}

//! Metric updates on request paths with neither a label allocation nor a
//! registry lookup per request.
//!
//! `metrics::counter!(name, "code" => label)` with a label value that is
//! not a literal builds a label vector (a heap allocation) and looks the
//! series up in the recorder's registry (hashing name and labels, a shared
//! lock) on every call. Here each thread keeps the handles it has used,
//! keyed by the addresses of the `&'static str` name, label key and label
//! value: an update is a lookup in a small thread-local map and the
//! handle's own atomic operation.
//!
//! Idle series: rokka's Prometheus recorder drops a counter or histogram
//! series that was not updated for `metrics.idle_timeout_ms`; a handle kept
//! past that would go on updating a series no longer exported. So kept
//! handles belong to an *epoch* that a ticker thread advances every quarter
//! of that timeout ([`set_idle_timeout`]); a handle from an earlier epoch
//! is made again (a registry lookup, which registers the series anew). A
//! handle is thus used at most a quarter timeout after it was made, and a
//! series it kept updating is not idle long enough to be dropped. One
//! narrow race stays, as for any handle of this recorder: a series idle
//! for the whole timeout, looked up in the instant a scrape drops it,
//! counts into the dropped series until the next epoch.
//!
//! Concurrency: any thread; nothing shared but the epoch (read, relaxed).
//! Budget: at most [`MAX_PER_THREAD`] handles per thread (the label values
//! come from fixed tables: request codes, API names, listener names); past
//! it a thread's map starts over.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

/// Handles kept per thread at most.
pub const MAX_PER_THREAD: usize = 4096;

static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Which series: the handle kind, then the address and length of name,
/// label key and value.
type Key = (u8, [(usize, usize); 3]);

enum Handle {
    Counter(Counter),
    Gauge(Gauge),
    Histogram(Histogram),
}

/// A handle kind: how to make one and find it in a [`Handle`].
trait Kind: Sized {
    const TAG: u8;
    fn make(name: &'static str, label: &'static str, value: &'static str) -> Handle;
    fn of(h: &Handle) -> Option<&Self>;
}

impl Kind for Counter {
    const TAG: u8 = 0;
    fn make(name: &'static str, label: &'static str, value: &'static str) -> Handle {
        Handle::Counter(if label.is_empty() {
            metrics::counter!(name)
        } else {
            metrics::counter!(name, label => value)
        })
    }
    fn of(h: &Handle) -> Option<&Counter> {
        match h {
            Handle::Counter(c) => Some(c),
            _ => None,
        }
    }
}

impl Kind for Gauge {
    const TAG: u8 = 1;
    fn make(name: &'static str, label: &'static str, value: &'static str) -> Handle {
        Handle::Gauge(if label.is_empty() {
            metrics::gauge!(name)
        } else {
            metrics::gauge!(name, label => value)
        })
    }
    fn of(h: &Handle) -> Option<&Gauge> {
        match h {
            Handle::Gauge(g) => Some(g),
            _ => None,
        }
    }
}

impl Kind for Histogram {
    const TAG: u8 = 2;
    fn make(name: &'static str, label: &'static str, value: &'static str) -> Handle {
        Handle::Histogram(if label.is_empty() {
            metrics::histogram!(name)
        } else {
            metrics::histogram!(name, label => value)
        })
    }
    fn of(h: &Handle) -> Option<&Histogram> {
        match h {
            Handle::Histogram(x) => Some(x),
            _ => None,
        }
    }
}

thread_local! {
    static HANDLES: RefCell<HashMap<Key, (Handle, u64), foldhash::fast::FixedState>> = const {
        RefCell::new(HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0x726f6b6b61)))
    };
}

/// Runs `f` on the thread's `T` handle for `name{label="value"}`, made on
/// first use and again in a new epoch (the kind is part of the key, so the
/// handle found is always a `T`).
fn with<T: Kind>(name: &'static str, label: &'static str, value: &'static str, f: impl Fn(&T)) {
    let at = |s: &'static str| (s.as_ptr() as usize, s.len());
    let k: Key = (T::TAG, [at(name), at(label), at(value)]);
    let apply = |h: &Handle| {
        if let Some(t) = T::of(h) {
            f(t);
        }
    };
    let epoch = EPOCH.load(Ordering::Relaxed);
    let kept = HANDLES.try_with(|h| {
        let mut map = h.borrow_mut();
        if let Some((handle, made)) = map.get(&k) {
            if *made == epoch {
                apply(handle);
                return;
            }
        }
        if map.len() >= MAX_PER_THREAD && !map.contains_key(&k) {
            map.clear();
        }
        let handle = T::make(name, label, value);
        apply(&handle);
        map.insert(k, (handle, epoch));
    });
    if kept.is_err() {
        // The thread is ending (its handles already dropped): no kept handle.
        apply(&T::make(name, label, value));
    }
}

/// Adds `n` to the counter `name{label="value"}` (`label` "": no labels).
pub fn count(name: &'static str, label: &'static str, value: &'static str, n: u64) {
    with(name, label, value, |c: &Counter| c.increment(n));
}

/// Records `v` in the histogram `name{label="value"}` (`label` "": no
/// labels).
pub fn record(name: &'static str, label: &'static str, value: &'static str, v: f64) {
    with(name, label, value, |h: &Histogram| h.record(v));
}

/// Adds `delta` (may be negative) to the gauge `name{label="value"}`.
pub fn gauge_add(name: &'static str, label: &'static str, value: &'static str, delta: f64) {
    with(name, label, value, |g: &Gauge| g.increment(delta));
}

/// Sets the gauge `name{label="value"}`.
pub fn gauge_set(name: &'static str, label: &'static str, value: &'static str, v: f64) {
    with(name, label, value, |g: &Gauge| g.set(v));
}

/// The epoch kept handles belong to (for caches elsewhere, e.g.
/// `rokka_broker::traffic`: a handle made in another epoch is made again).
pub fn epoch() -> u64 {
    EPOCH.load(Ordering::Relaxed)
}

/// Starts a new epoch now (every kept handle is made again on next use):
/// after a recorder is installed, so handles made before it (no-ops) go.
pub fn new_epoch() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

/// A counter series kept exported (see [`keep_exported`]):
/// (name, label, value), label "" for none.
type Series = (&'static str, &'static str, &'static str);

/// Counters kept exported: registered at 0 and never dropped as idle.
static KEPT: std::sync::Mutex<Vec<Series>> = std::sync::Mutex::new(Vec::new());

/// Keeps these counter series exported for good: registered now (at 0 if
/// new) and touched every epoch, so the recorder never drops them as
/// idle. For counters a component holds handles to for its whole life
/// (the store's, updated on every append with no lookup) and those alerts
/// watch (the first event after a quiet hour is an increase from 0, not a
/// new series `increase()` cannot see). A fixed set of series: no
/// client-chosen labels.
pub fn keep_exported(series: &[Series]) {
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    for s in series {
        if !kept.contains(s) {
            kept.push(*s);
        }
        touch(s);
    }
}

fn touch(&(name, label, value): &Series) {
    let c = if label.is_empty() {
        metrics::counter!(name)
    } else {
        metrics::counter!(name, label => value)
    };
    c.increment(0);
}

/// Adds 0 to each kept counter: registers it (at 0) if it is not, and
/// marks it updated so the recorder does not drop it.
pub fn touch_kept() {
    let kept = KEPT.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for s in &kept {
        touch(s);
    }
}

/// The recorder drops counters and histograms idle for `timeout`
/// (`None`: never): starts a new epoch now and, with a timeout, every
/// quarter of it from a thread of its own, which also touches the
/// [`keep_exported`] counters. Call once, after installing the recorder.
pub fn set_idle_timeout(timeout: Option<Duration>) -> std::io::Result<()> {
    new_epoch();
    touch_kept();
    if let Some(t) = timeout {
        let every = (t / 4).max(Duration::from_millis(1));
        std::thread::Builder::new()
            .name("rokka-metric-epoch".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                new_epoch();
                touch_kept();
            })?;
    }
    Ok(())
}

/// Held by tests that start epochs or count registrations, so that they
/// do not see each other's epochs.
#[doc(hidden)]
pub static EPOCH_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_made_again_in_a_new_epoch_and_counts_go_to_the_live_series() {
        let _serial = EPOCH_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            count("t_hot_total", "code", "10", 2);
            count("t_hot_total", "code", "10", 3);
            count("t_hot_total", "code", "11", 1);
            record("t_hot_seconds", "code", "10", 0.5);
            gauge_add("t_hot_bytes", "listener", "kafka", 1024.0);
            gauge_add("t_hot_bytes", "listener", "kafka", -24.0);
            gauge_set("t_hot_level", "listener", "kafka", 7.0);
        });
        let text = handle.render();
        assert!(text.contains("t_hot_total{code=\"10\"} 5"), "{text}");
        assert!(text.contains("t_hot_total{code=\"11\"} 1"), "{text}");
        assert!(text.contains("t_hot_seconds_count{code=\"10\"} 1"), "{text}");
        assert!(text.contains("t_hot_bytes{listener=\"kafka\"} 1000"), "{text}");
        assert!(text.contains("t_hot_level{listener=\"kafka\"} 7"), "{text}");

        // A series dropped from the registry (as the recorder drops an idle
        // one): the kept handle would count into nothing; after a new epoch
        // the count reaches a registered series again.
        let other = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let other_handle = other.handle();
        metrics::with_local_recorder(&other, || count("t_hot_total", "code", "10", 1));
        assert!(
            !other_handle.render().contains("t_hot_total"),
            "the kept handle is used in its epoch"
        );
        new_epoch();
        metrics::with_local_recorder(&other, || count("t_hot_total", "code", "10", 1));
        assert!(
            other_handle.render().contains("t_hot_total{code=\"10\"} 1"),
            "{}",
            other_handle.render()
        );
    }

    #[test]
    fn a_gauge_moved_on_two_threads_and_a_full_map_keep_their_counts() {
        let _serial = EPOCH_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let recorder = std::sync::Arc::new(metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        let r = std::sync::Arc::clone(&recorder);
        metrics::with_local_recorder(&*recorder, || gauge_add("t_two_bytes", "listener", "x", 4096.0));
        std::thread::spawn(move || {
            metrics::with_local_recorder(&*r, || gauge_add("t_two_bytes", "listener", "x", -1024.0));
        })
        .join()
        .unwrap_or_default();
        // Past MAX_PER_THREAD kept handles the thread's map starts over;
        // counts already made stay, later ones reach the same series.
        let values: Vec<&'static str> = (0..=MAX_PER_THREAD)
            .map(|i| &*Box::leak(format!("v{i}").into_boxed_str()))
            .collect();
        metrics::with_local_recorder(&*recorder, || {
            count("t_full_total", "v", values[0], 1);
            for v in &values {
                count("t_full_total", "v", v, 1);
            }
            count("t_full_total", "v", values[0], 1);
            assert!(HANDLES.with(|h| h.borrow().len()) <= MAX_PER_THREAD);
        });
        let text = handle.render();
        assert!(text.contains("t_two_bytes{listener=\"x\"} 3072"), "{text}");
        assert!(text.contains("t_full_total{v=\"v0\"} 3"), "v0 counted 3 times");
        let last = format!("t_full_total{{v=\"v{MAX_PER_THREAD}\"}} 1");
        assert!(text.contains(&last), "{last}");
    }
}

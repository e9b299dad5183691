//! Wake-ups for long polls: a waiter registers on the queues it reads, and an
//! append to a queue wakes exactly the waiters registered on that queue.
//! In sync-flush mode an append is not visible to readers until it is on
//! disk, so the wake-up waits for the flush ([`Arrivals::deferred`]). In
//! cluster mode readers see only what the high watermark covers: a queue
//! written past it is held ([`Arrivals::hold`]) and woken when the
//! watermark reaches its records ([`Arrivals::visible_up_to`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

type Waiters = Vec<Weak<Notify>>;

/// A topic's held queues → (the position the watermark must reach, the
/// furthest written).
type HeldQueues = HashMap<u32, (u64, u64)>;

/// The waiters per (topic, queue), and the size at which the next sweep of
/// keys whose waiters have all gone runs.
#[derive(Debug, Default)]
struct Table {
    map: HashMap<(String, u32), Waiters>,
    sweep_at: usize,
}

/// Registry of waiters per (topic, queue).
#[derive(Debug, Default)]
pub struct Arrivals {
    waiters: Mutex<Table>,
    /// Sync flush: queues appended to since the last flush (at most one
    /// entry per queue; drained by every flush).
    pending: Option<Mutex<HashMap<String, HashSet<u32>>>>,
    /// Cluster mode: queues written past the high watermark, by topic
    /// (looked up by `&str`: an append to a topic already held allocates
    /// nothing) → (the log position the watermark must reach to wake them,
    /// the furthest one written). At most one entry per queue.
    held: Mutex<HashMap<String, HeldQueues>>,
}

impl Arrivals {
    /// Wake-ups that wait for [`Arrivals::flushed`] (sync flush).
    pub fn deferred() -> Arrivals {
        Arrivals {
            waiters: Mutex::default(),
            pending: Some(Mutex::default()),
            held: Mutex::default(),
        }
    }

    /// The store flushed: wakes the waiters of queues appended to since.
    pub fn flushed(&self) {
        let Some(pending) = &self.pending else {
            return;
        };
        let keys: Vec<(String, HashSet<u32>)> = pending.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
        for (t, qs) in keys {
            for q in qs {
                self.wake(&t, q);
            }
        }
    }

    /// Registers `waiter` to be notified on the next append to (topic, queue).
    /// Registration is one-shot: re-register after each wake-up.
    pub fn register(&self, topic: &str, queue: u32, waiter: &Arc<Notify>) {
        let mut t = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        // Keys come from clients (any topic name a fetch lists): keys whose
        // waiters have all gone are dropped once the map has doubled since
        // the last sweep, so it holds about twice the queues someone is
        // waiting on, not every name ever asked for — and a map that stays
        // at one size is not swept on every registration.
        if t.map.len() >= t.sweep_at.max(1024) {
            t.map.retain(|_, l| {
                l.retain(|w| w.strong_count() > 0);
                !l.is_empty()
            });
            t.sweep_at = t.map.len() * 2;
        }
        let list = t.map.entry((topic.to_string(), queue)).or_default();
        // The same waiter again (a request naming a queue twice): nothing
        // to add, and no rescan of the list.
        if list
            .last()
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(waiter)))
        {
            return;
        }
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(waiter));
    }

    /// Wakes the waiters of (topic, queue) — after the next flush in sync mode.
    pub fn notify(&self, topic: &str, queue: u32) {
        if let Some(pending) = &self.pending {
            // Kept even with nobody waiting yet: a reader that registers
            // before the flush must still be woken by it.
            // Looked up by &str: an append allocates nothing once its topic
            // is in the set.
            let mut p = pending.lock().unwrap_or_else(|p| p.into_inner());
            match p.get_mut(topic) {
                Some(qs) => {
                    qs.insert(queue);
                }
                None => {
                    p.insert(topic.to_string(), HashSet::from([queue]));
                }
            }
            return;
        }
        self.wake(topic, queue);
    }

    /// Wakes the waiters of (topic, queue) at once — not for a new record
    /// (those go through [`Arrivals::notify`], after the flush when one is
    /// awaited) but when what a waiting reader may take changed without
    /// one: a RocketMQ 5 ack that unblocks a FIFO queue, a nack that makes
    /// a message due sooner than the waiter's timer.
    pub fn wake_now(&self, topic: &str, queue: u32) {
        self.wake(topic, queue);
    }

    fn wake(&self, topic: &str, queue: u32) {
        let list = {
            let mut t = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            if t.map.is_empty() {
                return;
            }
            t.map.remove(&(topic.to_string(), queue))
        };
        for w in list.into_iter().flatten() {
            if let Some(n) = w.upgrade() {
                n.notify_one();
            }
        }
    }

    /// Cluster mode: (topic, queue) was written up to log position `end`,
    /// past what the high watermark covered: its waiters are woken once
    /// the watermark reaches `end` ([`Arrivals::visible_up_to`]). `hw` is
    /// read again once the queue is held, so a watermark that rose in
    /// between is not missed.
    pub fn hold(&self, topic: &str, queue: u32, end: u64, hw: impl Fn() -> Option<u64>) {
        {
            let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
            let queues = match h.get_mut(topic) {
                Some(q) => q,
                None => h.entry(topic.to_string()).or_default(),
            };
            let e = queues.entry(queue).or_insert((end, end));
            e.1 = e.1.max(end);
        }
        if let Some(now) = hw() {
            if now >= end {
                self.visible_up_to(now);
            }
        }
    }

    /// The high watermark rose to `hw`: the held queues whose records it
    /// now covers are woken (a queue written further stays held for the
    /// rest, woken again at the next rise).
    pub fn visible_up_to(&self, hw: u64) {
        let due: Vec<(String, u32)> = {
            let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if h.is_empty() {
                return;
            }
            let mut due = Vec::new();
            h.retain(|t, queues| {
                queues.retain(|q, (min, max)| {
                    if *min > hw {
                        return true;
                    }
                    due.push((t.clone(), *q));
                    if *max > hw {
                        *min = hw + 1;
                        true
                    } else {
                        false
                    }
                });
                !queues.is_empty()
            });
            due
        };
        for (t, q) in due {
            self.wake(&t, q);
            // Sync flush: readers see only what is also flushed here (a
            // replica's watermark does not wait for its own flush): the
            // next flush wakes them again.
            if let Some(pending) = &self.pending {
                pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(t)
                    .or_default()
                    .insert(q);
            }
        }
    }

    /// Number of (topic, queue) keys with registered waiters.
    pub fn waiting_queues(&self) -> usize {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner()).map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_queue_written_past_the_watermark_wakes_when_it_is_reached() {
        let a = Arrivals::default();
        let n = Arc::new(Notify::new());
        let woke = |n: &Arc<Notify>| {
            let n = Arc::clone(n);
            async move {
                tokio::time::timeout(std::time::Duration::from_millis(50), n.notified())
                    .await
                    .is_ok()
            }
        };
        a.register("t", 0, &n);
        a.hold("t", 0, 100, || Some(40));
        a.hold("t", 0, 300, || Some(40));
        a.visible_up_to(80);
        assert!(!woke(&n).await, "not yet covered");
        a.visible_up_to(150);
        assert!(woke(&n).await, "its first records are visible");
        // Written further: held for the rest, woken at the next rise.
        a.register("t", 0, &n);
        a.visible_up_to(200);
        assert!(woke(&n).await);
        a.register("t", 0, &n);
        a.visible_up_to(300);
        assert!(woke(&n).await);
        a.register("t", 0, &n);
        a.visible_up_to(400);
        assert!(!woke(&n).await, "nothing held any more");
        // A watermark that rose before the hold was recorded is not missed.
        a.hold("t", 0, 500, || Some(600));
        assert!(woke(&n).await);
    }

    #[tokio::test]
    async fn wakes_exactly_the_waiters_of_the_queue() {
        let a = Arrivals::default();
        let n1 = Arc::new(Notify::new());
        let n2 = Arc::new(Notify::new());
        a.register("t", 0, &n1);
        a.register("t", 1, &n2);
        a.notify("t", 0);
        let woke1 = tokio::time::timeout(std::time::Duration::from_millis(100), n1.notified()).await;
        let woke2 = tokio::time::timeout(std::time::Duration::from_millis(50), n2.notified()).await;
        assert!(woke1.is_ok());
        assert!(woke2.is_err());
        assert_eq!(a.waiting_queues(), 1);
    }

    #[test]
    fn keys_of_gone_waiters_do_not_accumulate() {
        let a = Arrivals::default();
        for i in 0..100_000u32 {
            let n = Arc::new(Notify::new());
            a.register(&format!("no-such-topic-{i}"), 0, &n);
        }
        assert!(a.waiting_queues() <= 2048, "{} keys kept", a.waiting_queues());
    }

    #[test]
    fn a_queue_named_again_by_one_waiter_is_registered_once() {
        let a = Arrivals::default();
        let n = Arc::new(Notify::new());
        for _ in 0..100_000 {
            a.register("t", 0, &n);
        }
        let t = a.waiters.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(t.map.get(&("t".to_string(), 0)).map(Vec::len), Some(1));
    }

    #[test]
    fn a_map_of_live_waiters_is_swept_once_per_doubling() {
        let a = Arrivals::default();
        let live: Vec<_> = (0..1024u32).map(|_| Arc::new(Notify::new())).collect();
        for (i, n) in live.iter().enumerate() {
            a.register("t", i as u32, n);
        }
        // 1024 live keys: the sweep keeps them all and moves its mark to
        // twice that, so registering more on the same keys sweeps no more.
        a.register("t", 0, &live[1]);
        assert_eq!(a.waiters.lock().map(|t| t.sweep_at).unwrap_or(0), 2048);
        assert_eq!(a.waiting_queues(), 1024);
    }

    #[tokio::test]
    async fn deferred_wake_ups_wait_for_the_flush() {
        let a = Arrivals::deferred();
        let n = Arc::new(Notify::new());
        a.register("t", 0, &n);
        a.notify("t", 0);
        a.notify("t", 1);
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), n.notified()).await;
        assert!(early.is_err(), "woken before the flush");
        a.flushed();
        let woke = tokio::time::timeout(std::time::Duration::from_millis(100), n.notified()).await;
        assert!(woke.is_ok());
        assert_eq!(
            a.pending.as_ref().map(|p| p.lock().map(|s| s.len()).unwrap_or(9)),
            Some(0)
        );
    }
}

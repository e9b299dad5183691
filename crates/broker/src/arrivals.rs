//! Wake-ups for long polls: a waiter registers on the queues it reads, and an
//! append to a queue wakes exactly the waiters registered on that queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

type Waiters = Vec<Weak<Notify>>;

/// Registry of waiters per (topic, queue).
#[derive(Debug, Default)]
pub struct Arrivals {
    waiters: Mutex<HashMap<(String, u32), Waiters>>,
}

impl Arrivals {
    /// Registers `waiter` to be notified on the next append to (topic, queue).
    /// Registration is one-shot: re-register after each wake-up.
    pub fn register(&self, topic: &str, queue: u32, waiter: &Arc<Notify>) {
        let mut m = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let list = m.entry((topic.to_string(), queue)).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(waiter));
    }

    /// Wakes the waiters of (topic, queue).
    pub fn notify(&self, topic: &str, queue: u32) {
        let list = {
            let mut m = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            if m.is_empty() {
                return;
            }
            m.remove(&(topic.to_string(), queue))
        };
        for w in list.into_iter().flatten() {
            if let Some(n) = w.upgrade() {
                n.notify_one();
            }
        }
    }

    /// Number of (topic, queue) keys with registered waiters.
    pub fn waiting_queues(&self) -> usize {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

//! Pop consumption (RocketMQ 5): the broker hands a group's messages out
//! with an invisible duration instead of giving a consumer whole queues.
//! A message handed out is *in flight* until it is acked; one not acked
//! before its invisible duration ends is handed out again, its delivery
//! attempt one higher. Every (group, topic, queue) has a cursor (the next
//! offset never handed out) and its in-flight offsets; the group's
//! committed offset is the lowest offset not yet acked, so queue-owning
//! consumers (remoting, Kafka) and a restart start where pops left off.
//!
//! Each handout carries a receipt handle naming the queue, the offset and
//! a delivery number: an ack or a change of invisible duration must name
//! the latest handout of the offset (a handle from before a redelivery is
//! refused, as Apache RocketMQ refuses a stale handle).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// A message handed out and not yet acked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// When it becomes visible again (ms since the epoch).
    pub visible_at_ms: i64,
    /// Deliveries so far (1 on the first handout).
    pub attempt: u32,
    /// The delivery number its current receipt handle names.
    pub delivery: u64,
    /// When it was first handed out (ms), for the process-time histogram.
    pub first_handed_ms: i64,
}

/// The pop state of one (group, topic, queue).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueuePops {
    /// The next offset never handed out.
    pub cursor: u64,
    /// Handed out, not acked, by offset.
    pub in_flight: BTreeMap<u64, InFlight>,
    /// The group's committed offset as this state last wrote or adopted
    /// it: a different one in the offset table was set by someone else
    /// (an offset reset) and moves the cursor there.
    #[serde(default)]
    pub committed: Option<u64>,
    /// A FIFO group: the attempt id of the receive that took the batch in
    /// flight. A receive retried with it (a client that lost the answer)
    /// gets the same batch again instead of waiting out its invisible time.
    #[serde(skip)]
    pub fifo_attempt: Option<String>,
}

impl QueuePops {
    /// The lowest offset not acked: what the group's committed offset is.
    pub fn low_watermark(&self) -> u64 {
        self.in_flight
            .keys()
            .next()
            .map_or(self.cursor, |o| (*o).min(self.cursor))
    }

    /// In-flight offsets whose invisible time is over at `now_ms`, oldest
    /// first, at most `n`.
    pub fn due(&self, now_ms: i64, n: usize) -> Vec<(u64, InFlight)> {
        self.in_flight
            .iter()
            .filter(|(_, f)| f.visible_at_ms <= now_ms)
            .take(n)
            .map(|(o, f)| (*o, *f))
            .collect()
    }

    /// When the next in-flight message becomes visible (None: none in flight).
    pub fn next_visible_ms(&self) -> Option<i64> {
        self.in_flight.values().map(|f| f.visible_at_ms).min()
    }

    /// When the next in-flight message still invisible at `now_ms` becomes
    /// visible (None: none is).
    pub fn next_visible_after(&self, now_ms: i64) -> Option<i64> {
        self.in_flight
            .values()
            .map(|f| f.visible_at_ms)
            .filter(|v| *v > now_ms)
            .min()
    }
}

/// A receipt handle's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub queue: u32,
    pub offset: u64,
    pub delivery: u64,
}

impl Receipt {
    /// `<queue>_<offset>_<delivery>` in hex; opaque to clients.
    pub fn encode(&self) -> String {
        format!("r1_{:x}_{:x}_{:x}", self.queue, self.offset, self.delivery)
    }

    pub fn decode(s: &str) -> Option<Receipt> {
        let mut it = s.strip_prefix("r1_")?.split('_');
        let queue = u32::from_str_radix(it.next()?, 16).ok()?;
        let offset = u64::from_str_radix(it.next()?, 16).ok()?;
        let delivery = u64::from_str_radix(it.next()?, 16).ok()?;
        it.next().is_none().then_some(Receipt {
            queue,
            offset,
            delivery,
        })
    }
}

/// Why an ack or a change of invisible duration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleError {
    /// Nothing of this group is in flight at that offset (acked already,
    /// or never handed out).
    NotInFlight,
    /// The handle is from an earlier handout of the offset.
    Stale,
    /// Not in flight, but handed out before (below the queue's cursor):
    /// acked already, as far as the caller can tell (an ack answers it OK).
    Acked,
}

pub type Key = (String, String, u32);

/// Every group's pop state, with budgets on the in-flight entries and on
/// the (group, topic, queue) states.
#[derive(Debug)]
pub struct Pops {
    queues: Mutex<HashMap<Key, Arc<Mutex<QueuePops>>>>,
    next_delivery: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: u64,
    max_queues: usize,
    /// Bumped on every change, for persisting only when something changed.
    changes: AtomicU64,
    persisted: AtomicU64,
}

/// One queue's state in the pop state file.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    group: String,
    topic: String,
    queue: u32,
    cursor: u64,
    in_flight: Vec<(u64, InFlight)>,
    #[serde(default)]
    committed: Option<u64>,
}

/// How far delivery numbers move on past the saved ones at a restart.
const RESTART_GAP: u64 = 1 << 32;

impl Pops {
    pub fn new(max_in_flight: u64, max_queues: usize) -> Pops {
        Pops {
            queues: Mutex::new(HashMap::new()),
            // Delivery numbers start at a random point so handles from
            // before a restart do not match new handouts by accident.
            next_delivery: AtomicU64::new(u64::from(rand::random::<u32>()) << 16),
            in_flight: AtomicU64::new(0),
            max_in_flight: max_in_flight.max(1),
            max_queues: max_queues.max(1),
            changes: AtomicU64::new(0),
            persisted: AtomicU64::new(0),
        }
    }

    /// The state of one queue, created with `cursor` from `init` the first
    /// time (the group's committed offset, or where a new group starts).
    /// None when `max_queues` states exist and none can be let go (a
    /// state with nothing in flight is dropped to make room: its place is
    /// the group's committed offset).
    pub fn queue(
        &self,
        group: &str,
        topic: &str,
        queue: u32,
        init: impl FnOnce() -> u64,
    ) -> Option<Arc<Mutex<QueuePops>>> {
        let mut q = lock(&self.queues);
        let key = (group.to_string(), topic.to_string(), queue);
        if let Some(st) = q.get(&key) {
            return Some(Arc::clone(st));
        }
        if q.len() >= self.max_queues {
            let idle = q
                .iter()
                .find(|(_, st)| Arc::strong_count(st) == 1 && lock(st).in_flight.is_empty())
                .map(|(k, _)| k.clone());
            match idle {
                Some(k) => {
                    q.remove(&k);
                }
                None => {
                    metrics::counter!("rokka_rocketmq5_pop_queues_refused_total").increment(1);
                    return None;
                }
            }
        }
        let st = Arc::new(Mutex::new(QueuePops {
            cursor: init(),
            ..QueuePops::default()
        }));
        q.insert(key, Arc::clone(&st));
        metrics::gauge!("rokka_rocketmq5_pop_queues").set(q.len() as f64);
        Some(st)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
    }

    /// Loads the pop state file written by `persist` (none: empty).
    pub fn load(&self, path: &std::path::Path) -> crate::Result<()> {
        let saved: Vec<Saved> = crate::json_file::read_or_default(path)?;
        self.restore(
            saved
                .into_iter()
                .map(|s| {
                    (
                        s.group,
                        s.topic,
                        s.queue,
                        QueuePops {
                            cursor: s.cursor,
                            in_flight: s.in_flight.into_iter().collect(),
                            committed: s.committed,
                            // Not kept across a restart: a retried
                            // receive then waits out the invisible time.
                            fifo_attempt: None,
                        },
                    )
                })
                .collect(),
        );
        self.persisted
            .store(self.changes.load(Ordering::Relaxed), Ordering::Relaxed);
        Ok(())
    }

    /// Writes every queue's state to `path` when something changed since
    /// the last write (atomically, fsynced).
    pub fn persist_if_dirty(&self, path: &std::path::Path) -> crate::Result<()> {
        let now = self.changes.load(Ordering::Relaxed);
        if now == self.persisted.load(Ordering::Relaxed) {
            return Ok(());
        }
        let saved: Vec<Saved> = self
            .snapshot()
            .into_iter()
            .map(|(group, topic, queue, st)| Saved {
                group,
                topic,
                queue,
                cursor: st.cursor,
                in_flight: st.in_flight.into_iter().collect(),
                committed: st.committed,
            })
            .collect();
        crate::json_file::write(path, &saved, false)?;
        self.persisted.store(now, Ordering::Relaxed);
        Ok(())
    }

    /// The state of one queue if it has any.
    pub fn existing(&self, group: &str, topic: &str, queue: u32) -> Option<Arc<Mutex<QueuePops>>> {
        lock(&self.queues)
            .get(&(group.to_string(), topic.to_string(), queue))
            .map(Arc::clone)
    }

    /// Whether another message may go in flight (the budget
    /// `grpc.max_in_flight_messages` over all groups).
    pub fn has_room(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) < self.max_in_flight
    }

    /// Hands `offset` out (first time, or again after its invisible time):
    /// the handle of this handout.
    pub fn hand_out(
        &self,
        st: &mut QueuePops,
        queue: u32,
        offset: u64,
        visible_at_ms: i64,
        now_ms: i64,
    ) -> (Receipt, u32) {
        let delivery = self.next_delivery.fetch_add(1, Ordering::Relaxed);
        let entry = st.in_flight.entry(offset);
        let f = match entry {
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let f = o.get_mut();
                f.attempt += 1;
                f.delivery = delivery;
                f.visible_at_ms = visible_at_ms;
                *f
            }
            std::collections::btree_map::Entry::Vacant(v) => {
                self.in_flight.fetch_add(1, Ordering::Relaxed);
                *v.insert(InFlight {
                    visible_at_ms,
                    attempt: 1,
                    delivery,
                    first_handed_ms: now_ms,
                })
            }
        };
        if offset >= st.cursor {
            st.cursor = offset + 1;
        }
        self.changed();
        self.publish_gauge();
        (
            Receipt {
                queue,
                offset,
                delivery,
            },
            f.attempt,
        )
    }

    /// Hands an in-flight message out again under a new receipt handle
    /// without counting a delivery: the same attempt's retry of a receive
    /// whose answer never reached the client (Apache's orderly pop keeps
    /// the consumed counts for a repeated attempt id). None if it is not in
    /// flight.
    pub fn hand_again(
        &self,
        st: &mut QueuePops,
        queue: u32,
        offset: u64,
        visible_at_ms: i64,
    ) -> Option<(Receipt, u32)> {
        let f = st.in_flight.get_mut(&offset)?;
        let delivery = self.next_delivery.fetch_add(1, Ordering::Relaxed);
        f.delivery = delivery;
        f.visible_at_ms = visible_at_ms;
        let attempt = f.attempt;
        self.changed();
        Some((
            Receipt {
                queue,
                offset,
                delivery,
            },
            attempt,
        ))
    }

    /// Acks the handout `r` names: the in-flight entry it removed.
    pub fn ack(&self, st: &mut QueuePops, r: &Receipt) -> Result<InFlight, HandleError> {
        match st.in_flight.get(&r.offset) {
            None => Err(HandleError::NotInFlight),
            Some(f) if f.delivery != r.delivery => Err(HandleError::Stale),
            Some(_) => {
                let f = st.in_flight.remove(&r.offset).ok_or(HandleError::NotInFlight)?;
                self.in_flight.fetch_sub(1, Ordering::Relaxed);
                self.changed();
                self.publish_gauge();
                Ok(f)
            }
        }
    }

    /// Removes an in-flight offset whatever its handle (sent to the dead
    /// letter queue, or gone from the store).
    pub fn forget(&self, st: &mut QueuePops, offset: u64) {
        if st.in_flight.remove(&offset).is_some() {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.changed();
            self.publish_gauge();
        }
    }

    /// Gives the handout `r` names a new invisible time: its new handle.
    pub fn change_invisible(
        &self,
        st: &mut QueuePops,
        r: &Receipt,
        visible_at_ms: i64,
    ) -> Result<Receipt, HandleError> {
        let delivery = self.next_delivery.fetch_add(1, Ordering::Relaxed);
        match st.in_flight.get_mut(&r.offset) {
            None => Err(HandleError::NotInFlight),
            Some(f) if f.delivery != r.delivery => Err(HandleError::Stale),
            Some(f) => {
                f.delivery = delivery;
                f.visible_at_ms = visible_at_ms;
                self.changed();
                Ok(Receipt {
                    queue: r.queue,
                    offset: r.offset,
                    delivery,
                })
            }
        }
    }

    /// Keeps the handout `delivery` of `offset` invisible until
    /// `visible_at_ms`, its handle unchanged (a push consumer's auto-renew:
    /// the client acks with the handle it was given). False when that
    /// handout is no longer in flight (acked, or delivered again).
    pub fn renew(&self, st: &mut QueuePops, offset: u64, delivery: u64, visible_at_ms: i64) -> bool {
        match st.in_flight.get_mut(&offset) {
            Some(f) if f.delivery == delivery => {
                if visible_at_ms != f.visible_at_ms {
                    f.visible_at_ms = visible_at_ms;
                    self.changed();
                }
                true
            }
            _ => false,
        }
    }

    /// Messages in flight over every group.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn publish_gauge(&self) {
        metrics::gauge!("rokka_rocketmq5_messages_inflight").set(self.in_flight.load(Ordering::Relaxed) as f64);
    }

    /// Every queue's state handle (the map's lock is released before any
    /// queue's is taken).
    fn handles(&self) -> Vec<(Key, Arc<Mutex<QueuePops>>)> {
        lock(&self.queues)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect()
    }

    /// Per (group, topic, queue) with a pop state: its cursor, the
    /// messages in flight whose invisible time is over at `now_ms`, and
    /// those still invisible (for RIP-46's ready and inflight counts).
    pub fn progress(&self, now_ms: i64) -> BTreeMap<Key, (u64, u64, u64)> {
        let queues = self.handles();
        queues
            .into_iter()
            .map(|(k, st)| {
                let st = lock(&st);
                let due = st.in_flight.values().filter(|f| f.visible_at_ms <= now_ms).count() as u64;
                (k, (st.cursor, due, st.in_flight.len() as u64 - due))
            })
            .collect()
    }

    /// Every queue's state, for persisting.
    pub fn snapshot(&self) -> Vec<(String, String, u32, QueuePops)> {
        let queues = self.handles();
        queues
            .into_iter()
            .filter_map(|((g, t, q), st)| {
                let st = lock(&st).clone();
                (!st.in_flight.is_empty()).then_some((g, t, q, st))
            })
            .collect()
    }

    /// Restores persisted in-flight state (at start, before serving):
    /// the handles stay valid; entries past the budget are dropped (they
    /// are delivered again from the committed offset).
    pub fn restore(&self, entries: Vec<(String, String, u32, QueuePops)>) {
        let mut q = lock(&self.queues);
        let mut max_delivery = 0;
        for (g, t, queue, st) in entries {
            let n = st.in_flight.len() as u64;
            if self.in_flight.load(Ordering::Relaxed) + n > self.max_in_flight || q.len() >= self.max_queues {
                continue;
            }
            max_delivery = max_delivery.max(st.in_flight.values().map(|f| f.delivery).max().unwrap_or(0));
            self.in_flight.fetch_add(n, Ordering::Relaxed);
            q.insert((g, t, queue), Arc::new(Mutex::new(st)));
        }
        // Past the saved numbers by more than could have been handed out
        // after the last save (it runs every second): numbering resumed at
        // the saved maximum gave a crash's lost handouts' numbers again —
        // the same offsets in the same order, so a handle from before the
        // crash matched another consumer's delivery after it.
        self.next_delivery
            .fetch_max(max_delivery.saturating_add(RESTART_GAP), Ordering::Relaxed);
        drop(q);
        self.publish_gauge();
    }

    /// Starts a queue's state over at `offset` (its committed offset was
    /// reset elsewhere): what was in flight is forgotten, its handles go
    /// stale.
    pub fn rewind(&self, st: &mut QueuePops, offset: u64) {
        let n = st.in_flight.len() as u64;
        st.in_flight.clear();
        st.cursor = offset;
        st.committed = Some(offset);
        self.in_flight.fetch_sub(n, Ordering::Relaxed);
        self.changed();
        self.publish_gauge();
        metrics::counter!("rokka_rocketmq5_pop_rewinds_total").increment(1);
    }

    /// Starts a group's state of a queue over at `offset` (its offset was
    /// reset). In place, under the state's lock: a receive or ack holding
    /// the state meanwhile sees it rewound (a state taken out of the map
    /// while one held it had its in-flight count taken off twice — once
    /// here, once by that holder's own rewind or ack — and the node's
    /// budget wrapped and refused every receive).
    pub fn reset(&self, group: &str, topic: &str, queue: u32, offset: u64) {
        let held = lock(&self.queues)
            .get(&(group.to_string(), topic.to_string(), queue))
            .cloned();
        if let Some(st) = held {
            self.rewind(&mut lock(&st), offset);
        }
    }
}

/// Locks a mutex whose holder may have panicked (the state stays usable:
/// every change to it is a single assignment or map operation).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_round_trip_and_refuse_garbage() {
        let r = Receipt {
            queue: 3,
            offset: 1 << 40,
            delivery: 77,
        };
        assert_eq!(Receipt::decode(&r.encode()), Some(r));
        for bad in ["", "r1_", "r1_1_2", "r1_1_2_3_4", "r2_1_2_3", "r1_x_2_3"] {
            assert_eq!(Receipt::decode(bad), None, "{bad}");
        }
    }

    /// A crash loses the handouts after the last save: after the restart
    /// no delivery number handed out then comes again (their handles
    /// would match other consumers' deliveries of the same offsets).
    #[test]
    fn delivery_numbers_after_a_restart_pass_everything_handed_out_before() {
        let before = Pops::new(100, 10);
        let st = before.queue("g", "t", 0, || 0).expect("room");
        let (a, _) = before.hand_out(&mut lock(&st), 0, 0, 60_000, 0);
        let saved = before.snapshot();
        // Handed out after the save, then the crash.
        let lost: Vec<Receipt> = {
            let mut st = lock(&st);
            (1..20).map(|o| before.hand_out(&mut st, 0, o, 60_000, 0).0).collect()
        };
        assert!(lost.iter().all(|r| r.delivery > a.delivery));
        for _ in 0..50 {
            // A fresh start draws its own random first number.
            let after = Pops::new(100, 10);
            after.restore(saved.clone());
            let st = after.queue("g", "t", 0, || 0).expect("restored");
            let mut st = lock(&st);
            for o in 1..20 {
                let (r, _) = after.hand_out(&mut st, 0, o, 60_000, 0);
                assert!(
                    lost.iter().all(|l| l.delivery != r.delivery),
                    "delivery {} of offset {o} was handed out before the crash",
                    r.delivery
                );
            }
        }
    }

    #[test]
    fn hand_out_ack_redeliver_and_watermark() {
        let pops = Pops::new(10, 10);
        let st = pops.queue("g", "t", 0, || 5).expect("room");
        let mut st = lock(&st);
        let (a, n) = pops.hand_out(&mut st, 0, 5, 1_000, 0);
        assert_eq!(n, 1);
        let (b, _) = pops.hand_out(&mut st, 0, 6, 1_000, 0);
        assert_eq!((st.cursor, st.low_watermark(), pops.in_flight()), (7, 5, 2));
        // Offset 6 acked first: the watermark waits for 5.
        assert!(pops.ack(&mut st, &b).is_ok());
        assert_eq!(st.low_watermark(), 5);
        // 5 is due after its invisible time; a redelivery outdates its handle.
        assert!(st.due(999, 10).is_empty());
        assert_eq!(st.due(1_000, 10).len(), 1);
        let (a2, n2) = pops.hand_out(&mut st, 0, 5, 2_000, 1_000);
        assert_eq!(n2, 2);
        assert_eq!(pops.ack(&mut st, &a), Err(HandleError::Stale));
        let a3 = pops.change_invisible(&mut st, &a2, 3_000).expect("current handle");
        assert_eq!(pops.ack(&mut st, &a2), Err(HandleError::Stale));
        assert!(pops.ack(&mut st, &a3).is_ok());
        assert_eq!(pops.ack(&mut st, &a3), Err(HandleError::NotInFlight));
        assert_eq!((st.low_watermark(), pops.in_flight()), (7, 0));
    }

    #[test]
    fn the_next_visible_time_after_now_leaves_out_what_is_due() {
        let pops = Pops::new(10, 10);
        let st = pops.queue("g", "t", 0, || 0).expect("room");
        let mut st = lock(&st);
        pops.hand_out(&mut st, 0, 0, 1_000, 0);
        pops.hand_out(&mut st, 0, 1, 5_000, 0);
        assert_eq!(st.next_visible_ms(), Some(1_000));
        assert_eq!(st.next_visible_after(2_000), Some(5_000));
        assert_eq!(st.next_visible_after(6_000), None);
    }

    #[test]
    fn the_state_file_keeps_handles_across_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config").join("pop-state.json");
        let pops = Pops::new(2, 10);
        let st = pops.queue("g", "t", 1, || 0).expect("room");
        let (r, r2) = {
            let mut st = lock(&st);
            (
                pops.hand_out(&mut st, 1, 0, 10, 0).0,
                pops.hand_out(&mut st, 1, 1, 10, 0).0,
            )
        };
        pops.ack(&mut lock(&st), &r2).expect("acked");
        pops.persist_if_dirty(&path).expect("written");
        let again = Pops::new(2, 10);
        again.load(&path).expect("read");
        let st = again.existing("g", "t", 1).expect("restored");
        let mut st = lock(&st);
        // Offset 1 was acked: not in flight after the restart; 0 still is.
        assert_eq!(again.ack(&mut st, &r2), Err(HandleError::NotInFlight));
        assert_eq!(st.cursor, 2);
        assert!(again.ack(&mut st, &r).is_ok());
        assert!(again.has_room());
    }

    /// An offset reset while a receive or an ack holds the queue's state:
    /// the in-flight count is taken off once (it was taken off twice, the
    /// node-wide count wrapped and every receive was refused).
    #[test]
    fn a_reset_while_the_state_is_held_counts_its_messages_off_once() {
        let pops = Pops::new(4, 10);
        let st = pops.queue("g", "t", 0, || 0).expect("room");
        let r = {
            let mut st = lock(&st);
            let r = pops.hand_out(&mut st, 0, 0, 10, 0).0;
            pops.hand_out(&mut st, 0, 1, 10, 0);
            pops.hand_out(&mut st, 0, 2, 10, 0);
            r
        };
        assert_eq!(pops.in_flight(), 3);
        pops.reset("g", "t", 0, 7);
        assert_eq!(pops.in_flight(), 0);
        // The holder finds it rewound: its own follow-up and its ack take
        // nothing off again.
        let mut held = lock(&st);
        assert_eq!(held.cursor, 7);
        pops.rewind(&mut held, 7);
        assert!(pops.ack(&mut held, &r).is_err());
        assert_eq!(pops.in_flight(), 0);
        assert!(pops.has_room());
        drop(held);
        // And the state is the map's still: what is handed out later counts.
        let again = pops.existing("g", "t", 0).expect("kept");
        assert!(Arc::ptr_eq(&again, &st));
    }

    #[test]
    fn queue_states_are_bounded_and_idle_ones_make_room() {
        let pops = Pops::new(10, 2);
        let a = pops.queue("g", "t", 0, || 0).expect("room");
        pops.hand_out(&mut lock(&a), 0, 0, 10, 0);
        drop(a);
        let b = pops.queue("g", "t", 1, || 0).expect("room");
        // Full: the idle state of queue 1 is held by `b`, queue 0 has a
        // message in flight; nothing can go.
        assert!(pops.queue("g", "t", 2, || 0).is_none());
        drop(b);
        assert!(pops.queue("g", "t", 2, || 0).is_some(), "the idle one made room");
        assert!(pops.existing("g", "t", 0).is_some(), "in flight: kept");
    }
}

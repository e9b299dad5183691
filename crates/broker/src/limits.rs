//! Budgets a client can make a listener spend: connections (per listener
//! and per source address) and request bytes in flight. Each is a config
//! key of its listener and a metric labelled with the listener's name.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A log line a client can cause on every request or connection, written
/// at most once per period (the store's, shared).
pub use rokka_store::LogEvery;

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The listener holds its `max_connections`.
    ListenerFull,
    /// This source address holds its `max_connections_per_ip`.
    AddressFull,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::ListenerFull => "listener_limit",
            Refused::AddressFull => "per_ip_limit",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    /// Only addresses with a live connection: at most `total` entries.
    by_ip: HashMap<IpAddr, usize>,
}

/// Connection counts of one listener.
#[derive(Debug)]
pub struct ConnLimits {
    listener: &'static str,
    max_total: usize,
    max_per_ip: usize,
    counts: Mutex<Counts>,
}

/// A live connection's place in its listener's counts; released on drop.
#[derive(Debug)]
pub struct ConnSlot {
    limits: Arc<ConnLimits>,
    ip: IpAddr,
}

impl ConnLimits {
    /// `max_total` / `max_per_ip` of 0 mean no limit.
    pub fn new(listener: &'static str, max_total: usize, max_per_ip: usize) -> Arc<ConnLimits> {
        Arc::new(ConnLimits {
            listener,
            max_total: if max_total == 0 { usize::MAX } else { max_total },
            max_per_ip: if max_per_ip == 0 { usize::MAX } else { max_per_ip },
            counts: Mutex::new(Counts::default()),
        })
    }

    /// Takes a slot for a connection from `ip`, or says why not (counted in
    /// `rokka_connections_refused_total`).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnSlot, Refused> {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let refused = if c.total >= self.max_total {
            Some(Refused::ListenerFull)
        } else if c.by_ip.get(&ip).copied().unwrap_or(0) >= self.max_per_ip {
            Some(Refused::AddressFull)
        } else {
            None
        };
        if let Some(why) = refused {
            metrics::counter!("rokka_connections_refused_total", "listener" => self.listener, "reason" => why.as_str())
                .increment(1);
            return Err(why);
        }
        c.total += 1;
        *c.by_ip.entry(ip).or_insert(0) += 1;
        metrics::gauge!("rokka_connections_open", "listener" => self.listener).set(c.total as f64);
        Ok(ConnSlot {
            limits: Arc::clone(self),
            ip,
        })
    }

    /// Open connections.
    pub fn open(&self) -> usize {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).total
    }

    /// Source addresses with an open connection.
    pub fn addresses(&self) -> usize {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).by_ip.len()
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.limits.counts.lock().unwrap_or_else(PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.by_ip.remove(&self.ip);
            }
        }
        metrics::gauge!("rokka_connections_open", "listener" => self.limits.listener).set(c.total as f64);
    }
}

/// A listener-wide budget of request bytes held in memory at once (Kafka's
/// `queued.max.request.bytes`): a connection reserves a frame's declared
/// size before reading it and waits — not reading, so TCP pushes back on
/// the client — until the budget has room. Waiters are not served in
/// order (as Kafka's memory pool, which a muted connection tries again):
/// a connection that declared a frame larger than the room left waits
/// alone, while smaller frames of other connections go by — in order, one
/// large waiter held up every request of the listener behind it.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    listener: &'static str,
    sem: Arc<Semaphore>,
    /// Woken when reserved bytes are returned: waiters try again.
    freed: Arc<Freed>,
    /// Permits are KiB, so a u32 request of permits covers any frame.
    total_kib: usize,
}

/// The waiters of a [`ByteBudget`]: counted, so a return with none waiting
/// (the common case) takes no lock.
#[derive(Debug, Default)]
struct Freed {
    notify: tokio::sync::Notify,
    waiting: std::sync::atomic::AtomicUsize,
}

/// Bytes reserved from a [`ByteBudget`]; returned on drop.
#[derive(Debug)]
pub struct Reserved {
    permit: Option<OwnedSemaphorePermit>,
    freed: Option<Arc<Freed>>,
    listener: &'static str,
    kib: usize,
}

impl ByteBudget {
    /// A budget of `bytes` (0 = no limit).
    pub fn new(listener: &'static str, bytes: u64) -> ByteBudget {
        let total_kib = if bytes == 0 {
            Semaphore::MAX_PERMITS
        } else {
            (bytes.div_ceil(1024) as usize).min(Semaphore::MAX_PERMITS)
        };
        ByteBudget {
            listener,
            sem: Arc::new(Semaphore::new(total_kib)),
            freed: Arc::new(Freed::default()),
            total_kib,
        }
    }

    /// Waits until `bytes` fit in the budget. A frame larger than the whole
    /// budget waits for the whole budget (and holds it alone).
    pub async fn reserve(&self, bytes: usize) -> Reserved {
        // A cooperative yield point, as the semaphore's own acquire was: a
        // connection with many frames buffered does not decode them all
        // before the tasks they start (and its other connections' readers)
        // get to run.
        tokio::task::consume_budget().await;
        if let Some(r) = self.try_reserve(bytes) {
            return r;
        }
        // Counted as waiting first, then registered, then tried again: a
        // return after the count sees it and wakes this waiter.
        // (Uncounted when done, or when the wait is given up.)
        struct Waiting<'a>(&'a Freed);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.waiting.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.freed.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.freed);
        loop {
            let freed = self.freed.notify.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(r) = self.try_reserve(bytes) {
                break r;
            }
            freed.await;
        }
    }

    /// `bytes` now if they fit, else `None` (and nothing is taken): for a
    /// listener that cannot hold a reader back without holding what it read.
    pub fn try_reserve(&self, bytes: usize) -> Option<Reserved> {
        let kib = bytes.div_ceil(1024).clamp(1, self.total_kib);
        let permit = Arc::clone(&self.sem).try_acquire_many_owned(kib as u32).ok()?;
        crate::hot_metrics::gauge_add(
            "rokka_inflight_request_bytes",
            "listener",
            self.listener,
            (kib * 1024) as f64,
        );
        Some(Reserved {
            permit: Some(permit),
            freed: Some(Arc::clone(&self.freed)),
            listener: self.listener,
            kib,
        })
    }

    /// KiB free now.
    pub fn available_kib(&self) -> usize {
        self.sem.available_permits()
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // The bytes go back first, then every waiter tries again.
        drop(self.permit.take());
        if let Some(f) = &self.freed {
            if f.waiting.load(Ordering::SeqCst) > 0 {
                f.notify.notify_waiters();
            }
        }
        crate::hot_metrics::gauge_add(
            "rokka_inflight_request_bytes",
            "listener",
            self.listener,
            -((self.kib * 1024) as f64),
        );
    }
}

/// Failed authentications per source address: one that failed `max`
/// times within `window` is held off (Kafka: no new SASL connections;
/// RocketMQ: signed requests refused unchecked) until the window has
/// passed since its first failure. Bounded: at most
/// `MAX_TRACKED` addresses (expired ones are dropped first; beyond it new
/// addresses are not tracked).
#[derive(Debug)]
pub struct AuthFailures {
    /// The gauge of the addresses being counted.
    gauge: &'static str,
    max: u32,
    window: std::time::Duration,
    by_ip: Mutex<HashMap<IpAddr, (u32, std::time::Instant)>>,
    /// `by_ip.len()`, so that [`AuthFailures::blocked`] — asked on every
    /// signed RocketMQ request — takes no lock while nothing failed.
    tracked: std::sync::atomic::AtomicUsize,
}

impl AuthFailures {
    pub const MAX_TRACKED: usize = 10_000;

    pub fn new(gauge: &'static str, max: u32, window: std::time::Duration) -> AuthFailures {
        AuthFailures {
            gauge,
            max: max.max(1),
            window,
            by_ip: Default::default(),
            tracked: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, (u32, std::time::Instant)>> {
        self.by_ip.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a failed authentication from `ip`.
    pub fn failed(&self, ip: IpAddr) {
        let now = std::time::Instant::now();
        let mut m = self.lock();
        if !m.contains_key(&ip) && m.len() >= Self::MAX_TRACKED {
            m.retain(|_, (_, since)| now.duration_since(*since) < self.window);
            if m.len() >= Self::MAX_TRACKED {
                return;
            }
        }
        let e = m.entry(ip).or_insert((0, now));
        if now.duration_since(e.1) >= self.window {
            *e = (0, now);
        }
        e.0 = e.0.saturating_add(1);
        self.counted(m.len());
    }

    fn counted(&self, n: usize) {
        self.tracked.store(n, std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!(self.gauge).set(n as f64);
    }

    /// Whether `ip` is held off now.
    pub fn blocked(&self, ip: IpAddr) -> bool {
        if self.tracked.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return false;
        }
        let now = std::time::Instant::now();
        let mut m = self.lock();
        match m.get(&ip) {
            Some((n, since)) if now.duration_since(*since) < self.window => *n >= self.max,
            Some(_) => {
                m.remove(&ip);
                self.counted(m.len());
                false
            }
            None => false,
        }
    }
}

/// How writing an answer went ([`write_with_progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    All,
    /// The connection failed (or closed).
    Failed,
    /// The client took nothing for the whole stall timeout.
    Stalled,
}

/// Writes `chunks` and flushes them, giving up if the client takes no byte
/// for `stall` (its socket buffer full: a client that stopped reading).
/// The clock restarts with every write that moves bytes, so a slow reader
/// that keeps reading is not cut off however long the whole answer takes.
pub async fn write_with_progress<W, C>(wr: &mut W, chunks: &[C], stall: std::time::Duration) -> Written
where
    W: tokio::io::AsyncWrite + Unpin,
    C: AsRef<[u8]>,
{
    use tokio::io::AsyncWriteExt;
    for c in chunks {
        let mut buf = c.as_ref();
        while !buf.is_empty() {
            match tokio::time::timeout(stall, wr.write(buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Written::Failed,
                Ok(Ok(n)) => buf = &buf[n..],
                Err(_) => return Written::Stalled,
            }
        }
    }
    match tokio::time::timeout(stall, wr.flush()).await {
        Ok(Ok(())) => Written::All,
        Ok(Err(_)) => Written::Failed,
        Err(_) => Written::Stalled,
    }
}

/// Accept failures of one listener (EMFILE or ENFILE while descriptors are
/// short, ENOBUFS, ECONNABORTED...): counted in
/// `rokka_accept_errors_total{listener}` and logged at most once a minute —
/// a listener out of descriptors fails ten times a second, and one at its
/// limit with connections coming and going alternates between failing and
/// accepting — with a line when accepting works again after a logged run.
#[derive(Debug)]
pub struct AcceptErrors {
    listener: &'static str,
    run: u64,
    run_logged: bool,
    logged: Option<std::time::Instant>,
}

impl AcceptErrors {
    /// How long a listener pauses after a failed accept, so it does not
    /// spin while descriptors are short.
    pub const PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

    pub fn new(listener: &'static str) -> AcceptErrors {
        AcceptErrors {
            listener,
            run: 0,
            run_logged: false,
            logged: None,
        }
    }

    /// A connection was accepted: ends a run of failures.
    pub fn accepted(&mut self) {
        if self.run > 0 {
            if self.run_logged {
                tracing::info!(
                    listener = self.listener,
                    failures = self.run,
                    "accepting connections again"
                );
            }
            self.run = 0;
            self.run_logged = false;
        }
    }

    /// Counts (and maybe logs) a failed accept; returns whether it was
    /// logged. The caller then pauses [`AcceptErrors::PAUSE`].
    pub fn failed(&mut self, e: &std::io::Error) -> bool {
        metrics::counter!("rokka_accept_errors_total", "listener" => self.listener).increment(1);
        self.run += 1;
        let now = std::time::Instant::now();
        let due = self
            .logged
            .is_none_or(|at| now.duration_since(at) >= std::time::Duration::from_secs(60));
        if due {
            tracing::warn!(
                listener = self.listener,
                error = %e,
                failures = self.run,
                "accept failed (while it goes on, logged once a minute)"
            );
            self.logged = Some(now);
            self.run_logged = true;
        }
        due
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_limited_log_line_is_ready_once_per_period() {
        let l = super::LogEvery::new(60_000);
        assert!(l.ready());
        assert!(!l.ready() && !l.ready(), "not again within the period");
        let every = super::LogEvery::new(0);
        assert!(every.ready() && every.ready());
    }

    use super::*;

    #[test]
    fn an_address_is_held_off_after_its_failures_until_the_window_passes() {
        let window = std::time::Duration::from_millis(50);
        let f = AuthFailures::new("rokka_test_failing_addresses", 2, window);
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        assert!(!f.blocked(a), "nothing failed yet");
        f.failed(a);
        assert!(!f.blocked(a), "one failure of two");
        f.failed(a);
        assert!(f.blocked(a) && !f.blocked(b), "only the failing address");
        std::thread::sleep(window + std::time::Duration::from_millis(10));
        assert!(!f.blocked(a), "the window passed");
        assert_eq!(
            f.tracked.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "and it is forgotten"
        );
    }

    #[test]
    fn connection_slots_are_counted_and_released() {
        let l = ConnLimits::new("t", 3, 2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let s1 = l.admit(a);
        let s2 = l.admit(a);
        assert!(s1.is_ok() && s2.is_ok());
        assert_eq!(l.admit(a).err(), Some(Refused::AddressFull));
        let s3 = l.admit(b);
        assert!(s3.is_ok());
        assert_eq!(l.admit(b).err(), Some(Refused::ListenerFull));
        drop(s1);
        assert_eq!(l.open(), 2);
        let s4 = l.admit(b);
        assert!(s4.is_ok());
        drop((s2, s3, s4));
        assert_eq!((l.open(), l.addresses()), (0, 0), "no entry outlives its connections");
    }

    #[tokio::test]
    async fn byte_budget_waits_for_room() {
        let b = ByteBudget::new("t", 10 * 1024);
        let r1 = b.reserve(8 * 1024).await;
        let b2 = b.clone();
        let waiting = tokio::spawn(async move { b2.reserve(4 * 1024).await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "over budget: waits");
        drop(r1);
        let r2 = tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await;
        assert!(matches!(r2, Ok(Ok(_))));
        drop(r2);
        // A frame larger than the budget takes the whole budget.
        let big = b.reserve(1 << 30).await;
        assert_eq!(b.available_kib(), 0);
        drop(big);
        assert_eq!(b.available_kib(), 10);
    }

    #[tokio::test]
    async fn a_slow_reader_is_written_to_and_a_stopped_one_times_out() {
        use tokio::io::AsyncReadExt;
        let stall = std::time::Duration::from_millis(300);
        let data = vec![7u8; 256 * 1024];
        // A reader taking 16 KiB every 100 ms: the whole answer takes well
        // over the stall time, but every write moves bytes.
        let (mut w, mut r) = tokio::io::duplex(8 * 1024);
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = vec![0u8; 16 * 1024];
            while got < 256 * 1024 {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            got
        });
        assert_eq!(write_with_progress(&mut w, &[&data], stall).await, Written::All);
        assert_eq!(reader.await.unwrap_or_default(), 256 * 1024);
        // A reader that takes nothing: stalled after the timeout.
        let (mut w, _r) = tokio::io::duplex(8 * 1024);
        let t = std::time::Instant::now();
        assert_eq!(write_with_progress(&mut w, &[&data], stall).await, Written::Stalled);
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn a_run_of_accept_failures_is_logged_once_until_it_ends() {
        let mut errs = AcceptErrors::new("test");
        let e = std::io::Error::from_raw_os_error(libc_emfile());
        assert!(errs.failed(&e), "the first failure of a run is logged");
        for _ in 0..100 {
            assert!(!errs.failed(&e), "the rest of the run within a minute is not");
        }
        errs.accepted();
        assert!(!errs.failed(&e), "a new run within the minute is counted, not logged");
        if let Some(then) = std::time::Instant::now().checked_sub(std::time::Duration::from_secs(61)) {
            errs.logged = Some(then);
            assert!(errs.failed(&e), "a minute on, it is logged again");
        }
    }

    fn libc_emfile() -> i32 {
        24
    }

    #[tokio::test]
    async fn a_large_waiter_does_not_hold_up_smaller_frames() {
        let b = ByteBudget::new("test", 100 * 1024);
        let held = b.reserve(60 * 1024).await;
        let big = tokio::spawn({
            let b = b.clone();
            async move { b.reserve(80 * 1024).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        // A small frame fits in what is left while the large one waits.
        let small = tokio::time::timeout(std::time::Duration::from_millis(500), b.reserve(10 * 1024)).await;
        assert!(small.is_ok(), "the small frame waited behind the large one");
        drop(small);
        drop(held);
        let big = tokio::time::timeout(std::time::Duration::from_secs(2), big).await;
        assert!(
            matches!(big, Ok(Ok(_))),
            "the large waiter got its bytes once they were returned"
        );
        assert_eq!(b.available_kib(), 20);
        drop(big);
        assert_eq!(b.available_kib(), 100);
    }
}

//! Incremental fetch sessions (KIP-227): a client that fetches many
//! partitions sends them once; later requests name only what changed
//! (new fetch offsets, added or forgotten partitions), and responses carry
//! only partitions with records or with a changed high watermark, last
//! stable offset or log start.
//!
//! The cache is bounded (`kafka.max_fetch_sessions`; the least recently
//! used session goes first, and sessions idle for
//! `kafka.fetch_session_idle_ms` expire). A client whose session went gets
//! FETCH_SESSION_ID_NOT_FOUND and starts a new one with a full fetch, as
//! with Kafka.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, TopicName};

/// Kafka's error codes for sessions.
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
pub const INVALID_FETCH_SESSION_EPOCH: i16 = 71;

/// One partition of a session: what the client asked last, and what it
/// was last told (so unchanged partitions can be left out).
#[derive(Debug, Clone)]
struct Part {
    topic: TopicName,
    topic_id: uuid::Uuid,
    request: FetchPartition,
    sent_hw: i64,
    sent_lso: i64,
    sent_start: i64,
}

#[derive(Debug)]
struct Session {
    /// The epoch the next request must carry.
    next_epoch: i32,
    /// (topic key, partition) in the order they were added.
    parts: BTreeMap<(String, i32), Part>,
    order: Vec<(String, i32)>,
    used: Instant,
}

/// What a request is, session-wise.
#[derive(Debug)]
pub enum Mode {
    /// No session (epoch -1, or a version before sessions).
    Sessionless,
    /// A full fetch that opened session `id` (0: the cache had no room).
    New(i32),
    /// An incremental fetch in session `id`: only changed partitions go out.
    Incremental(i32),
}

#[derive(Debug)]
pub struct FetchSessions {
    max: usize,
    /// Most partitions one session may hold.
    max_parts: usize,
    idle: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<i32, Session>,
    next_id: i32,
}

/// The key a topic is cached under: its name, or its id from v13.
fn key(t: &FetchTopic, version: i16) -> String {
    if version >= 13 {
        t.topic_id.to_string()
    } else {
        t.topic.0.to_string()
    }
}

impl FetchSessions {
    pub fn new(max: usize, max_parts: usize, idle: Duration) -> FetchSessions {
        FetchSessions {
            max,
            max_parts: max_parts.max(1),
            idle,
            inner: Mutex::new(Inner {
                sessions: HashMap::new(),
                next_id: 1,
            }),
        }
    }

    /// Resolves the session of `r` and rewrites `r.topics` to every
    /// partition the fetch covers. An error code when the session is
    /// unknown or the epoch wrong.
    pub fn begin(&self, r: &mut FetchRequest, version: i16) -> Result<Mode, i16> {
        if version < 7 {
            return Ok(Mode::Sessionless);
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let idle = self.idle;
        inner.sessions.retain(|_, s| now.duration_since(s.used) < idle);
        match r.session_epoch {
            -1 => {
                if r.session_id != 0 {
                    inner.sessions.remove(&r.session_id);
                }
                Ok(Mode::Sessionless)
            }
            0 => {
                if r.session_id != 0 {
                    inner.sessions.remove(&r.session_id);
                }
                let asked: usize = r.topics.iter().map(|t| t.partitions.len()).sum();
                if self.max == 0 || asked > self.max_parts {
                    // No room, or too large a session: a full fetch without
                    // one (session id 0), as Kafka answers when its cache is full.
                    return Ok(Mode::New(0));
                }
                while inner.sessions.len() >= self.max {
                    let Some(oldest) = inner.sessions.iter().min_by_key(|(_, s)| s.used).map(|(id, _)| *id) else {
                        break;
                    };
                    inner.sessions.remove(&oldest);
                    metrics::counter!("rokka_kafka_fetch_sessions_evicted_total").increment(1);
                }
                let id = loop {
                    let id = inner.next_id;
                    inner.next_id = if id == i32::MAX { 1 } else { id + 1 };
                    if !inner.sessions.contains_key(&id) {
                        break id;
                    }
                };
                let mut s = Session {
                    next_epoch: 1,
                    parts: BTreeMap::new(),
                    order: Vec::new(),
                    used: now,
                };
                upsert(&mut s, r, version);
                inner.sessions.insert(id, s);
                metrics::gauge!("rokka_kafka_fetch_sessions").set(inner.sessions.len() as f64);
                Ok(Mode::New(id))
            }
            epoch => {
                let Some(s) = inner.sessions.get_mut(&r.session_id) else {
                    return Err(FETCH_SESSION_ID_NOT_FOUND);
                };
                if epoch != s.next_epoch {
                    return Err(INVALID_FETCH_SESSION_EPOCH);
                }
                s.next_epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
                s.used = now;
                for f in &r.forgotten_topics_data {
                    let k = if version >= 13 {
                        f.topic_id.to_string()
                    } else {
                        f.topic.0.to_string()
                    };
                    for p in &f.partitions {
                        s.parts.remove(&(k.clone(), *p));
                    }
                }
                s.order.retain(|k| s.parts.contains_key(k));
                upsert(s, r, version);
                if s.parts.len() > self.max_parts {
                    // Grown past its budget: the client starts over, and
                    // its full fetch then goes without a session.
                    let id = r.session_id;
                    inner.sessions.remove(&id);
                    metrics::counter!("rokka_kafka_fetch_sessions_evicted_total").increment(1);
                    return Err(FETCH_SESSION_ID_NOT_FOUND);
                }
                // The fetch covers every partition of the session.
                let mut topics: Vec<FetchTopic> = Vec::new();
                for k in &s.order {
                    let Some(p) = s.parts.get(k) else { continue };
                    match topics.last_mut() {
                        Some(t) if t.topic == p.topic && t.topic_id == p.topic_id => {
                            t.partitions.push(p.request.clone())
                        }
                        _ => topics.push(
                            FetchTopic::default()
                                .with_topic(p.topic.clone())
                                .with_topic_id(p.topic_id)
                                .with_partitions(vec![p.request.clone()]),
                        ),
                    }
                }
                r.topics = topics;
                Ok(Mode::Incremental(r.session_id))
            }
        }
    }

    /// Whether partition (topic, partition) of session `id` goes into this
    /// response (it has records or an error, or its offsets moved since it
    /// was last sent); records what is sent.
    /// `offsets`: (high watermark, last stable offset, log start).
    pub fn must_send(
        &self,
        id: i32,
        topic_key: &str,
        partition: i32,
        offsets: (i64, i64, i64),
        has_data: bool,
    ) -> bool {
        let (hw, lso, start) = offsets;
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(s) = inner.sessions.get_mut(&id) else {
            return true;
        };
        let Some(p) = s.parts.get_mut(&(topic_key.to_string(), partition)) else {
            return true;
        };
        let changed = p.sent_hw != hw || p.sent_lso != lso || p.sent_start != start;
        p.sent_hw = hw;
        p.sent_lso = lso;
        p.sent_start = start;
        has_data || changed
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key `must_send` expects for a topic of a request of `version`.
    pub fn topic_key(name: &TopicName, id: &uuid::Uuid, version: i16) -> String {
        if version >= 13 {
            id.to_string()
        } else {
            name.0.to_string()
        }
    }
}

/// Adds or updates the request's partitions in the session.
fn upsert(s: &mut Session, r: &FetchRequest, version: i16) {
    for t in &r.topics {
        let k = key(t, version);
        for p in &t.partitions {
            let slot = (k.clone(), p.partition);
            match s.parts.get_mut(&slot) {
                Some(existing) => existing.request = p.clone(),
                None => {
                    s.parts.insert(
                        slot.clone(),
                        Part {
                            topic: t.topic.clone(),
                            topic_id: t.topic_id,
                            request: p.clone(),
                            sent_hw: -2,
                            sent_lso: -2,
                            sent_start: -2,
                        },
                    );
                    s.order.push(slot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;

    fn req(id: i32, epoch: i32, parts: &[i32]) -> FetchRequest {
        let topics = if parts.is_empty() {
            Vec::new()
        } else {
            vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(
                    parts
                        .iter()
                        .map(|p| FetchPartition::default().with_partition(*p))
                        .collect(),
                )]
        };
        FetchRequest::default()
            .with_session_id(id)
            .with_session_epoch(epoch)
            .with_topics(topics)
    }

    #[test]
    fn sessions_are_bounded_in_number_and_size() {
        let s = FetchSessions::new(2, 2, Duration::from_secs(60));
        assert!(
            matches!(s.begin(&mut req(0, 0, &[0, 1, 2]), 12), Ok(Mode::New(0))),
            "too many partitions"
        );
        let Ok(Mode::New(a)) = s.begin(&mut req(0, 0, &[0]), 12) else {
            panic!()
        };
        let Ok(Mode::New(b)) = s.begin(&mut req(0, 0, &[0]), 12) else {
            panic!()
        };
        assert_ne!((a, b), (0, 0));
        // A third session evicts the least recently used.
        std::thread::sleep(Duration::from_millis(2));
        assert!(matches!(s.begin(&mut req(b, 1, &[]), 12), Ok(Mode::Incremental(_))));
        let Ok(Mode::New(_c)) = s.begin(&mut req(0, 0, &[1]), 12) else {
            panic!()
        };
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.begin(&mut req(a, 1, &[]), 12).err(),
            Some(FETCH_SESSION_ID_NOT_FOUND),
            "a went"
        );
        // b grows past two partitions: dropped.
        let mut r = req(b, 2, &[1, 2]);
        assert_eq!(s.begin(&mut r, 12).err(), Some(FETCH_SESSION_ID_NOT_FOUND));
        assert_eq!(s.begin(&mut req(b, 3, &[]), 12).err(), Some(FETCH_SESSION_ID_NOT_FOUND));
    }
}

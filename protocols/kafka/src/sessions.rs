//! Incremental fetch sessions (KIP-227): a client that fetches many
//! partitions sends them once; later requests name only what changed
//! (new fetch offsets, added or forgotten partitions), and responses carry
//! only partitions with records or with a changed high watermark, last
//! stable offset or log start.
//!
//! The cache is bounded (`kafka.max_fetch_sessions`; sessions idle for
//! `kafka.fetch_session_idle_ms` expire). A full cache makes room as
//! Kafka's FetchSessionCache does: only a session older than two minutes
//! with fewer partitions than the new one is evicted (the smallest, least
//! recently used first); otherwise the new client fetches without a
//! session (id 0) and the sessions in use stay. A client whose session went
//! gets FETCH_SESSION_ID_NOT_FOUND and starts a new one with a full fetch.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};

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
    /// By topic key, then partition.
    parts: BTreeMap<String, BTreeMap<i32, Part>>,
    /// (topic key, partition) in the order they were added.
    order: Vec<(String, i32)>,
    used: Instant,
    created: Instant,
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
    /// How old a session must be before a new one may evict it (Kafka's
    /// eviction age, two minutes).
    evict_after: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<i32, Session>,
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
            evict_after: Duration::from_secs(120),
            inner: Mutex::new(Inner {
                sessions: HashMap::new(),
            }),
        }
    }

    #[cfg(test)]
    fn with_eviction_age(mut self, d: Duration) -> FetchSessions {
        self.evict_after = d;
        self
    }

    /// Resolves the session of `r` and rewrites `r.topics` to every
    /// partition the fetch covers. An error code when the session is
    /// unknown or the epoch wrong.
    pub fn begin(&self, r: &mut FetchRequest, version: i16) -> Result<Mode, i16> {
        if version < 7 {
            return Ok(Mode::Sessionless);
        }
        // A name no topic can have is not kept (each partition a session
        // holds keeps its topic's name): a full fetch naming one gets no
        // session, an incremental one is refused. The fetch itself answers
        // such a topic as unknown.
        let overlong = r.topics.iter().any(|t| t.topic.len() > rokka_store::MAX_TOPIC_LEN);
        if overlong && r.session_epoch >= 0 {
            metrics::counter!("rokka_kafka_fetch_sessions_refused_total").increment(1);
            if r.session_epoch > 0 {
                return Err(crate::errors::INVALID_REQUEST);
            }
            if r.session_id != 0 {
                self.inner
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .sessions
                    .remove(&r.session_id);
            }
            return Ok(Mode::New(0));
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
                if inner.sessions.len() >= self.max {
                    // Room only at the expense of a smaller session that
                    // has had its time; else this client goes without one.
                    let evict_after = self.evict_after;
                    let victim = inner
                        .sessions
                        .iter()
                        .filter(|(_, s)| now.duration_since(s.created) >= evict_after && s.order.len() < asked)
                        .min_by_key(|(_, s)| (s.order.len(), s.used))
                        .map(|(id, _)| *id);
                    match victim {
                        Some(v) => {
                            inner.sessions.remove(&v);
                            metrics::counter!("rokka_kafka_fetch_sessions_evicted_total").increment(1);
                        }
                        None => {
                            metrics::counter!("rokka_kafka_fetch_sessions_refused_total").increment(1);
                            return Ok(Mode::New(0));
                        }
                    }
                }
                // Random, as Kafka's: a session id is all a fetch needs to
                // use or close a session, so one must not be guessable
                // from one's own (sequential ids let any client close or
                // take over every other client's sessions).
                let id = loop {
                    let id = rand::random::<i32>() & i32::MAX;
                    if id != 0 && !inner.sessions.contains_key(&id) {
                        break id;
                    }
                };
                let mut s = Session {
                    next_epoch: 1,
                    parts: BTreeMap::new(),
                    order: Vec::new(),
                    used: now,
                    created: now,
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
                        if let Some(m) = s.parts.get_mut(&k) {
                            m.remove(p);
                        }
                    }
                }
                s.parts.retain(|_, m| !m.is_empty());
                let parts = &s.parts;
                s.order.retain(|(t, p)| parts.get(t).is_some_and(|m| m.contains_key(p)));
                upsert(s, r, version);
                if s.order.len() > self.max_parts {
                    // Grown past its budget: the client starts over, and
                    // its full fetch then goes without a session.
                    let id = r.session_id;
                    inner.sessions.remove(&id);
                    metrics::counter!("rokka_kafka_fetch_sessions_evicted_total").increment(1);
                    return Err(FETCH_SESSION_ID_NOT_FOUND);
                }
                // The fetch covers every partition of the session.
                let mut topics: Vec<FetchTopic> = Vec::new();
                for (t, pi) in &s.order {
                    let Some(p) = s.parts.get(t).and_then(|m| m.get(pi)) else {
                        continue;
                    };
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

    /// Sets a response's session id and, in an incremental fetch
    /// (`incremental`), leaves out the partitions with nothing new: no
    /// records, no error, and offsets (high watermark, last stable offset,
    /// log start) as last sent. Records what is sent. One lock per
    /// response; `records` runs parallel to the response's partitions.
    pub fn trim(
        &self,
        id: i32,
        incremental: bool,
        version: i16,
        resp: &mut FetchResponse,
        records: &mut Vec<Vec<Bytes>>,
    ) {
        resp.session_id = id;
        if id == 0 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut session = inner.sessions.get_mut(&id);
        let mut all = std::mem::take(records).into_iter();
        let mut kept = Vec::new();
        // Partitions an incremental answer carried records of: they go to
        // the end of the session's order (Kafka's IncrementalFetchContext),
        // so the next fetch fills its byte budget from the others first —
        // else the first partitions with a backlog would starve the rest.
        let mut served: Vec<(String, i32)> = Vec::new();
        for t in &mut resp.responses {
            let key = if version >= 13 {
                t.topic_id.to_string()
            } else {
                t.topic.0.to_string()
            };
            let mut cached = session.as_mut().and_then(|s| s.parts.get_mut(&key));
            for p in std::mem::take(&mut t.partitions) {
                let pieces = all.next().unwrap_or_default();
                let send = match cached.as_mut().and_then(|m| m.get_mut(&p.partition_index)) {
                    Some(c) => {
                        let moved = (c.sent_hw, c.sent_lso, c.sent_start)
                            != (p.high_watermark, p.last_stable_offset, p.log_start_offset);
                        c.sent_hw = p.high_watermark;
                        c.sent_lso = p.last_stable_offset;
                        c.sent_start = p.log_start_offset;
                        // A redirect to a replica (KIP-392) always goes out,
                        // as Kafka's fetch session sends it: dropped, the
                        // client would ask again at once, never redirected.
                        moved || !pieces.is_empty() || p.error_code != 0 || p.preferred_read_replica.0 >= 0
                    }
                    None => true,
                };
                if incremental
                    && !pieces.is_empty()
                    && cached.as_ref().is_some_and(|m| m.contains_key(&p.partition_index))
                {
                    served.push((key.clone(), p.partition_index));
                }
                if send || !incremental {
                    t.partitions.push(p);
                    kept.push(pieces);
                }
            }
        }
        resp.responses.retain(|t| !t.partitions.is_empty());
        *records = kept;
        if let (Some(s), false) = (session, served.is_empty()) {
            let moved: std::collections::HashSet<&(String, i32)> = served.iter().collect();
            s.order.retain(|k| !moved.contains(k));
            s.order.extend(served.iter().cloned());
        }
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Adds or updates the request's partitions in the session.
fn upsert(s: &mut Session, r: &FetchRequest, version: i16) {
    for t in &r.topics {
        let k = key(t, version);
        let topic = s.parts.entry(k.clone()).or_default();
        // One copy of the name for all of the topic's partitions (clones
        // share it).
        let name = TopicName(kafka_protocol::protocol::StrBytes::from_string(t.topic.to_string()));
        for p in &t.partitions {
            // Kept apart from the request's frame (the name and any tagged
            // field would be slices of it, keeping it whole for the
            // session's life).
            let mut request = p.clone();
            request.unknown_tagged_fields.clear();
            match topic.get_mut(&p.partition) {
                Some(existing) => existing.request = request,
                None => {
                    topic.insert(
                        p.partition,
                        Part {
                            topic: name.clone(),
                            topic_id: t.topic_id,
                            request,
                            sent_hw: -2,
                            sent_lso: -2,
                            sent_start: -2,
                        },
                    );
                    s.order.push((k.clone(), p.partition));
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
        // The cache is full of young sessions: a third client fetches
        // without one, and both stay.
        assert!(matches!(s.begin(&mut req(0, 0, &[0, 1]), 12), Ok(Mode::New(0))));
        assert_eq!(s.len(), 2);
        assert!(matches!(s.begin(&mut req(a, 1, &[]), 12), Ok(Mode::Incremental(_))));
        assert!(matches!(s.begin(&mut req(b, 1, &[]), 12), Ok(Mode::Incremental(_))));
        // b grows past two partitions: dropped.
        let mut r = req(b, 2, &[1, 2]);
        assert_eq!(s.begin(&mut r, 12).err(), Some(FETCH_SESSION_ID_NOT_FOUND));
        assert_eq!(s.begin(&mut req(b, 3, &[]), 12).err(), Some(FETCH_SESSION_ID_NOT_FOUND));
    }

    /// A topic name no topic can have (a 1 MiB name, each partition a
    /// session holds keeping it) gets no session; an incremental fetch
    /// naming one is refused.
    #[test]
    fn an_overlong_topic_name_is_not_kept_in_a_session() {
        let s = FetchSessions::new(10, 100_000, Duration::from_secs(60));
        let long = "x".repeat(rokka_store::MAX_TOPIC_LEN + 1);
        let with_long = |id, epoch| {
            let mut r = req(id, epoch, &[0]);
            r.topics.push(
                FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(long.clone())))
                    .with_partitions((0..1000).map(|p| FetchPartition::default().with_partition(p)).collect()),
            );
            r
        };
        assert!(matches!(s.begin(&mut with_long(0, 0), 12), Ok(Mode::New(0))));
        assert_eq!(s.len(), 0);
        let Ok(Mode::New(a)) = s.begin(&mut req(0, 0, &[0]), 12) else {
            panic!()
        };
        assert_eq!(
            s.begin(&mut with_long(a, 1), 12).err(),
            Some(crate::errors::INVALID_REQUEST)
        );
    }

    /// Kafka's eviction: a session that has had its time goes for a larger
    /// new one, the smallest (then least recently used) first; never for a
    /// new one that is not larger.
    #[test]
    fn a_full_cache_evicts_only_older_smaller_sessions() {
        let s = FetchSessions::new(2, 8, Duration::from_secs(60)).with_eviction_age(Duration::from_millis(20));
        let Ok(Mode::New(a)) = s.begin(&mut req(0, 0, &[0]), 12) else {
            panic!()
        };
        let Ok(Mode::New(b)) = s.begin(&mut req(0, 0, &[0, 1, 2]), 12) else {
            panic!()
        };
        std::thread::sleep(Duration::from_millis(30));
        // One partition: not larger than a (1): no session, nothing evicted.
        assert!(matches!(s.begin(&mut req(0, 0, &[5]), 12), Ok(Mode::New(0))));
        // Two partitions: a (the smaller) goes, b stays.
        let Ok(Mode::New(c)) = s.begin(&mut req(0, 0, &[0, 1]), 12) else {
            panic!()
        };
        assert!(c != 0);
        assert_eq!(s.begin(&mut req(a, 1, &[]), 12).err(), Some(FETCH_SESSION_ID_NOT_FOUND));
        assert!(matches!(s.begin(&mut req(b, 1, &[]), 12), Ok(Mode::Incremental(_))));
    }

    /// Partitions an incremental answer carried records of go to the end
    /// of the session's order: the next fetch covers the others first.
    #[test]
    fn partitions_that_were_served_go_to_the_end_of_the_next_fetch() {
        use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
        let s = FetchSessions::new(4, 8, Duration::from_secs(60));
        let Ok(Mode::New(id)) = s.begin(&mut req(0, 0, &[0, 1, 2]), 12) else {
            panic!("no session")
        };
        let order = |r: &FetchRequest| -> Vec<i32> {
            r.topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| p.partition))
                .collect()
        };
        let resp = || {
            FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(
                    (0..3)
                        .map(|p| PartitionData::default().with_partition_index(p).with_high_watermark(9))
                        .collect(),
                )])
        };
        let mut r = req(id, 1, &[]);
        assert!(matches!(s.begin(&mut r, 12), Ok(Mode::Incremental(_))));
        assert_eq!(order(&r), vec![0, 1, 2]);
        // Partition 0 had records (1 and 2 none).
        let mut out = resp();
        let mut recs = vec![vec![Bytes::from_static(b"x")], Vec::new(), Vec::new()];
        s.trim(id, true, 12, &mut out, &mut recs);
        let mut r = req(id, 2, &[]);
        assert!(matches!(s.begin(&mut r, 12), Ok(Mode::Incremental(_))));
        assert_eq!(order(&r), vec![1, 2, 0]);
        // A full answer (the session's first) does not reorder.
        let mut out = resp();
        let mut recs = vec![Vec::new(), vec![Bytes::from_static(b"x")], Vec::new()];
        s.trim(id, false, 12, &mut out, &mut recs);
        let mut r = req(id, 3, &[]);
        assert!(matches!(s.begin(&mut r, 12), Ok(Mode::Incremental(_))));
        assert_eq!(order(&r), vec![1, 2, 0]);
    }

    #[test]
    fn session_ids_are_not_guessable_from_ones_own() {
        let s = FetchSessions::new(64, 8, Duration::from_secs(60));
        let ids: Vec<i32> = (0..64)
            .filter_map(|_| match s.begin(&mut req(0, 0, &[0]), 12) {
                Ok(Mode::New(id)) => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(ids.len(), 64);
        assert!(ids.iter().all(|id| *id > 0));
        // Sequential ids would make every neighbour one apart.
        let neighbours = ids.windows(2).filter(|w| (w[1] - w[0]).abs() == 1).count();
        assert!(neighbours < 2, "{ids:?}");
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), 64);
    }

    #[test]
    fn an_incremental_fetch_keeps_a_redirect_to_a_replica() {
        use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
        use kafka_protocol::messages::BrokerId;
        let s = FetchSessions::new(4, 8, Duration::from_secs(60));
        let Ok(Mode::New(id)) = s.begin(&mut req(0, 0, &[0]), 12) else {
            panic!("no session")
        };
        let resp = |replica: i32| {
            FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![PartitionData::default()
                    .with_partition_index(0)
                    .with_high_watermark(5)
                    .with_last_stable_offset(5)
                    .with_log_start_offset(0)
                    .with_preferred_read_replica(BrokerId(replica))])])
        };
        // First answer in the session: sent, and its offsets recorded.
        let mut r = resp(-1);
        s.trim(id, false, 12, &mut r, &mut vec![Vec::new()]);
        // Nothing new: left out of an incremental answer...
        let mut r = resp(-1);
        s.trim(id, true, 12, &mut r, &mut vec![Vec::new()]);
        assert!(r.responses.iter().all(|t| t.partitions.is_empty()));
        // ...but a redirect always goes out.
        let mut r = resp(2);
        s.trim(id, true, 12, &mut r, &mut vec![Vec::new()]);
        assert_eq!(r.responses[0].partitions.len(), 1);
        assert_eq!(r.responses[0].partitions[0].preferred_read_replica, BrokerId(2));
    }
}
